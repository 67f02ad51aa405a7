#include "slimkv/eval_progress.h"

#include <unistd.h>

#include <algorithm>

namespace slimkv {

Progress Progress::for_stderr() { return Progress(stderr, isatty(fileno(stderr)) != 0); }

void Progress::start(const std::string& label, int64_t total_units) {
  label_ = label;
  total_ = std::max<int64_t>(total_units, 1);
  done_ = 0;
  last_tenth_ = 0;
  started_ = last_draw_ = std::chrono::steady_clock::now();
  if (!stream_) return;
  if (interactive_) {
    draw();
  } else {
    std::fprintf(stream_, "eval: %s ...\n", label_.c_str());
  }
}

void Progress::advance(int64_t units) {
  done_ = std::min(done_ + units, total_);
  if (!stream_) return;
  if (interactive_) {
    // Redrawing costs a write; ten a second is smooth enough.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_draw_ > std::chrono::milliseconds(100)) {
      last_draw_ = now;
      draw();
    }
    return;
  }
  // A line per tenth done, but not more than one every few seconds: logs stay short.
  const int tenth = int(done_ * 10 / total_);
  const auto now = std::chrono::steady_clock::now();
  if (tenth > last_tenth_ && tenth < 10 && now - last_draw_ > std::chrono::seconds(5)) {
    last_tenth_ = tenth;
    last_draw_ = now;
    std::fprintf(stream_, "eval: %s %d%%\n", label_.c_str(), tenth * 10);
  }
}

void Progress::finish() {
  if (!stream_) return;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  if (interactive_) {
    done_ = total_;
    draw();
    std::fprintf(stream_, " %.1f s\n", seconds);
  } else {
    std::fprintf(stream_, "eval: %s done in %.1f s\n", label_.c_str(), seconds);
  }
  std::fflush(stream_);
}

void Progress::draw() {
  constexpr int kWidth = 30;
  const int filled = int(done_ * kWidth / total_);
  std::fprintf(stream_, "\r\033[K[%s%s] %3d%% %s", std::string(size_t(filled), '#').c_str(),
               std::string(size_t(kWidth - filled), ' ').c_str(), int(done_ * 100 / total_), label_.c_str());
  std::fflush(stream_);
}

}  // namespace slimkv
