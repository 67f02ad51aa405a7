// Graceful shutdown on SIGINT/SIGTERM for the servers (serve, the router): the signals are taken by
// sigwait on the main thread, not by a handler, so they must be blocked before any thread starts (every
// thread inherits the mask). SIGPIPE is ignored: a client gone mid-write must not kill the process.
#pragma once

#include <signal.h>

namespace slimkv {

// Call first, before any thread starts; returns the set to wait on.
sigset_t block_stop_signals();
// Waits for SIGINT or SIGTERM; returns its name.
const char* wait_for_stop_signal(const sigset_t& stop_signals);

}  // namespace slimkv
