// The PQ index of `pq:...` on the GPU (kv/cuda/gpu_pq_kv.cc): per sequence, layer and KV head one
// codebook per segment of `segment` tokens (FP16 centroids) and every clustered token's codes, in GPU
// memory (what pq_select.h scores); the clustering on CPU threads with the CPU selector's codebook and
// k-means (kv/select/pq_codebook.h, its seeds and its iteration cap, Eq. 3).
//
// Keys reach the host behind the GPU's work: each layer's new keys are copied (async) into pinned
// staging as the layer appends them; the next step collects them (the step before has ended by then)
// and, for every segment that is full, queues its clustering for a background thread that runs the
// layers' batches in order, each over a pool of CPU threads (PQCache Algorithm 1: behind the following
// work; a layer's selection waits for its own batches only, finish_layer). The threads are persistent:
// BLAS (in k-means) keeps per-thread state, and threads started per step would pile it up. Tokens of a segment not clustered yet have no codes: the selection attends to them
// (the CPU selector codes them with the previous segment's codebook instead).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/pinned_memory.h"
#include "kv/cuda/pq_select.h"
#include "kv/select/pq_selector.h"
#include "util/thread_pool.h"

namespace slimkv::cuda {

struct PqIndexShape {
  int num_layers = 0, num_kv_heads = 0, head_dim = 0;
  int max_sequences = 0, max_tokens = 0, max_step_tokens = 0;
};

class CudaPqIndex {
 public:
  static Expected<std::unique_ptr<CudaPqIndex>> create(const PqIndexShape& shape, const PqOptions& options,
                                                       uint64_t seed);
  ~CudaPqIndex();

  // An empty sequence (the clustering queued so far finished first).
  Status reset_sequence(int sequence);
  // A step in which sequences[i] gains new_tokens[i]: collects the last step's keys and starts the
  // clustering of the segments they filled.
  Status begin_step(const std::vector<int>& sequences, const std::vector<int>& new_tokens);
  // The layer's new keys k [step tokens, kv_heads, head_dim] (device, begin_step's order) to the host.
  Status keep_keys(int layer, const uint16_t* k);
  // Waits for the layer's queued clustering and puts its codebooks and codes on the GPU.
  Status finish_layer(int layer);
  // Segments [0, n) of the sequence are clustered once finish_layer has run for a layer.
  int clustered_segments(int sequence) const { return launched_[size_t(sequence)]; }
  PqIndexView view(int layer) const;
  size_t device_bytes() const { return centroids_.bytes() + codes_.bytes(); }
  size_t host_bytes() const { return staging_.bytes(); }

 private:
  struct Job {
    int sequence, head, segment;
    std::vector<float> keys;  // [segment tokens, head_dim]
  };
  struct Trained {
    int sequence, head, segment;
    std::vector<uint16_t> centroids;
    std::vector<uint8_t> codes;
  };
  struct Batch {
    int layer;
    std::vector<Job> jobs;
  };
  CudaPqIndex(const PqIndexShape& shape, const PqOptions& options, uint64_t seed);
  void cluster_batches();  // the background thread
  Trained train(int layer, const Job& job) const;
  Status collect();  // the last step's staged keys into the sequences' unclustered keys
  std::vector<float>& tail(int sequence, int layer, int head) {
    return tails_[(size_t(sequence) * size_t(shape_.num_layers) + size_t(layer)) * size_t(shape_.num_kv_heads) +
                  size_t(head)];
  }
  size_t centroid_elements() const { return size_t(shape_.head_dim) << options_.bits; }  // one segment's codebook

  PqIndexShape shape_;
  PqOptions options_;
  uint64_t seed_;
  int max_segments_ = 0;
  DeviceArray<uint16_t> centroids_;  // [layers, sequences, kv heads, max_segments, head_dim · 2^b]
  DeviceArray<uint8_t> codes_;       // [layers, sequences, kv heads, max_tokens, m]
  PinnedArray<uint16_t> staging_;    // [layers, max_step_tokens, kv heads · head_dim]
  void* copied_ = nullptr;           // cudaEvent_t: the last keep_keys' copy
  std::vector<std::pair<int, int>> step_;  // the staged step: (sequence, tokens), in order
  bool staged_ = false;
  std::vector<int> collected_, launched_;  // per sequence: tokens whose keys are on the host; segments clustered
  std::vector<std::vector<float>> tails_;  // [sequence, layer, head]: keys past the clustered segments, FP32
  // The clustering queue: batches of one layer's jobs; per layer, the results not uploaded yet and the
  // batches not done.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> queue_;
  std::vector<std::vector<Trained>> done_;
  std::vector<int> pending_;
  bool stop_ = false;
  ThreadPool pool_;
  std::thread clusterer_;
};

}  // namespace slimkv::cuda
