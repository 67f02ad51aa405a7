#include "kv/cuda/pq_gpu_index.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <future>

#include "backend/cuda/cuda_check.h"
#include "kv/select/kmeans.h"
#include "kv/select/pq_codebook.h"
#include "util/half.h"

namespace slimkv::cuda {

CudaPqIndex::CudaPqIndex(const PqIndexShape& shape, const PqOptions& options, uint64_t seed)
    : shape_(shape),
      options_(options),
      seed_(seed),
      max_segments_((shape.max_tokens + options.segment_tokens - 1) / options.segment_tokens),
      collected_(size_t(shape.max_sequences)),
      launched_(size_t(shape.max_sequences)),
      tails_(size_t(shape.max_sequences) * size_t(shape.num_layers) * size_t(shape.num_kv_heads)),
      done_(size_t(shape.num_layers)),
      pending_(size_t(shape.num_layers)),
      pool_(int(std::max(1u, std::thread::hardware_concurrency()))),
      clusterer_([this] { cluster_batches(); }) {}

void CudaPqIndex::cluster_batches() {
  for (;;) {
    Batch batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      batch = std::move(queue_.front());
      queue_.pop_front();
    }
    std::vector<Trained> trained(batch.jobs.size());
    pool_.run(int64_t(batch.jobs.size()), [&](int64_t j, int) { trained[size_t(j)] = train(batch.layer, batch.jobs[size_t(j)]); });
    std::lock_guard<std::mutex> lock(mutex_);
    for (Trained& t : trained) done_[size_t(batch.layer)].push_back(std::move(t));
    --pending_[size_t(batch.layer)];
    changed_.notify_all();
  }
}

CudaPqIndex::Trained CudaPqIndex::train(int layer, const Job& job) const {
  PqCodebook codebook(shape_.head_dim, options_.m, options_.bits);
  const int iters = options_.max_iters ? options_.max_iters
                                       : kmeans_iteration_cap(options_.segment_tokens, shape_.num_kv_heads, options_.m,
                                                              options_.bits, shape_.head_dim / options_.m);
  codebook.train(job.keys.data(), options_.segment_tokens, iters, pq_segment_seed(seed_, layer, job.head, job.segment));
  std::vector<uint8_t> codes(size_t(options_.segment_tokens) * size_t(options_.m));
  codebook.encode(job.keys.data(), options_.segment_tokens, codes.data());
  return Trained{job.sequence, job.head, job.segment, codebook.centroids(), std::move(codes)};
}

Expected<std::unique_ptr<CudaPqIndex>> CudaPqIndex::create(const PqIndexShape& shape, const PqOptions& options,
                                                            uint64_t seed) {
  if (shape.head_dim % options.m != 0 || options.bits < 1 || options.bits > 8 || options.segment_tokens < (1 << options.bits)) {
    return error("pq on device 'cuda': m=", options.m, " must divide head_dim ", shape.head_dim, ", b=", options.bits,
                 " must be 1..8 and segment=", options.segment_tokens, " at least 2^b");
  }
  use_single_threaded_blas();  // before the clustering threads start
  std::unique_ptr<CudaPqIndex> index(new CudaPqIndex(shape, options, seed));
  const size_t entries = size_t(shape.num_layers) * size_t(shape.max_sequences) * size_t(shape.num_kv_heads);
  SLIMKV_ASSIGN_OR_RETURN(index->centroids_, DeviceArray<uint16_t>::allocate(entries * size_t(index->max_segments_) *
                                                                                 index->centroid_elements(),
                                                                             "the PQ centroids"));
  SLIMKV_ASSIGN_OR_RETURN(index->codes_, DeviceArray<uint8_t>::allocate(entries * size_t(shape.max_tokens) * size_t(options.m),
                                                                        "the PQ codes"));
  SLIMKV_ASSIGN_OR_RETURN(index->staging_, PinnedArray<uint16_t>::allocate(size_t(shape.num_layers) * size_t(shape.max_step_tokens) *
                                                                               size_t(shape.num_kv_heads) * size_t(shape.head_dim),
                                                                           "the keys on their way to clustering"));
  cudaEvent_t event = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  index->copied_ = event;
  return Expected<std::unique_ptr<CudaPqIndex>>(std::move(index));
}

CudaPqIndex::~CudaPqIndex() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    changed_.notify_all();
  }
  clusterer_.join();
  if (copied_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(copied_));
}

Status CudaPqIndex::reset_sequence(int sequence) {
  for (int l = 0; l < shape_.num_layers; ++l) SLIMKV_RETURN_IF_ERROR(finish_layer(l));
  collected_[size_t(sequence)] = launched_[size_t(sequence)] = 0;
  for (int l = 0; l < shape_.num_layers; ++l) {
    for (int g = 0; g < shape_.num_kv_heads; ++g) tail(sequence, l, g).clear();
  }
  // A staged step of the sequence's previous life is not collected into the new one.
  for (auto& [s, n] : step_) {
    if (s == sequence) n = -n;
  }
  return Status::ok();
}

Status CudaPqIndex::collect() {
  if (!staged_) return Status::ok();
  staged_ = false;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(copied_)));
  const size_t row = size_t(shape_.num_kv_heads) * size_t(shape_.head_dim), d = size_t(shape_.head_dim);
  const auto collect_layer = [this, row, d](int l) {
    const uint16_t* keys = staging_.data() + size_t(l) * size_t(shape_.max_step_tokens) * row;
    size_t first = 0;
    for (const auto& [sequence, n] : step_) {
      const size_t tokens = size_t(n < 0 ? -n : n);
      for (int g = 0; n > 0 && g < shape_.num_kv_heads; ++g) {
        std::vector<float>& out = tail(sequence, l, g);
        size_t at = out.size();
        out.resize(at + tokens * d);
        for (size_t t = first; t < first + tokens; ++t) {
          for (size_t c = 0; c < d; ++c) out[at++] = fp16_to_float(keys[t * row + size_t(g) * d + c]);
        }
      }
      first += tokens;
    }
  };
  // A decode step's few keys here; a prompt chunk's (up to GBs of FP16 over a long prompt) on a task per layer.
  size_t step_tokens = 0;
  for (const auto& step : step_) step_tokens += size_t(std::abs(step.second));
  if (step_tokens <= 64) {
    for (int l = 0; l < shape_.num_layers; ++l) collect_layer(l);
  } else {
    std::vector<std::future<void>> layers;
    for (int l = 0; l < shape_.num_layers; ++l) layers.push_back(std::async(std::launch::async, collect_layer, l));
    for (auto& layer : layers) layer.get();
  }
  for (const auto& [sequence, n] : step_) {
    if (n > 0) collected_[size_t(sequence)] += n;
  }
  return Status::ok();
}

Status CudaPqIndex::begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens) {
  SLIMKV_RETURN_IF_ERROR(collect());
  // Full segments not clustered yet: their keys leave the tails for a batch per layer.
  const int segment = options_.segment_tokens, d = shape_.head_dim;
  std::vector<std::vector<Job>> jobs(size_t(shape_.num_layers));
  for (int s = 0; s < shape_.max_sequences; ++s) {
    while (collected_[size_t(s)] >= (launched_[size_t(s)] + 1) * segment) {
      for (int l = 0; l < shape_.num_layers; ++l) {
        for (int g = 0; g < shape_.num_kv_heads; ++g) {
          std::vector<float>& keys = tail(s, l, g);
          const auto end = keys.begin() + std::ptrdiff_t(segment) * d;
          jobs[size_t(l)].push_back(Job{s, g, launched_[size_t(s)], std::vector<float>(keys.begin(), end)});
          keys.erase(keys.begin(), end);
        }
      }
      ++launched_[size_t(s)];
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int l = 0; l < shape_.num_layers; ++l) {
      if (jobs[size_t(l)].empty()) continue;
      queue_.push_back(Batch{l, std::move(jobs[size_t(l)])});
      ++pending_[size_t(l)];
    }
    changed_.notify_all();
  }
  step_.clear();
  for (size_t i = 0; i < sequences.size(); ++i) step_.emplace_back(sequences[i], new_tokens[i]);
  return Status::ok();
}

Status CudaPqIndex::keep_keys(int layer, const uint16_t* k) {
  size_t tokens = 0;
  for (const auto& step : step_) tokens += size_t(step.second);
  const size_t row = size_t(shape_.num_kv_heads) * size_t(shape_.head_dim);
  uint16_t* to = staging_.data() + size_t(layer) * size_t(shape_.max_step_tokens) * row;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to, k, tokens * row * 2, cudaMemcpyDeviceToHost, 0));
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(copied_), 0));
  staged_ = true;
  return Status::ok();
}

Status CudaPqIndex::finish_layer(int layer) {
  std::vector<Trained> trained;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return pending_[size_t(layer)] == 0; });
    trained.swap(done_[size_t(layer)]);
  }
  const size_t heads = size_t(shape_.num_kv_heads), m = size_t(options_.m);
  for (const Trained& t : trained) {
    const size_t entry = (size_t(layer) * size_t(shape_.max_sequences) + size_t(t.sequence)) * heads + size_t(t.head);
    const size_t at = (entry * size_t(max_segments_) + size_t(t.segment)) * centroid_elements();
    SLIMKV_RETURN_IF_ERROR(copy_to_device(centroids_.data() + at, t.centroids.data(), t.centroids.size() * 2));
    const size_t code_at = (entry * size_t(shape_.max_tokens) + size_t(t.segment) * size_t(options_.segment_tokens)) * m;
    SLIMKV_RETURN_IF_ERROR(copy_to_device(codes_.data() + code_at, t.codes.data(), t.codes.size()));
  }
  return Status::ok();
}

PqIndexView CudaPqIndex::view(int layer) const {
  const size_t entries = size_t(layer) * size_t(shape_.max_sequences) * size_t(shape_.num_kv_heads);
  return PqIndexView{centroids_.data() + entries * size_t(max_segments_) * centroid_elements(),
                     codes_.data() + entries * size_t(shape_.max_tokens) * size_t(options_.m),
                     options_.m, options_.bits, shape_.head_dim, options_.segment_tokens, max_segments_,
                     shape_.max_tokens};
}

}  // namespace slimkv::cuda
