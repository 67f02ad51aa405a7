// slimkv's product quantizer (kv/select/pq_codebook.h) against FAISS's (faiss::IndexPQ, Debian's
// libfaiss-dev), on the same real keys: every (layer, KV head) of the bundled model over held-out text.
// Side by side: k-means (training) time, encode time, ADC top-k search time, reconstruction error and
// recall of the exact top-k. Both single-threaded (FAISS's OpenMP set to 1 thread), same iterations.
//   bench_pq --model DIR [--tokens 4096] [--m 2] [--b 6] [--iters 25] [--topk 0.2] [--queries 32]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>
#include <faiss/IndexPQ.h>

#include "kv/select/pq_codebook.h"
#include "model/llama.h"
#include "slimkv/engine.h"
#include "slimkv/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Every layer's keys and queries for every token, as the model computed them.
struct Recorder : slimkv::ForwardObserver {
  std::vector<std::vector<float>> keys, queries;
  void on_qkv(int layer, const float* q, const float* k, const float*, int n) override {
    if (keys.size() <= size_t(layer)) keys.resize(size_t(layer) + 1), queries.resize(size_t(layer) + 1);
    keys[size_t(layer)].insert(keys[size_t(layer)].end(), k, k + size_t(n) * kv_width);
    queries[size_t(layer)].insert(queries[size_t(layer)].end(), q, q + size_t(n) * q_width);
  }
  size_t kv_width = 0, q_width = 0;
};

// The k indices of the highest scores, unordered (as the selector takes them: nth_element).
std::vector<int> top_k(const std::vector<float>& scores, int k) {
  std::vector<int> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
    return scores[size_t(a)] != scores[size_t(b)] ? scores[size_t(a)] > scores[size_t(b)] : a < b;
  });
  order.resize(size_t(k));
  return order;
}

double recall(const std::vector<int>& found, const std::vector<int>& truth) {
  const std::set<int> t(truth.begin(), truth.end());
  int hits = 0;
  for (int i : found) hits += t.count(i) ? 1 : 0;
  return double(hits) / double(truth.size());
}

struct Totals {
  double train_ms = 0, encode_ms = 0, search_ms = 0, relative_error = 0, recall = 0;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"slimkv PQ vs FAISS IndexPQ on the bundled model's keys"};
  std::string model_dir;
  int tokens = 4096, m = 2, bits = 6, iters = 25, queries = 32;
  double topk = 0.2;
  app.add_option("--model", model_dir, "model directory")->required();
  app.add_option("--tokens", tokens, "held-out tokens (keys per head)")->capture_default_str();
  app.add_option("--m", m, "sub-spaces")->capture_default_str();
  app.add_option("--b", bits, "bits per sub-space code")->capture_default_str();
  app.add_option("--iters", iters, "k-means iterations (both)")->capture_default_str();
  app.add_option("--topk", topk, "fraction of keys retrieved")->capture_default_str();
  app.add_option("--queries", queries, "queries per head: those of the last tokens")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(1);

  slimkv::EngineConfig config;
  config.model_dir = model_dir;
  config.threads = 2;
  auto engine = slimkv::Engine::load(config);
  if (!engine) {
    std::fprintf(stderr, "bench_pq: %s\n", engine.status().message().c_str());
    return 1;
  }
  const slimkv::KvShape shape = (*engine)->model().kv_shape();
  const int heads = int((*engine)->model().config().num_heads), d = shape.k_dim, group = heads / shape.num_kv_heads;
  std::ifstream in(model_dir + "/heldout.txt");
  std::stringstream text;
  text << in.rdbuf();
  std::vector<int32_t> ids = (*engine)->tokenizer()->encode(text.str());
  tokens = std::min<int>(tokens, std::min<int>(int(ids.size()), shape.max_tokens));
  ids.resize(size_t(tokens));
  Recorder recorder;
  recorder.kv_width = size_t(shape.num_kv_heads) * d;
  recorder.q_width = size_t(heads) * d;
  auto session = (*engine)->new_session();
  session->set_observer(&recorder);
  if (!session->prefill(ids)) return 1;

  // Database: keys of the first n tokens; queries: the summed GQA group queries of the last tokens
  // (which see every database key), as the selector scores them.
  const int n = tokens - queries, k = int(topk * n);
  Totals ours, theirs;
  int pairs = 0;
  for (int layer = 0; layer < shape.num_layers; ++layer) {
    for (int g = 0; g < shape.num_kv_heads; ++g, ++pairs) {
      std::vector<float> keys(size_t(n) * d), q(size_t(queries) * d, 0.0f);
      for (int t = 0; t < n; ++t) {
        std::copy_n(recorder.keys[size_t(layer)].data() + (size_t(t) * shape.num_kv_heads + size_t(g)) * d, d,
                    keys.data() + size_t(t) * d);
      }
      for (int i = 0; i < queries; ++i) {
        for (int h = 0; h < group; ++h) {
          const size_t row = (size_t(n + i) * heads + size_t(g * group + h)) * d;
          const float* qh = recorder.queries[size_t(layer)].data() + row;
          for (int c = 0; c < d; ++c) q[size_t(i) * d + size_t(c)] += qh[c];
        }
      }
      std::vector<std::vector<int>> truth;
      for (int i = 0; i < queries; ++i) {
        std::vector<float> exact(static_cast<size_t>(n));
        for (int t = 0; t < n; ++t) {
          exact[size_t(t)] = std::inner_product(q.begin() + ptrdiff_t(i) * d, q.begin() + ptrdiff_t(i + 1) * d,
                                                keys.begin() + ptrdiff_t(t) * d, 0.0f);
        }
        truth.push_back(top_k(exact, k));
      }
      auto reconstruction_error = [&](const std::function<void(const uint8_t*, float*)>& decode, size_t code_size,
                                      const std::vector<uint8_t>& codes) {
        double error = 0, norm = 0;
        std::vector<float> x(static_cast<size_t>(d));
        for (int t = 0; t < n; ++t) {
          decode(codes.data() + size_t(t) * code_size, x.data());
          for (int c = 0; c < d; ++c) {
            const double key = keys[size_t(t) * d + size_t(c)];
            error += (key - x[size_t(c)]) * (key - x[size_t(c)]);
            norm += key * key;
          }
        }
        return error / norm;
      };

      // slimkv
      slimkv::PqCodebook codebook(d, m, bits);
      auto start = Clock::now();
      codebook.train(keys.data(), n, iters, 1234);
      ours.train_ms += ms_since(start);
      std::vector<uint8_t> codes(size_t(n) * m);
      start = Clock::now();
      codebook.encode(keys.data(), n, codes.data());
      ours.encode_ms += ms_since(start);
      std::vector<float> table(size_t(m) << bits), scores(static_cast<size_t>(n));
      std::vector<std::vector<int>> found;
      start = Clock::now();
      for (int i = 0; i < queries; ++i) {
        codebook.score_table(q.data() + size_t(i) * d, table.data());
        codebook.score_codes(table.data(), codes.data(), n, scores.data());
        found.push_back(top_k(scores, k));
      }
      ours.search_ms += ms_since(start);
      for (int i = 0; i < queries; ++i) ours.recall += recall(found[size_t(i)], truth[size_t(i)]) / queries;
      ours.relative_error +=
          reconstruction_error([&](const uint8_t* code, float* x) { codebook.reconstruct(code, x); }, size_t(m), codes);

      // FAISS
      faiss::IndexPQ index(d, size_t(m), size_t(bits), faiss::METRIC_INNER_PRODUCT);
      index.pq.cp.niter = iters;
      index.pq.cp.seed = 1234;
      start = Clock::now();
      index.train(n, keys.data());
      theirs.train_ms += ms_since(start);
      start = Clock::now();
      index.add(n, keys.data());
      theirs.encode_ms += ms_since(start);
      std::vector<float> distances(size_t(queries) * k);
      std::vector<faiss::Index::idx_t> labels(size_t(queries) * k);
      start = Clock::now();
      index.search(queries, q.data(), k, distances.data(), labels.data());
      theirs.search_ms += ms_since(start);
      for (int i = 0; i < queries; ++i) {
        const std::vector<int> faiss_found(labels.begin() + ptrdiff_t(i) * k, labels.begin() + ptrdiff_t(i + 1) * k);
        theirs.recall += recall(faiss_found, truth[size_t(i)]) / queries;
      }
      theirs.relative_error += reconstruction_error(
          [&](const uint8_t* code, float* x) { index.pq.decode(code, x); }, index.pq.code_size, index.codes);
    }
  }
  std::printf("PQ m=%d b=%d on %d keys x %d (layer, KV head) of %s; %d queries each, top-%d (%.0f%%), %d k-means "
              "iterations, 1 thread\n",
              m, bits, n, pairs, model_dir.c_str(), queries, k, topk * 100, iters);
  std::printf("%-26s %12s %12s %10s\n", "", "slimkv", "faiss", "slimkv/faiss");
  const auto row = [](const char* name, double a, double b) {
    std::printf("%-26s %12.3f %12.3f %10.2f\n", name, a, b, a / b);
  };
  row("k-means ms (all heads)", ours.train_ms, theirs.train_ms);
  row("encode ms (all heads)", ours.encode_ms, theirs.encode_ms);
  row("ADC top-k ms per query", ours.search_ms / (pairs * queries), theirs.search_ms / (pairs * queries));
  row("relative recon. error", ours.relative_error / pairs, theirs.relative_error / pairs);
  row("recall of exact top-k", ours.recall / pairs, theirs.recall / pairs);
  return 0;
}
