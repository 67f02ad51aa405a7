// PQCache's token selection on the GPU (issue 25): the same rule as the CPU's `pq` selector
// (kv/select/topk_selector.h, pq_selector.h), per (sequence, KV head), GQA query heads summed into one
// query, for a step of decode rows:
//
//   1. tables    q·centroid per trained segment, sub-space and centroid ([m, 2^b] per segment; FP64
//                accumulation rounded to FP32, as PqCodebook::score_table_reference)
//   2. ADC       the middle tokens' scores Σ_s table[seg][s][code_s] (FP32, s ascending, as
//                PqCodebook::score_codes); a segment not clustered yet scores with the latest codebook
//   3. top-k     of the ADC scores: the `candidates` best, ties to the lower token (top_k_rows.h)
//   4. re-rank   exact (Σ_h q_h)·k of the candidates from their stored FP16 keys (FP64, rounded to FP32),
//                the keys kept in scratch, and the k best of those (top_k_rows again)
//   5. gather    init tokens, the kept tokens, the local window and open tokens, ascending, each KV head
//                its own, into a compact paged buffer that the paged attention kernel reads as one
//                sequence per row (the order is the token order, so a selection of every token is the
//                sequence itself: pq:topk=1.0 equals dense)
//
// The source of K/V (the paged view of `source`) may live in pinned host memory mapped into the GPU
// (@offload): then only the candidates' keys and the selected tokens' K/V cross PCIe, those of tokens
// not in the GPU cache of selected tokens (pq_token_cache.h), when there is one. With @offload the
// tokens of full blocks are read from token-major copies (PqSealedCopies below) where the launch has
// them: the same values, bit for bit.
//
// With a quantizing codec (`pq:...+hack`, `+quant`: `sealed`), the tokens of a row's full blocks are read
// from their sealed blocks (tensor/quantized_block.h's bytes: only the token's codes, its K partitions'
// min and scale, and its block's per-column V ones) and dequantized as dequantize_tokens does (FP32
// min + scale · code): the re-rank scores the candidates' keys so (the CPU store's SealedKeys), and the
// gather writes the dequantized K/V, rounded to FP16, into the compact buffer. The open block's tokens
// come from `source` (the FP16 window). The re-rank then reads no key from the GPU cache of selected
// tokens (FP16-rounded there): its scores stay the CPU's.
#pragma once

#include <cstdint>

#include "attention/cuda/kv_views.h"
#include "kv/cuda/top_k_rows.h"
#include "slimkv/status.h"

namespace slimkv::cuda {

// One decode row of a step: which tokens of which sequence it ranks and keeps.
struct PqSelectRow {
  int sequence = 0;           // the cache's id: the row of its block table, codes and centroids
  int num_tokens = 0;         // held, this step's token included
  int init_end = 0;           // [0, init_end) always
  int middle_end = 0;         // [init_end, middle_end) ranked; [middle_end, num_tokens) always
  int k = 0;                  // ranked tokens kept
  int candidates = 0;         // ranked by ADC; > k: re-ranked exactly by their keys
  int trained_segments = 0;   // segments [0, n) have codebooks; later ones borrow the last
  int selected = 0;           // tokens attended: init_end + k + num_tokens - middle_end, or num_tokens
  int all = 0;                // 1: every token (k covers the middle, or no codebook yet)
};

// The PQ index of one layer: codebooks and codes of every sequence and KV head.
struct PqIndexView {
  const uint16_t* centroids = nullptr;  // FP16 [sequences, kv_heads, max_segments, m, sub_dim, 2^b]
  const uint8_t* codes = nullptr;       // [sequences, kv_heads, max_tokens, m]
  int m = 2, bits = 6, head_dim = 128, segment_tokens = 256, max_segments = 0, max_tokens = 0;
};

// Scratch for a step of up to max_rows rows (pq_select.cu's sizes: max_middle scores, max_candidates).
struct PqSelectScratch {
  float* tables = nullptr;      // [rows, kv_heads, max_segments, m · 2^b]
  float* scores = nullptr;      // [rows, kv_heads, max_middle]
  int* ranked = nullptr;        // [rows, kv_heads, max_candidates]: ADC top candidates, relative to init_end
  float* exact = nullptr;       // [rows, kv_heads, max_candidates]
  uint16_t* keys = nullptr;     // [rows, kv_heads, max_candidates, head_dim]: the candidates' keys
  int* kept = nullptr;          // [rows, kv_heads, max_candidates]: indices into ranked
  int* lengths = nullptr;       // [4, rows]: the middle's length, candidates, those re-ranked (0: none), k
  int* top_k = nullptr;         // top_k_scratch_ints(rows · kv_heads, max_middle)
  int max_middle = 0, max_candidates = 0;
};

// PQCache's GPU cache of selected tokens (pq_token_cache.h) as the selection reads it: a token found
// there is read from its slot instead of from `source`; the gather lists each row's tokens for the
// cache's update. token_slots null: no cache.
struct PqTokenCacheView {
  int* token_slots = nullptr;            // the token → slot map, [sequences, layers, kv_heads, max_tokens], -1: none
  int* slot_tokens = nullptr;            // [sequences, layers, kv_heads, slots], -1: empty
  unsigned* slot_uses = nullptr;         // LFU's count
  unsigned long long* slot_stamps = nullptr;  // the last use: step << 33 | miss << 32 | index in the step's uses
  uint16_t* k = nullptr;                 // FP16 [sequences, layers, kv_heads, slots, head_dim]
  uint16_t* v = nullptr;
  unsigned long long* counters = nullptr;  // device [3]: used, hit, filled tokens
  int num_layers = 0, layer = 0, num_kv_heads = 0, head_dim = 0, max_tokens = 0, slots = 0;
  int lfu = 0;
  unsigned long long step = 0;           // this step's stamp, >= 1
  // Each selection row's tokens, ascending, as the gather writes them: [rows, kv_heads, tokens_stride].
  int* step_tokens = nullptr;
  int tokens_stride = 0;
};

// `pq:...+hack@offload`: the sealed blocks' keys and values copied token-major into pinned host memory.
// A sealed block keeps K dim-group-major (HACK's tokens in lanes, for integer dot products over whole
// blocks), so one token's codes lie in head_dim / 4 pieces 64 · b / 2 bytes apart, and a read of one key over PCIe
// moves a whole 32-byte sector per piece: 1 KB for a 2-bit key of 128 dims, of which 32 bytes are used
// (a 128K context's re-rank at top-k 1024 reads ~10 MB of sectors per layer so, against the 2.6 MB of
// FP16 keys). Token t's row holds the block's bytes of its key: the groups of codes in dim order, then
// its K partitions' FP16 mins, then their scales, padded to 8 bytes: a row of 40 bytes (2 bits, 128
// dims) starts 0, 8, 16 or 24 bytes into a sector and ends in the next, so a key costs two sectors
// (padding to 64 would too, with 60% more host memory; the rows add 40 bytes a token and KV head to the
// sealed blocks' ~85 at 2 bits). HACK's K layout only (a min and scale per partition of the token's
// dims; with K per channel each dim has its own, a row as large as the FP16 key).
//
// Values alike (any V layout): a sealed block keeps V's codes in groups of 4 tokens, every column's
// group in turn, so one token's value lies in head_dim · b / 2 bytes (4 sectors at 2 bits and 128 dims)
// of which a quarter is its own, and with V per token its mins and scales in two more sectors. Token t's
// value row holds its codes regrouped as a key's (group c: columns 4c..4c+3, its code of column 4c + j
// in field j), then with V per token its column groups' FP16 mins, then their scales, padded to 8
// bytes: 32 bytes (one sector) at 2 bits and 128 dims, 40 with V per token (two). HACK's per-column V
// mins and scales are per block: PqValueScales below.
//
// Over FP16 pages (`pq:...@offload` without a codec) a row holds the token's FP16 key or value as the
// page does (pq_fp16_row_copies below).
struct PqTokenRows {
  uint8_t* rows = nullptr;  // one layer's [sequences, kv_heads, max_tokens, row_bytes]; null: none
  int row_bytes = 0, max_tokens = 0;
};

// The bytes of a key row (pq_key_row_bytes(128, 2) == 40) and of a value row (pq_value_row_bytes(128,
// 2, 0) == 32; v_groups: V per token's column groups, 0 for V per column).
int pq_key_row_bytes(int head_dim, int k_bits);
int pq_value_row_bytes(int head_dim, int v_bits, int v_groups);

// `pq:...+hack@offload` with HACK's V layout (a min and scale per column of a block): each sealed
// block's per-column V mins and scales copied into GPU memory as it seals. A selected token's value
// needs all head_dim of them, 4 · head_dim bytes (512 at 128 dims) for a few dozen bytes of codes: at
// 128K tokens and top-k 1024 nearly every kept token has a block of its own, so they were most of the
// bytes the step read from host memory (141 of 165 MB a step at 2 bits; 24 MB with V per token).
// GPU memory: 4 · head_dim bytes a block, KV head and layer (8 bytes a token at 128 dims).
struct PqValueScales {
  uint16_t* scales = nullptr;  // one layer's FP16 [sequences, kv_heads, max_blocks, 2, head_dim]: mins, scales
  int max_blocks = 0;          // null scales: none
};

// @offload's copies of the sealed bytes a selection reads, each none by default (the selection then
// reads the blocks, or the pages).
struct PqSealedCopies {
  PqTokenRows key_rows;        // HACK's K layout; FP16 pages: the FP16 keys
  PqTokenRows value_rows;      // any V layout (HACK's needs value_scales beside); FP16 pages: the FP16 values
  PqValueScales value_scales;  // HACK's V layout
};

// `pq:...@offload` over FP16 pages: each full block's keys and values copied token-major into pinned
// host memory, a token's key and value side by side in one row of 4 · head_dim bytes (key_rows at
// `rows`, value_rows 2 · head_dim bytes into each row, both of that row size). A page keeps a KV
// head's 64 keys of a block together, its next block's num_kv_heads · 16 KB further on (128 KB for
// Llama-3-8B), and the values in a pool of their own, so a head's tokens lie page-strided over the
// layer's pool and a token's value in another allocation than its key; here a head's tokens lie back to
// back and a re-ranked token's value is the 256 bytes after the key the re-rank has just read (the same
// 4 KB host page: one address translation, not two), and the gather of a token whose key is not in
// scratch reads 512 contiguous bytes. The price: FP16 pq@offload's host memory doubles (the pages stay:
// prompt chunks attend over them, the open block lives there, and sequences leave from them;
// docs/pq.md). Kept only with `rows=on`: on an H100 they read no faster than the pages (docs/pq.md).
PqSealedCopies pq_fp16_row_copies(uint8_t* rows, int head_dim, int max_tokens);
int pq_fp16_row_bytes(int head_dim);  // 4 · head_dim

struct PqSelectLaunch {
  const PqSelectRow* rows = nullptr;  // device [num_rows]
  int num_rows = 0;
  int max_trained_segments = 0, max_middle = 0, max_candidates = 0, max_selected = 0;  // over the rows
  const uint16_t* q = nullptr;  // FP16 [num_rows, num_heads, head_dim]: row r's decode query
  int num_heads = 0, num_kv_heads = 0;
  PqIndexView index;
  PagedKvView source;           // the layer's K/V (device or mapped host memory), by PqSelectRow::sequence
  // The layer's sealed blocks (device or mapped host memory; its tables have source's stride): tokens
  // before a row's open block are read there. blocks null: every token from source.
  QuantizedKvView sealed;
  PqSealedCopies copies;        // with sealed: what of it is read from copies instead
  PqSelectScratch scratch;
  PqTokenCacheView cache;       // none by default
  // Out: row r's selection at blocks [r · out_blocks_per_row, ...) of out, [blocks, kv_heads, 64, head_dim].
  uint16_t* out_k = nullptr;
  uint16_t* out_v = nullptr;
  int out_blocks_per_row = 0;
};

// Steps 1–5 for one layer (on the default stream).
Status pq_select_and_gather(const PqSelectLaunch& launch);

// Tokens [first, first + n) of one sequence's sealed blocks (one layer's), or of its full FP16 pages
// (sealed.blocks null).
struct SealedTokenRange {
  QuantizedKvView sealed;  // one layer's
  int block_table_stride = 0, num_kv_heads = 0, head_dim = 0;
  int sequence = 0, first = 0, n = 0;
  PagedKvView pages;       // one layer's FP16 pages: the source where sealed.blocks is null
};

// Their keys dequantized as the re-rank reads them and rounded to FP16, into keys (device FP16 [n,
// num_kv_heads, head_dim]): the index of a sequence imported as sealed blocks is built from them (the
// CPU store decodes restored blocks for its selector alike).
Status pq_sealed_keys(const SealedTokenRange& tokens, uint16_t* keys);  // on the default stream

// Their bytes copied into `copies` (those not none): the keys' and values' rows, the blocks' V scales
// (FP16 pages: the keys' and values' rows of pq_fp16_row_copies); as their blocks seal, or are imported
// (first and n: whole blocks). On the default stream.
Status pq_copy_sealed(const SealedTokenRange& tokens, const PqSealedCopies& copies);

}  // namespace slimkv::cuda
