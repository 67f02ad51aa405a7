#include "kv/cuda/host_kv_tier.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <unistd.h>

#include "backend/cuda/cuda_check.h"
#include "kv/cuda/kv_slots.h"

namespace slimkv::cuda {
namespace {

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t as_event(void* e) { return static_cast<cudaEvent_t>(e); }

int blocks_for_tokens(int tokens) { return (tokens + kCudaBlockTokens - 1) / kCudaBlockTokens; }

// Cuts sizes (consecutive) into `groups` ranges of about equal sums; returns each range's end.
std::vector<int> balanced_ends(const std::vector<int>& sizes, int groups) {
  const double total = std::accumulate(sizes.begin(), sizes.end(), 0.0);
  std::vector<int> ends;
  double sum = 0;
  for (int i = 0; i < int(sizes.size()); ++i) {
    sum += sizes[size_t(i)];
    const int left = int(sizes.size()) - i - 1, groups_left = groups - int(ends.size()) - 1;
    if (groups_left > 0 && (sum >= total * double(ends.size() + 1) / groups || left == groups_left)) ends.push_back(i + 1);
  }
  ends.push_back(int(sizes.size()));
  return ends;
}

// Packs sizes (consecutive) into ranges whose sums stay within capacity; returns each range's end.
std::vector<int> packed_ends(const std::vector<int>& sizes, int capacity) {
  std::vector<int> ends;
  int sum = 0;
  for (int i = 0; i < int(sizes.size()); ++i) {
    if (sum + sizes[size_t(i)] > capacity && sum > 0) {
      ends.push_back(i);
      sum = 0;
    }
    sum += sizes[size_t(i)];
  }
  ends.push_back(int(sizes.size()));
  return ends;
}

}  // namespace

void CudaHostKvTier::add_runs(const std::vector<int>& blocks, int first, int last, int staging_block,
                              std::vector<CopyRun>& runs) {
  for (int j = first; j < last; ++j) {
    const int from = blocks[size_t(j)], to = staging_block + j - first;
    if (!runs.empty() && runs.back().host_block + runs.back().count == from &&
        runs.back().staging_block + runs.back().count == to) {
      ++runs.back().count;
    } else {
      runs.push_back(CopyRun{from, to, 1});
    }
  }
}

CudaHostKvTier::CudaHostKvTier(const HostKvTierShape& shape, const std::optional<QuantizedBlockSealer>& sealer)
    : shape_(shape), sequences_(shape.host_blocks, shape.max_sequences, shape.max_blocks_per_sequence), sealer_(sealer) {}

CudaHostKvTier::~CudaHostKvTier() {
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(as_stream(copy_stream_));
    cudaStreamDestroy(as_stream(copy_stream_));
  }
  for (void* event : {x_ready_[0], x_ready_[1], kv_ready_[0], kv_ready_[1], free_[0], free_[1]}) {
    if (event != nullptr) cudaEventDestroy(as_event(event));
  }
  cudaFreeHost(host_kv_);
  cudaFreeHost(host_x_);
  cudaFreeHost(host_sealed_);
}

size_t CudaHostKvTier::kv_block_bytes() const {
  return 2 * size_t(shape_.num_kv_heads) * kCudaBlockTokens * size_t(shape_.head_dim) * 2;
}

size_t CudaHostKvTier::sealed_block_bytes() const {
  return sealer_ ? size_t(shape_.num_kv_heads) * sealer_->layout().block_bytes : 0;
}

double CudaHostKvTier::kv_bytes_per_token() const {
  return double(sealer_ ? sealed_block_bytes() : kv_block_bytes()) / kCudaBlockTokens;
}

size_t CudaHostKvTier::x_block_bytes() const {
  return size_t(kCudaBlockTokens) * size_t(shape_.hidden) * dtype_size_bytes(shape_.x_dtype);
}

size_t CudaHostKvTier::host_bytes() const {
  return size_t(shape_.num_layers) * size_t(shape_.host_blocks) *
         (kv_block_bytes() + sealed_block_bytes() + (shape_.keep_x ? x_block_bytes() : 0));
}

size_t CudaHostKvTier::staging_bytes() const {
  return 2 * size_t(shape_.staging_blocks) * (kv_block_bytes() + sealed_block_bytes());
}

size_t CudaHostKvTier::staging_x_bytes() const {
  return shape_.keep_x ? 2 * size_t(shape_.staging_blocks) * x_block_bytes() : 0;
}

Expected<std::unique_ptr<CudaHostKvTier>> CudaHostKvTier::create(const HostKvTierShape& shape,
                                                                  const std::optional<QuantizedBlockSealer>& sealer) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim % 8 != 0 || shape.hidden % 8 != 0 ||
      shape.max_sequences <= 0 || shape.max_blocks_per_sequence <= 0 || shape.max_step_tokens <= 0 ||
      shape.host_blocks <= 0 || shape.staging_blocks <= 0 || shape.micro_batches < 0) {
    return error("CUDA KV tier: sizes must be positive (layers ", shape.num_layers, ", kv heads ", shape.num_kv_heads,
                 ", head_dim ", shape.head_dim, " and hidden ", shape.hidden, " multiples of 8, sequences ",
                 shape.max_sequences, ", host blocks ", shape.host_blocks, ", staging blocks ", shape.staging_blocks,
                 ", micro-batches ", shape.micro_batches, ")");
  }
  std::unique_ptr<CudaHostKvTier> tier(new CudaHostKvTier(shape, sealer));
  // Pinning more than the machine has can only fail, and the driver may take minutes to say so.
  const double physical_bytes = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (double(tier->host_bytes()) > physical_bytes) {
    return error("the host KV pool needs ", tier->host_bytes(), " bytes of pinned memory, more than this machine's ",
                 size_t(physical_bytes), " bytes of RAM (lower the host pool, the context or the sequences)");
  }
  const auto pin = [](size_t bytes, const char* what, void*& pointer) -> Status {
    const cudaError_t status = cudaHostAlloc(&pointer, bytes, cudaHostAllocMapped);
    if (status != cudaSuccess) {
      pointer = nullptr;
      return error("pinning ", bytes, " bytes of host memory for ", what, ": ", cudaGetErrorString(status),
                   " (ask for a smaller host pool)");
    }
    return Status::ok();
  };
  const size_t layer_blocks = size_t(shape.num_layers) * size_t(shape.host_blocks);
  SLIMKV_RETURN_IF_ERROR(pin(layer_blocks * tier->kv_block_bytes(), "the KV tier", tier->host_kv_));
  if (shape.keep_x) SLIMKV_RETURN_IF_ERROR(pin(layer_blocks * tier->x_block_bytes(), "the kept X", tier->host_x_));
  if (sealer) SLIMKV_RETURN_IF_ERROR(pin(layer_blocks * tier->sealed_block_bytes(), "the sealed blocks", tier->host_sealed_));
  for (int b = 0; b < 2; ++b) {
    SLIMKV_ASSIGN_OR_RETURN(tier->staging_kv_[b], DeviceArray<uint8_t>::allocate(size_t(shape.staging_blocks) *
                                                                                      tier->kv_block_bytes(),
                                                                                  "a KV staging buffer"));
    if (sealer) {
      SLIMKV_ASSIGN_OR_RETURN(tier->staging_sealed_[b],
                              DeviceArray<uint8_t>::allocate(size_t(shape.staging_blocks) * tier->sealed_block_bytes(),
                                                             "a sealed-block staging buffer"));
    }
    if (shape.keep_x) {
      SLIMKV_ASSIGN_OR_RETURN(tier->staging_x_[b], DeviceArray<uint8_t>::allocate(size_t(shape.staging_blocks) *
                                                                                       tier->x_block_bytes(),
                                                                                   "an X staging buffer"));
    }
  }
  cudaStream_t stream = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  tier->copy_stream_ = stream;
  for (void** event : {&tier->x_ready_[0], &tier->x_ready_[1], &tier->kv_ready_[0], &tier->kv_ready_[1],
                       &tier->free_[0], &tier->free_[1]}) {
    cudaEvent_t e = nullptr;
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    *event = e;
  }
  const size_t table_entries = size_t(shape.max_sequences) * shape.max_blocks_per_sequence;
  SLIMKV_ASSIGN_OR_RETURN(tier->tables_, DeviceArray<int>::allocate(table_entries, "the staging block tables"));
  SLIMKV_ASSIGN_OR_RETURN(tier->step_slots_, DeviceArray<int>::allocate(3 * size_t(shape.max_step_tokens), "the step's slots"));
  return Expected<std::unique_ptr<CudaHostKvTier>>(std::move(tier));
}

Expected<std::vector<MicroBatch>> CudaHostKvTier::plan_micro_batches(const std::vector<int>& sequences,
                                                                    const std::vector<int>& new_tokens) const {
  if (sequences.size() != new_tokens.size() || sequences.empty()) {
    return error("CUDA KV tier step: ", sequences.size(), " sequences and ", new_tokens.size(), " token counts");
  }
  std::vector<int> staged(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (!sequences_.is_live(sequences[i])) return error("CUDA KV tier step: sequence ", sequences[i], " does not exist");
    staged[i] = blocks_for_tokens(sequences_.num_tokens(sequences[i]) + new_tokens[i]);
    if (staged[i] > shape_.staging_blocks) {
      return error("sequence ", sequences[i], " would hold ", staged[i], " blocks of ", kCudaBlockTokens,
                   " tokens, over the ", shape_.staging_blocks, " of a GPU staging buffer (raise the GPU KV budget)");
    }
  }
  const int total = std::accumulate(staged.begin(), staged.end(), 0), n = int(staged.size());
  std::vector<int> ends;
  if (shape_.micro_batches == 1) {
    if (total > shape_.staging_blocks) {
      return error("the step's sequences hold ", total, " blocks of ", kCudaBlockTokens, " tokens per layer, over the ",
                   shape_.staging_blocks, " of a GPU staging buffer (the row-by-row schedule stages the whole batch: ",
                   "use schedule=column or raise the GPU KV budget)");
    }
    ends = {n};
  } else {
    const std::vector<int> packed = packed_ends(staged, shape_.staging_blocks);
    const int wanted = shape_.micro_batches == 0 ? std::max(int(packed.size()), std::min(2, n))
                                                 : std::max(int(packed.size()), std::min(shape_.micro_batches, n));
    ends = balanced_ends(staged, wanted);
    for (size_t g = 0, begin = 0; g < ends.size(); begin = size_t(ends[g]), ++g) {
      if (std::accumulate(staged.begin() + long(begin), staged.begin() + ends[g], 0) > shape_.staging_blocks) ends = packed;
    }
  }
  std::vector<MicroBatch> batches;
  int begin = 0, query = 0;
  for (int end : ends) {
    MicroBatch m;
    m.first_sequence = begin;
    m.num_sequences = end - begin;
    m.first_query = query;
    for (int i = begin; i < end; ++i) {
      m.num_queries += new_tokens[size_t(i)];
      m.staged_blocks += staged[size_t(i)];
    }
    query += m.num_queries;
    batches.push_back(m);
    begin = end;
  }
  return batches;
}

Status CudaHostKvTier::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens,
                                  double recompute_fraction, bool stage) {
  SLIMKV_ASSIGN_OR_RETURN(std::vector<MicroBatch> batches, plan_micro_batches(sequences, new_tokens));
  const int step_tokens = std::accumulate(new_tokens.begin(), new_tokens.end(), 0);
  if (step_tokens > shape_.max_step_tokens) {
    return error("CUDA KV tier step: ", step_tokens, " new tokens, over max_step_tokens ", shape_.max_step_tokens);
  }
  int blocks_needed = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    blocks_needed += sequences_.blocks_to_grow(sequences[i], sequences_.num_tokens(sequences[i]) + new_tokens[i]);
  }
  if (blocks_needed > sequences_.free_blocks()) {
    return error("the host KV pool is full: the step needs ", blocks_needed, " more blocks of ", kCudaBlockTokens,
                 " tokens, ", sequences_.free_blocks(), " are free (of ", shape_.host_blocks, ")");
  }
  std::vector<int> held(sequences.size());
  for (size_t i = 0; i < sequences.size(); ++i) {
    held[i] = sequences_.num_tokens(sequences[i]);
    SLIMKV_RETURN_IF_ERROR(sequences_.grow(sequences[i], held[i] + new_tokens[i]).with_context("CUDA KV tier step"));
  }

  const int stride = shape_.max_blocks_per_sequence, T = shape_.max_step_tokens;
  std::vector<int> tables(size_t(int(sequences.size()) * stride), 0), slots(3 * size_t(T), -1);
  std::vector<int> positions, recompute_slots, seals;
  const bool move_sealed = sealer_.has_value();
  plans_.assign(batches.size(), UnitPlan{});
  int query = 0;
  for (size_t m = 0; m < batches.size(); ++m) {
    MicroBatch& batch = batches[m];
    UnitPlan& plan = plans_[m];
    batch.first_recompute_row = int(positions.size());
    // Seal lists (FP16 staging block, destination block, ordinal): recomputed full blocks (into
    // staging), blocks the step fills (into staging, and into the host pool).
    std::vector<int> recompute_seals, staging_seals, host_seals;
    int staging_block = 0;
    for (int i = batch.first_sequence; i < batch.first_sequence + batch.num_sequences; ++i) {
      const std::vector<int>& blocks = sequences_.blocks(sequences[size_t(i)]);
      const int held_tokens = held[size_t(i)], held_blocks = blocks_for_tokens(held_tokens);
      const int full_blocks = held_tokens / kCudaBlockTokens;
      // Blocks [0, recomputed) come from X: the fraction of the held tokens, rounded to blocks (1: all).
      const int recomputed = !shape_.keep_x || recompute_fraction <= 0 ? 0
                             : recompute_fraction >= 1
                                 ? held_blocks
                                 : std::min(held_blocks, int(std::lround(recompute_fraction * held_tokens / kCudaBlockTokens)));
      for (size_t j = 0; j < blocks.size(); ++j) tables[size_t(i) * stride + j] = 2 * (staging_block + int(j));
      add_runs(blocks, 0, recomputed, batch.recompute_rows / kCudaBlockTokens, plan.x);
      if (move_sealed) {  // full blocks sealed, from the open one on FP16
        const int open_first = std::max(recomputed, full_blocks);
        add_runs(blocks, recomputed, full_blocks, staging_block + recomputed, plan.sealed);
        add_runs(blocks, open_first, held_blocks, staging_block + open_first, plan.kv);
        for (int j = 0; j < std::min(recomputed, full_blocks); ++j) {
          recompute_seals.insert(recompute_seals.end(), {2 * (staging_block + j), staging_block + j, j});
        }
      } else {
        add_runs(blocks, recomputed, held_blocks, staging_block + recomputed, plan.kv);
      }
      if (sealer_) {
        for (int j = full_blocks; j < (held_tokens + new_tokens[size_t(i)]) / kCudaBlockTokens; ++j) {
          staging_seals.insert(staging_seals.end(), {2 * (staging_block + j), staging_block + j, j});
          host_seals.insert(host_seals.end(), {2 * (staging_block + j), blocks[size_t(j)], j});
        }
      }
      for (int r = 0; r < recomputed * kCudaBlockTokens; ++r) {
        positions.push_back(r);
        recompute_slots.push_back(r < held_tokens ? 2 * (staging_block + r / kCudaBlockTokens) * kCudaBlockTokens +
                                                        r % kCudaBlockTokens
                                                  : -1);
      }
      batch.recompute_rows += recomputed * kCudaBlockTokens;
      for (int p = held_tokens; p < held_tokens + new_tokens[size_t(i)]; ++p, ++query) {
        const int block = p / kCudaBlockTokens, offset = p % kCudaBlockTokens;
        slots[size_t(query)] = 2 * (staging_block + block) * kCudaBlockTokens + offset;
        slots[size_t(T + query)] = 2 * blocks[size_t(block)] * kCudaBlockTokens + offset;
        slots[size_t(2 * T + query)] = blocks[size_t(block)] * kCudaBlockTokens + offset;
      }
      staging_block += int(blocks.size());
    }
    plan.recompute_seals = int(recompute_seals.size() / 3);
    plan.filled_seals = int(staging_seals.size() / 3);
    plan.first_recompute_seal = int(seals.size() / 3);
    seals.insert(seals.end(), recompute_seals.begin(), recompute_seals.end());
    plan.first_staging_seal = int(seals.size() / 3);
    seals.insert(seals.end(), staging_seals.begin(), staging_seals.end());
    plan.first_host_seal = int(seals.size() / 3);
    seals.insert(seals.end(), host_seals.begin(), host_seals.end());
  }
  if (seals.size() > seal_lists_.size()) {
    SLIMKV_ASSIGN_OR_RETURN(seal_lists_, DeviceArray<int>::allocate(seals.size(), "the blocks to seal"));
  }
  if (!seals.empty()) SLIMKV_RETURN_IF_ERROR(seal_lists_.upload(seals.data(), seals.size()));
  micro_batches_ = std::move(batches);
  step_tokens_ = step_tokens;
  SLIMKV_RETURN_IF_ERROR(tables_.upload(tables.data(), tables.size()));
  SLIMKV_RETURN_IF_ERROR(step_slots_.upload(slots.data(), slots.size()));
  if (!positions.empty()) {
    if (int(positions.size()) > recompute_capacity_) {
      recompute_capacity_ = int(positions.size());
      SLIMKV_ASSIGN_OR_RETURN(recompute_, DeviceArray<int>::allocate(2 * size_t(recompute_capacity_), "recomputed rows"));
    }
    SLIMKV_RETURN_IF_ERROR(recompute_.upload(positions.data(), positions.size()));
    SLIMKV_RETURN_IF_ERROR(
        copy_to_device(recompute_.data() + recompute_capacity_, recompute_slots.data(), recompute_slots.size() * sizeof(int)));
  }
  return stage ? prefetch(0) : Status::ok();
}

Status CudaHostKvTier::prefetch(int unit) {
  const int m = unit % int(micro_batches_.size()), layer = unit / int(micro_batches_.size()), b = buffer(unit);
  cudaStream_t stream = as_stream(copy_stream_);
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, as_event(free_[b]), 0));
  const size_t layer_blocks = size_t(layer) * size_t(shape_.host_blocks);
  const auto copy = [&](const std::vector<CopyRun>& runs, const void* host, uint8_t* staging, size_t block_bytes) -> Status {
    for (const CopyRun& run : runs) {
      const auto* from = static_cast<const uint8_t*>(host) + (layer_blocks + size_t(run.host_block)) * block_bytes;
      SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(staging + size_t(run.staging_block) * block_bytes, from,
                                                  size_t(run.count) * block_bytes, cudaMemcpyHostToDevice, stream));
    }
    return Status::ok();
  };
  const UnitPlan& plan = plans_[size_t(m)];
  SLIMKV_RETURN_IF_ERROR(copy(plan.x, host_x_, staging_x_[b].data(), x_block_bytes()));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(as_event(x_ready_[b]), stream));
  SLIMKV_RETURN_IF_ERROR(copy(plan.kv, host_kv_, staging_kv_[b].data(), kv_block_bytes()));
  SLIMKV_RETURN_IF_ERROR(copy(plan.sealed, host_sealed_, staging_sealed_[b].data(), sealed_block_bytes()));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(as_event(kv_ready_[b]), stream));
  return Status::ok();
}

Expected<RecomputeRows> CudaHostKvTier::recompute_rows(int unit) {
  const MicroBatch& batch = micro_batches_[size_t(unit % int(micro_batches_.size()))];
  if (batch.recompute_rows == 0) return RecomputeRows{};
  const int b = buffer(unit);
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cudaStreamLegacy, as_event(x_ready_[b]), 0));
  return RecomputeRows{staging_x_[b].data(), batch.recompute_rows, recompute_.data() + batch.first_recompute_row,
                       recompute_.data() + recompute_capacity_ + batch.first_recompute_row};
}

Status CudaHostKvTier::write_recomputed(int unit, const uint16_t* k, const uint16_t* v, const int* slots, int n) {
  const PagedKvView staging = view(unit);
  return write_kv_slots(k, v, slots, n, shape_.num_kv_heads, shape_.head_dim, const_cast<uint16_t*>(staging.k),
                        const_cast<uint16_t*>(staging.v));
}

Status CudaHostKvTier::seal_recomputed(int unit) {
  const UnitPlan& plan = plans_[size_t(unit % int(micro_batches_.size()))];
  if (plan.recompute_seals == 0) return Status::ok();
  return sealer_->seal(unit / int(micro_batches_.size()), view(unit), seal_lists_.data() + 3 * plan.first_recompute_seal,
                       plan.recompute_seals, staging_sealed_[buffer(unit)].data());
}

Status CudaHostKvTier::store_x(int layer, const void* x) {
  if (!shape_.keep_x) return Status::ok();
  auto* layer_x = static_cast<uint8_t*>(host_x_) + size_t(layer) * shape_.host_blocks * x_block_bytes();
  return write_row_slots(x, step_slots_.data() + 2 * shape_.max_step_tokens, step_tokens_,
                         size_t(shape_.hidden) * dtype_size_bytes(shape_.x_dtype), layer_x);
}

Status CudaHostKvTier::append(int unit, const uint16_t* k, const uint16_t* v) {
  const MicroBatch& batch = micro_batches_[size_t(unit % int(micro_batches_.size()))];
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(cudaStreamLegacy, as_event(kv_ready_[buffer(unit)]), 0));
  const size_t first = size_t(batch.first_query) * size_t(shape_.num_kv_heads) * size_t(shape_.head_dim);
  const PagedKvView staging = view(unit);
  SLIMKV_RETURN_IF_ERROR(write_kv_slots(k + first, v + first, step_slots_.data() + batch.first_query, batch.num_queries,
                                        shape_.num_kv_heads, shape_.head_dim, const_cast<uint16_t*>(staging.k),
                                        const_cast<uint16_t*>(staging.v)));
  const int layer = unit / int(micro_batches_.size());
  SLIMKV_RETURN_IF_ERROR(write_host_kv(layer, batch.first_query, batch.num_queries, k, v));
  const UnitPlan& plan = plans_[size_t(unit % int(micro_batches_.size()))];
  if (plan.filled_seals == 0) return Status::ok();
  // The blocks the step filled, sealed for this step's attention and kept sealed on the host.
  SLIMKV_RETURN_IF_ERROR(sealer_->seal(layer, staging, seal_lists_.data() + 3 * plan.first_staging_seal,
                                       plan.filled_seals, staging_sealed_[buffer(unit)].data()));
  auto* host = static_cast<uint8_t*>(host_sealed_) + size_t(layer) * shape_.host_blocks * sealed_block_bytes();
  return sealer_->seal(layer, staging, seal_lists_.data() + 3 * plan.first_host_seal, plan.filled_seals, host);
}

Status CudaHostKvTier::store_kv(int layer, const uint16_t* k, const uint16_t* v) {
  return write_host_kv(layer, 0, step_tokens_, k, v);
}

Status CudaHostKvTier::write_host_kv(int layer, int first, int n, const uint16_t* k, const uint16_t* v) {
  const size_t row = size_t(shape_.num_kv_heads) * size_t(shape_.head_dim) * size_t(first);
  const size_t k_halves = kv_block_bytes() / 4;  // K's half of a K|V block, in halves
  auto* host = static_cast<uint16_t*>(host_kv_) + size_t(layer) * shape_.host_blocks * 2 * k_halves;
  return write_kv_slots(k + row, v + row, step_slots_.data() + shape_.max_step_tokens + first, n, shape_.num_kv_heads,
                        shape_.head_dim, host, host + k_halves);
}

PagedKvView CudaHostKvTier::view(int unit) const {
  const auto* k = reinterpret_cast<const uint16_t*>(staging_kv_[buffer(unit)].data());
  return PagedKvView{k, k + kv_block_bytes() / 4, tables_.data(), shape_.max_blocks_per_sequence, shape_.num_kv_heads,
                     shape_.head_dim};
}

QuantizedKvView CudaHostKvTier::sealed_view(int unit) const {
  return sealer_->view(staging_sealed_[buffer(unit)].data(), tables_.data(), /*table_shift=*/1);
}

Status CudaHostKvTier::release(int unit) {
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(as_event(free_[buffer(unit)]), cudaStreamLegacy));
  return Status::ok();
}

}  // namespace slimkv::cuda
