#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

namespace ps {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // SIGUSR2 is how the destructor wakes the waiting thread; it is blocked
  // before that thread exists so it can never take the default action.
  sigaddset(&set, SIGUSR2);
  return set;
}

}  // namespace

TerminationSignals::TerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  thread_ = std::thread([this] {
    sigset_t wait_set = TerminationSet();
    int sig = 0;
    while (sigwait(&wait_set, &sig) == 0) {
      if (sig == SIGUSR2) return;
      signal_.store(sig);
      if (!notification_.HasBeenNotified()) notification_.Notify();
    }
  });
}

TerminationSignals::~TerminationSignals() {
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace ps
