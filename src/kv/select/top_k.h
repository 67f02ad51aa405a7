// The k highest of n scores, as their ascending indices: how TopkSelector keeps its ranked middle tokens
// (PQCache §3.1: the top-k by PQ score, then by exact score after the re-rank). Ties go to the lower
// index, so a selection is the same on every run. Ascending indices are what the store and attention
// read (block by block), so no sort follows.
#pragma once

namespace slimkv {

// out [k]: the indices i of the k largest scores[i], ties to the lower i, ascending. 0 <= k <= n;
// scores finite. Linear: a histogram of the scores over their range finds the bin the k-th falls in,
// only that bin's scores are ranked exactly, and one last pass writes the chosen indices in order.
void top_k_indices(const float* scores, int n, int k, int* out);

// The plain reference (a sort of every index by score, then by index): what top_k_indices is held to.
void top_k_indices_reference(const float* scores, int n, int k, int* out);

}  // namespace slimkv
