#include "common/signals.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>

namespace ps {
namespace {

// The thread that sigwait()s, for ForwardToWaiter. One TerminationSignals
// per process.
pthread_t waiter;
std::atomic<bool> waiter_set{false};

// Threads that libraries start before main() (OpenBLAS starts its pool
// from a constructor) do not have the signals blocked, so the kernel may
// deliver SIGINT/SIGTERM to one of them, whose default action would end
// the process at once. This handler runs there instead and sends the
// signal on to the waiting thread, which has it blocked: it stays pending
// there until sigwait() takes it. pthread_kill is async-signal-safe
// (POSIX.1-2008 TC1).
void ForwardToWaiter(int sig) {
  if (waiter_set.load()) pthread_kill(waiter, sig);
}

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
  waiter = thread_.native_handle();
  waiter_set.store(true);
  struct sigaction forward = {};
  forward.sa_handler = ForwardToWaiter;
  sigemptyset(&forward.sa_mask);
  forward.sa_flags = SA_RESTART;
  sigaction(SIGINT, &forward, nullptr);
  sigaction(SIGTERM, &forward, nullptr);
}

void TerminationSignals::RequestTermination() {
  // Sent to the waiting thread, which has SIGTERM blocked: it stays pending
  // until sigwait() takes it, as a real one would.
  pthread_kill(thread_.native_handle(), SIGTERM);
}

TerminationSignals::~TerminationSignals() {
  // Back to the default actions before the waiter goes away.
  ::signal(SIGINT, SIG_DFL);
  ::signal(SIGTERM, SIG_DFL);
  waiter_set.store(false);
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace ps
