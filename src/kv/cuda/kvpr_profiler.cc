#include "kv/cuda/kvpr_profiler.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/random_fill.h"
#include "util/atomic_file.h"
#include "util/mapped_file.h"

namespace slimkv::cuda {
namespace {

using Json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Timing on the GPU: CUDA events around the work, the median of repeats after a warm-up run.
// ---------------------------------------------------------------------------------------------

constexpr size_t kMiB = size_t(1) << 20;
// Copies of this size take milliseconds, so the fixed cost of a copy (~10 µs) is below 1% of its time
// and what is measured is the link; the rate reported is the median of the three sizes' rates.
constexpr size_t kCopySizesBytes[] = {64 * kMiB, 128 * kMiB, 256 * kMiB};
// The recompute GEMM has l·b rows (split l, batch b). Eq. 10 is linear in l, so it takes one rate: the
// one at the largest row count, where the GEMM fills the GPU. The splits worth choosing are at long
// contexts (transfer-bound), where l·b is thousands of rows and up; the smaller counts, timed first
// and not reported, bring the clocks up and let cuBLAS load its kernels before that measurement.
constexpr int64_t kGemmRowCounts[] = {1024, 4096, 16384};
constexpr int kRepeats = 5;
constexpr int kGemmLaunchesPerRepeat = 10;  // a 1024-row GEMM takes tens of µs: time a run of them
const cudaStream_t kLegacyStream = nullptr;  // where CublasGemm launches (its handle has no stream set)

struct EventDestroyer {
  void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroyer>;

struct StreamDestroyer {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
using Stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroyer>;

struct PinnedHostFreer {
  void operator()(void* host) const { cudaFreeHost(host); }
};
using PinnedHostMemory = std::unique_ptr<void, PinnedHostFreer>;

Expected<Event> create_event() {
  cudaEvent_t event = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
  return Event(event);
}

double median(std::vector<double> values) {
  const auto middle = values.begin() + std::ptrdiff_t(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

// Seconds the work that `enqueue` puts on `stream` takes on the GPU: one untimed run (warm-up: clocks,
// first touch of the pages, cuBLAS's kernel choice), then the median of kRepeats runs, each between
// two events recorded on the stream.
template <typename Enqueue>
Expected<double> median_gpu_seconds(cudaStream_t stream, const Enqueue& enqueue) {
  SLIMKV_ASSIGN_OR_RETURN(const Event start, create_event());
  SLIMKV_ASSIGN_OR_RETURN(const Event stop, create_event());
  SLIMKV_RETURN_IF_ERROR(enqueue());
  std::vector<double> seconds;
  for (int repeat = 0; repeat < kRepeats; ++repeat) {
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(start.get(), stream));
    SLIMKV_RETURN_IF_ERROR(enqueue());
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop.get(), stream));
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop.get()));
    float milliseconds = 0;
    SLIMKV_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&milliseconds, start.get(), stop.get()));
    seconds.push_back(double(milliseconds) * 1e-3);
  }
  return median(std::move(seconds));
}

// ---------------------------------------------------------------------------------------------
// The two rates of Eq. 10
// ---------------------------------------------------------------------------------------------

// v_com: pinned host memory to the device with cudaMemcpyAsync on a stream of its own, as the
// offload and kvpr tiers copy KV blocks (pageable memory would be staged and slower).
Expected<double> measure_link_bytes_per_s() {
  const size_t largest_bytes = *std::max_element(std::begin(kCopySizesBytes), std::end(kCopySizesBytes));
  void* host = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&host, largest_bytes, cudaHostAllocDefault));
  const PinnedHostMemory host_owner(host);
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<uint8_t> device,
                          DeviceArray<uint8_t>::allocate(largest_bytes, "the KVPR profiler's copies"));
  cudaStream_t stream = nullptr;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Stream stream_owner(stream);

  std::vector<double> rates;
  for (const size_t bytes : kCopySizesBytes) {
    const auto copy = [&]() -> Status {
      SLIMKV_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device.data(), host, bytes, cudaMemcpyHostToDevice, stream));
      return Status::ok();
    };
    SLIMKV_ASSIGN_OR_RETURN(const double seconds, median_gpu_seconds(stream, copy));
    rates.push_back(double(bytes) / seconds);
  }
  return median(std::move(rates));
}

// v_gpu: y[rows, kv_rows] = X[rows, hidden] · W_kvᵀ through CublasGemm, the product that recomputes
// K and V from X (Eq. 8), at 2·rows·hidden·kv_rows FLOPs.
Expected<double> measure_gemm_flops_per_s(int hidden, int kv_rows, DType dtype) {
  const int64_t largest_rows = *std::max_element(std::begin(kGemmRowCounts), std::end(kGemmRowCounts));
  SLIMKV_ASSIGN_OR_RETURN(const std::unique_ptr<CublasGemm> gemm, CublasGemm::create());
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<uint16_t> x,
                          DeviceArray<uint16_t>::allocate(size_t(largest_rows) * size_t(hidden), "the KVPR profiler's X"));
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<uint16_t> w,
                          DeviceArray<uint16_t>::allocate(size_t(kv_rows) * size_t(hidden), "the KVPR profiler's W_kv"));
  SLIMKV_ASSIGN_OR_RETURN(DeviceArray<float> y,
                          DeviceArray<float>::allocate(size_t(largest_rows) * size_t(kv_rows), "the KVPR profiler's K, V"));
  // Random inputs: a GEMM over constant data switches fewer bits, draws less power and can run at
  // higher clocks than one over real activations. FP16 bits read as BF16 are small finite values.
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(x.data(), x.size(), /*seed=*/1, /*amplitude=*/1.0f));
  SLIMKV_RETURN_IF_ERROR(fill_random_fp16(w.data(), w.size(), /*seed=*/2, /*amplitude=*/0.05f));

  double flops_per_s = 0;
  for (const int64_t rows : kGemmRowCounts) {
    const auto multiply = [&]() -> Status {
      for (int launch = 0; launch < kGemmLaunchesPerRepeat; ++launch) {
        SLIMKV_RETURN_IF_ERROR(gemm->multiply(x.data(), rows, w.data(), dtype, kv_rows, hidden, y.data()));
      }
      return Status::ok();
    };
    SLIMKV_ASSIGN_OR_RETURN(const double seconds, median_gpu_seconds(kLegacyStream, multiply));
    flops_per_s = 2.0 * double(rows) * hidden * kv_rows * kGemmLaunchesPerRepeat / seconds;  // the largest's stays
  }
  return flops_per_s;
}

// The current device as the cache identifies it: its name and its PCI bus id (two GPUs of one model
// in one host, or a GPU moved to another slot, are told apart).
Expected<std::string> current_device_id() {
  int device = 0;
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  cudaDeviceProp properties{};
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device));
  char bus_id[32] = {};
  SLIMKV_CUDA_RETURN_IF_ERROR(cudaDeviceGetPCIBusId(bus_id, int(sizeof bus_id), device));
  return str_cat(properties.name, ", ", bus_id);
}

// The profile's name of the GEMM's element type, or an error for a type the GEMM does not take.
Expected<std::string> profile_dtype_name(DType dtype) {
  if (dtype == DType::kF16) return std::string("f16");
  if (dtype == DType::kBF16) return std::string("bf16");
  return error("KVPR profile: dtype ", dtype_name(dtype), " (expected F16 or BF16, the weights' type of the recompute GEMM)");
}

Status check_shape(int hidden, int kv_rows) {
  if (hidden <= 0 || kv_rows <= 0) {
    return error("KVPR profile: GEMM shape hidden=", hidden, ", kv_rows=", kv_rows, " (expected both positive)");
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// The cache file: {"profiles": [{"device": ..., "hidden": ..., ...}, ...]}
// ---------------------------------------------------------------------------------------------

constexpr std::string_view kFixHint = " (delete the file, or fix it, to measure again)";

class EntryReader {
 public:
  EntryReader(const Json& entry, std::string where) : entry_(entry), where_(std::move(where)) {}

  Expected<std::string> string(std::string_view key) const {
    const Json* value = find(key);
    if (value == nullptr || !value->is_string()) return wrong(key, value, "a string");
    return value->get<std::string>();
  }
  Expected<int> positive_int(std::string_view key) const {
    const Json* value = find(key);
    if (value == nullptr || !value->is_number_integer() || value->get<int64_t>() <= 0 || value->get<int64_t>() > INT_MAX) {
      return wrong(key, value, "a positive integer");
    }
    return int(value->get<int64_t>());
  }
  Expected<double> positive_number(std::string_view key) const {
    const Json* value = find(key);
    if (value == nullptr || !value->is_number() || !(value->get<double>() > 0) || !std::isfinite(value->get<double>())) {
      return wrong(key, value, "a positive number");
    }
    return value->get<double>();
  }

 private:
  const Json* find(std::string_view key) const {
    const auto it = entry_.find(key);
    return it == entry_.end() ? nullptr : &*it;
  }
  Status wrong(std::string_view key, const Json* value, std::string_view expected) const {
    return error(where_, ": field \"", key, "\" is ", value == nullptr ? "missing" : value->dump(), ", expected ",
                 expected, kFixHint);
  }
  const Json& entry_;
  std::string where_;
};

Expected<KvprProfile> parse_profile(const Json& entry, const std::string& where) {
  if (!entry.is_object()) return error(where, " is ", entry.dump(), ", expected an object", kFixHint);
  const EntryReader reader(entry, where);
  KvprProfile profile;
  SLIMKV_ASSIGN_OR_RETURN(profile.device, reader.string("device"));
  SLIMKV_ASSIGN_OR_RETURN(profile.hidden, reader.positive_int("hidden"));
  SLIMKV_ASSIGN_OR_RETURN(profile.kv_rows, reader.positive_int("kv_rows"));
  SLIMKV_ASSIGN_OR_RETURN(profile.dtype, reader.string("dtype"));
  if (profile.dtype != "f16" && profile.dtype != "bf16") {
    return error(where, ": field \"dtype\" is \"", profile.dtype, "\", expected \"f16\" or \"bf16\"", kFixHint);
  }
  SLIMKV_ASSIGN_OR_RETURN(profile.link_bytes_per_s, reader.positive_number("link_bytes_per_s"));
  SLIMKV_ASSIGN_OR_RETURN(profile.gemm_flops_per_s, reader.positive_number("gemm_flops_per_s"));
  return profile;
}

Expected<std::vector<KvprProfile>> read_profiles(const std::string& path) {
  SLIMKV_ASSIGN_OR_RETURN(const std::string text, read_text_file(path));
  const Json json = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) {
    return error(path, ": not valid JSON, expected the KVPR profile cache {\"profiles\": [...]}", kFixHint);
  }
  if (!json.is_object() || !json.contains("profiles") || !json["profiles"].is_array()) {
    return error(path, ": expected an object with a list \"profiles\" (the KVPR profile cache)", kFixHint);
  }
  std::vector<KvprProfile> profiles;
  const Json& list = json["profiles"];
  for (size_t i = 0; i < list.size(); ++i) {
    SLIMKV_ASSIGN_OR_RETURN(KvprProfile profile, parse_profile(list[i], str_cat(path, ": profiles[", i, "]")));
    profiles.push_back(std::move(profile));
  }
  return profiles;
}

Status write_profiles(const std::string& path, const std::vector<KvprProfile>& profiles) {
  const std::filesystem::path directory = std::filesystem::path(path).parent_path();
  if (!directory.empty()) {
    std::error_code failure;
    std::filesystem::create_directories(directory, failure);
    if (failure) return error("creating the directory ", directory.string(), " for ", path, ": ", failure.message());
  }
  Json list = Json::array();
  for (const KvprProfile& p : profiles) {
    list.push_back({{"device", p.device},
                    {"hidden", p.hidden},
                    {"kv_rows", p.kv_rows},
                    {"dtype", p.dtype},
                    {"link_bytes_per_s", p.link_bytes_per_s},
                    {"gemm_flops_per_s", p.gemm_flops_per_s}});
  }
  const std::string text = Json{{"profiles", std::move(list)}}.dump(2) + "\n";
  return write_file_atomically(path, {std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size())});
}

bool same_key(const KvprProfile& a, const KvprProfile& b) {
  return a.device == b.device && a.hidden == b.hidden && a.kv_rows == b.kv_rows && a.dtype == b.dtype;
}

// An environment variable's value, empty when it is unset.
std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

}  // namespace

Expected<KvprProfile> measure_kvpr_profile(int hidden, int kv_rows, DType dtype) {
  SLIMKV_RETURN_IF_ERROR(check_shape(hidden, kv_rows));
  KvprProfile profile;
  SLIMKV_ASSIGN_OR_RETURN(profile.dtype, profile_dtype_name(dtype));
  SLIMKV_ASSIGN_OR_RETURN(profile.device, current_device_id());
  profile.hidden = hidden;
  profile.kv_rows = kv_rows;
  SLIMKV_ASSIGN_OR_RETURN(profile.link_bytes_per_s, measure_link_bytes_per_s());
  SLIMKV_ASSIGN_OR_RETURN(profile.gemm_flops_per_s, measure_gemm_flops_per_s(hidden, kv_rows, dtype));
  return profile;
}

Expected<KvprProfile> load_or_measure_kvpr_profile(const std::string& path, int hidden, int kv_rows, DType dtype,
                                                   bool remeasure) {
  SLIMKV_RETURN_IF_ERROR(check_shape(hidden, kv_rows));
  KvprProfile wanted;
  SLIMKV_ASSIGN_OR_RETURN(wanted.dtype, profile_dtype_name(dtype));
  wanted.hidden = hidden;
  wanted.kv_rows = kv_rows;

  // Read the file before touching the GPU: a broken cache is reported, never replaced.
  std::vector<KvprProfile> profiles;
  std::error_code failure;
  const bool exists = std::filesystem::exists(path, failure);
  if (failure) return error("looking for the KVPR profile cache ", path, ": ", failure.message());
  if (exists) {
    SLIMKV_ASSIGN_OR_RETURN(profiles, read_profiles(path));
  }

  SLIMKV_ASSIGN_OR_RETURN(wanted.device, current_device_id());
  const auto cached = std::find_if(profiles.begin(), profiles.end(),
                                   [&](const KvprProfile& p) { return same_key(p, wanted); });
  if (cached != profiles.end() && !remeasure) return *cached;

  SLIMKV_ASSIGN_OR_RETURN(KvprProfile measured, measure_kvpr_profile(hidden, kv_rows, dtype));
  std::erase_if(profiles, [&](const KvprProfile& p) { return same_key(p, measured); });
  profiles.push_back(measured);
  SLIMKV_RETURN_IF_ERROR(write_profiles(path, profiles).with_context("saving the KVPR profile"));
  return measured;
}

std::string default_kvpr_profile_path() {
  if (const std::string path = environment("SLIMKV_KVPR_PROFILE"); !path.empty()) return path;
  if (const std::string cache = environment("XDG_CACHE_HOME"); !cache.empty()) {
    return cache + "/slimkv/kvpr_profile.json";
  }
  if (const std::string home = environment("HOME"); !home.empty()) return home + "/.cache/slimkv/kvpr_profile.json";
  return "kvpr_profile.json";
}

}  // namespace slimkv::cuda
