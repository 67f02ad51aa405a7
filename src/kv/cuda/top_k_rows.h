// The GPU's top-k of many rows of scores (PQCache's selection, pq_select.h steps 3 and 4): the k highest
// of each row, as ascending indices, ties to the lower index (kv/select/top_k.h's rule, the CPU
// selector's). A radix select over the scores' order-preserving 32-bit keys: four passes of an 8-bit
// histogram find the k-th highest key and how many of the keys equal to it are kept (the lowest
// indices); one ordered pass writes the indices above it and those first equal ones. Zeros of both signs
// are one key; NaNs rank by their bits (+NaN above +inf, -NaN below -inf).
//
// Rows of at most kTopKSlice scores: one CTA per row runs every pass. Longer rows (a 128K context's
// middle tokens) are cut into slices of kTopKSlice scores, one CTA each, so that a row is spread over
// many SMs: each pass is a kernel whose CTAs add their slice's histogram into the row's (scratch), and
// the next kernel's CTAs settle the digits so far from those; then every CTA counts its slice's keys
// above and equal to the k-th, and a last kernel writes each slice's indices after those of the slices
// before it. A CTA's work is bounded by its slice, so a row's time grows with n / SMs, not with n, and
// not with k (PQ's first select keeps rerank·k of the middle, its second k of those).
// (Considered: each slice's own top-k, then the top-k of those slices' C·k candidates: exact too, but
// its second stage is one CTA over C·k = n / slice · k scores, which still grows with n: 20K–40K scores
// at 128K tokens and k = 1280.)
#pragma once

#include <cstddef>

#include "slimkv/status.h"

namespace slimkv::cuda {

// Scores one CTA handles: longer rows are sliced.
inline constexpr int kTopKSlice = 8192;

struct TopKRows {
  const float* scores = nullptr;  // device [rows, score_stride]
  long long score_stride = 0;
  const int* n = nullptr;         // device: row r ranks its first n[r / per_length] scores
  const int* k = nullptr;         // device: and keeps the k[r / per_length] highest (at most n of them)
  int per_length = 1;
  int rows = 0;
  int max_n = 0;                  // at least every n: how many slices a row may need
  int* out = nullptr;             // device [rows, out_stride]: the kept indices, ascending
  long long out_stride = 0;
  int* scratch = nullptr;         // device, top_k_scratch_ints(rows, max_n) ints; unused unless max_n > kTopKSlice
};

// The scratch top_k_rows needs for `rows` rows of at most max_n scores: per row, the four passes'
// histograms and each slice's counts of keys above and equal to the k-th.
size_t top_k_scratch_ints(int rows, int max_n);

// The selection for every row (on the default stream). Linear in n.
Status top_k_rows(const TopKRows& launch);

}  // namespace slimkv::cuda
