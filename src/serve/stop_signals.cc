#include "serve/stop_signals.h"

#include <pthread.h>

namespace slimkv {

sigset_t block_stop_signals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return stop_signals;
}

const char* wait_for_stop_signal(const sigset_t& stop_signals) {
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  return signal_number == SIGINT ? "SIGINT" : "SIGTERM";
}

}  // namespace slimkv
