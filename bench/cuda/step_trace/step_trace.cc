// A timeline of the GPU work of any slimkv program, for finding where a decode step's time goes on a
// machine without Nsight Systems (the GPU machines have CUPTI, which ships with the toolkit, and no
// nsys): preloaded into the program, it records every kernel, memory copy and CUDA runtime call through
// CUPTI's activity API and writes them to the CSV file $SLIMKV_TRACE_OUT, one line each:
//   kind,start_ns,end_ns,correlation_id,lane,what
// kind K (kernel; what = its mangled name, cut at 90 characters), M (memcpy; what = copy kind and bytes)
// or R (runtime call; what = its callback id); lane is the stream a kernel or copy ran on, or the thread
// that made a runtime call (so that one thread's waits can be set beside another stream's work). A kernel and the runtime call that launched it share the
// correlation id, so the lag between a launch and its start says whether the GPU waited for the CPU.
// bench/cuda/step_trace_summary.py reads the file. A "%p" in the path is replaced by the process id, for
// programs that start several (a disaggregated benchmark's workers: bench/cuda/step_trace_processes.py
// reads those). Usage:
//   SLIMKV_TRACE_OUT=trace.csv LD_PRELOAD=build/release/libslimkv_step_trace.so build/release/bench_decode_e2e_cuda ...
#include <cupti.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

FILE* trace_file = nullptr;
std::mutex trace_mutex;  // CUPTI hands over completed buffers from its own thread
constexpr size_t kBufferBytes = size_t(8) << 20;

void CUPTIAPI give_buffer(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;  // as many as fit
}

void write_record(const CUpti_Activity* record) {
  switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      // Later record versions only append fields: these are where every version has them.
      const auto* kernel = reinterpret_cast<const CUpti_ActivityKernel9*>(record);
      std::string name = kernel->name != nullptr ? kernel->name : "?";
      name.resize(std::min<size_t>(name.size(), 90));
      for (char& c : name) c = c == ',' ? ';' : c;
      std::fprintf(trace_file, "K,%llu,%llu,%u,s%u,%s\n", static_cast<unsigned long long>(kernel->start),
                   static_cast<unsigned long long>(kernel->end), kernel->correlationId, kernel->streamId, name.c_str());
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* copy = reinterpret_cast<const CUpti_ActivityMemcpy5*>(record);
      std::fprintf(trace_file, "M,%llu,%llu,%u,s%u,kind%d_%llu\n", static_cast<unsigned long long>(copy->start),
                   static_cast<unsigned long long>(copy->end), copy->correlationId, copy->streamId, int(copy->copyKind),
                   static_cast<unsigned long long>(copy->bytes));
      break;
    }
    case CUPTI_ACTIVITY_KIND_RUNTIME: {
      const auto* call = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      std::fprintf(trace_file, "R,%llu,%llu,%u,t%u,%u\n", static_cast<unsigned long long>(call->start),
                   static_cast<unsigned long long>(call->end), call->correlationId, call->threadId, call->cbid);
      break;
    }
    default:
      break;
  }
}

void CUPTIAPI take_buffer(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid_bytes) {
  {
    std::lock_guard<std::mutex> lock(trace_mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid_bytes, &record) == CUPTI_SUCCESS) write_record(record);
  }
  std::free(buffer);
}

__attribute__((constructor)) void start_tracing() {
  const char* variable = std::getenv("SLIMKV_TRACE_OUT");
  if (variable == nullptr) return;
  std::string path = variable;
  if (const size_t pid = path.find("%p"); pid != std::string::npos) path.replace(pid, 2, std::to_string(getpid()));
  trace_file = std::fopen(path.c_str(), "w");
  if (trace_file == nullptr) {
    std::fprintf(stderr, "slimkv step trace: cannot write %s\n", path.c_str());
    return;
  }
  cuptiActivityRegisterCallbacks(give_buffer, take_buffer);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
  // Buffers are handed over every 200 ms too: what the program's exit order would lose is little.
  cuptiActivityFlushPeriod(200);
}

__attribute__((destructor)) void stop_tracing() {
  if (trace_file == nullptr) return;
  cuptiActivityFlushAll(1);
  std::lock_guard<std::mutex> lock(trace_mutex);
  std::fclose(trace_file);
  trace_file = nullptr;
}

}  // namespace
