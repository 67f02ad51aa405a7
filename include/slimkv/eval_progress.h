// Progress of a long run on stderr: a bar redrawn in place when stderr is a terminal, plain lines
// (a step's start, every tenth of it, its end) when it is a file or a pipe, so logs stay readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace slimkv {

class Progress {
 public:
  // interactive: redraw a bar (a terminal); otherwise print lines. nullptr stream: silent.
  Progress(std::FILE* stream, bool interactive) : stream_(stream), interactive_(interactive) {}
  static Progress for_stderr();  // interactive when stderr is a terminal
  static Progress silent() { return Progress(nullptr, false); }

  void start(const std::string& label, int64_t total_units);
  void advance(int64_t units = 1);
  void finish();

 private:
  void draw();
  std::FILE* stream_;
  bool interactive_;
  std::string label_;
  int64_t total_ = 0, done_ = 0;
  int last_tenth_ = 0;
  std::chrono::steady_clock::time_point started_, last_draw_;
};

}  // namespace slimkv
