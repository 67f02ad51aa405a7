// Times one variant with Google Benchmark (warm-up, repetitions until a minimum time, real time)
// and returns ms per run, so a benchmark can print its variants side by side with their ratios.
#pragma once

#include <benchmark/benchmark.h>

#include <functional>
#include <string>
#include <vector>

namespace slimkv {

class LastRunReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& run : runs) {
      if (run.run_type == Run::RT_Iteration) ms_per_run = run.GetAdjustedRealTime();
    }
  }
  double ms_per_run = 0;
};

inline double measure_ms(const std::string& name, const std::function<void()>& run, double min_seconds = 0.5) {
  benchmark::ClearRegisteredBenchmarks();
  benchmark::RegisterBenchmark(name.c_str(), [&](benchmark::State& state) {
    for (auto _ : state) run();
  })->Unit(benchmark::kMillisecond)->MinTime(min_seconds)->UseRealTime();
  LastRunReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  return reporter.ms_per_run;
}

}  // namespace slimkv
