#include "runtime/stop_signal.h"

#include <signal.h>

#include <atomic>

namespace loom::runtime {
namespace {

std::atomic<int> g_stop_signal{0};  // written by a signal handler: lock-free, process-wide

void on_stop_signal(int signal) {
  if (g_stop_signal.exchange(signal) != 0) {  // asked twice: stop now
    ::signal(signal, SIG_DFL);
    ::raise(signal);
  }
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int stop_signal() { return g_stop_signal.load(); }

void set_stop_signal(int signal) { g_stop_signal.store(signal); }

}  // namespace loom::runtime
