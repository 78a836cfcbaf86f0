// TSan builds only: makes Debian's (uninstrumented) abseil synchronization
// visible to ThreadSanitizer.
//
// Why: absl::Mutex, absl::CondVar and absl::Notification live in
// libabsl_synchronization.so, which Debian compiles without -fsanitize=thread.
// Their lock words are plain atomics and futex syscalls that TSan never sees,
// so every access to ABSL_GUARDED_BY data from two threads is reported as a
// race although both accesses hold the same mutex (e.g. metrics::Family::With
// under //common:metrics_test). gRPC 1.51 locks with absl::Mutex too. A
// suppression would hide real races on that data as well; instead this file
// defines the public entry points in the executable (which interposes them on
// the library's, for every caller), forwards to the library's definitions
// through dlsym(RTLD_NEXT) and tells TSan the happens-before edge each one
// implies:
//   lock (all forms, when acquired)          -> __tsan_acquire(mutex)
//   unlock                                   -> __tsan_release(mutex)
//   Await, CondVar::Wait (unlock + relock)   -> release before, acquire after
//   CondVar::Signal/SignalAll, Wait return   -> release/acquire on the CondVar
//   Notification::Notify, WaitForNotification* and the inline
//     HasBeenNotified() (an acquire load of notified_yet_, see below)
// Races on the data itself (an access without the lock) are still reported.
// A library without one of these symbols aborts with a clear message rather
// than running unannotated.
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

extern "C" {
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
}

namespace {

#define PS_STR2(x) #x
#define PS_STR(x) PS_STR2(x)

// "_ZN4absl<len><inline namespace>" + rest: the mangled name of an
// absl:: member, whatever Debian's inline namespace is called.
std::string Mangled(const char* prefix, const char* rest) {
  const std::string ns = PS_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string(prefix) + "4absl" + std::to_string(ns.size()) + ns + rest;
}

template <typename Fn>
Fn Real(const char* prefix, const char* rest) {
  const std::string name = Mangled(prefix, rest);
  void* sym = dlsym(RTLD_NEXT, name.c_str());
  if (sym == nullptr) {
    std::fprintf(stderr,
                 "tsan_absl_sync: %s not found in the abseil libraries; "
                 "tests/sanitizers/tsan_absl_sync.cc needs updating\n",
                 name.c_str());
    std::abort();
  }
  return reinterpret_cast<Fn>(sym);
}

// absl::Notification's flag: the inline HasBeenNotified() is compiled into
// our (instrumented) code as an acquire load of notified_yet_, which follows
// the Mutex member. A release on that address is what the load syncs with.
void* NotifiedFlag(const absl::Notification* n) {
  return const_cast<char*>(reinterpret_cast<const char*>(n)) +
         sizeof(absl::Mutex);
}

// A Condition is evaluated inside the library with the mutex held, by the
// waiter or by whichever thread is unlocking: its reads of guarded data need
// the mutex's happens-before edges too. Wrapped in acquire/release of the
// mutex around the caller's condition. The Guarded record (and the
// caller's Condition) sit on the waiter's stack and reach an unlocking thread
// through the library's waiter queue, which TSan cannot see either: the
// waiter releases on the record's address once it is filled in, and every
// evaluation acquires it before reading it.
struct Guarded {
  const absl::Condition* cond;
  void* mu;
};
bool EvalGuarded(void* arg) {
  __tsan_acquire(arg);
  const Guarded* g = static_cast<const Guarded*>(arg);
  __tsan_acquire(g->mu);
  const bool r = g->cond->Eval();
  __tsan_release(g->mu);
  return r;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using Cond = const Condition&;
// The caller's condition `c` of mutex `mu`, annotated (see Guarded).
#define PS_GUARDED(c, mu)                        \
  Guarded guarded{&(c), (mu)};                   \
  __tsan_release(&guarded);                      \
  const Condition wrapped(&EvalGuarded, &guarded)

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN", "5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN", "5Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}

void Mutex::LockWhen(Cond c) {
  static auto real =
      Real<void (*)(Mutex*, Cond)>("_ZN", "5Mutex8LockWhenERKNS0_9ConditionE");
  PS_GUARDED(c, this);
  real(this, wrapped);
  __tsan_acquire(this);
}

void Mutex::ReaderLockWhen(Cond c) {
  static auto real = Real<void (*)(Mutex*, Cond)>(
      "_ZN", "5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  PS_GUARDED(c, this);
  real(this, wrapped);
  __tsan_acquire(this);
}

bool Mutex::LockWhenWithTimeout(Cond c, Duration d) {
  static auto real = Real<bool (*)(Mutex*, Cond, Duration)>(
      "_ZN", "5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  PS_GUARDED(c, this);
  const bool r = real(this, wrapped, d);
  __tsan_acquire(this);  // held on return either way
  return r;
}

bool Mutex::LockWhenWithDeadline(Cond c, Time t) {
  static auto real = Real<bool (*)(Mutex*, Cond, Time)>(
      "_ZN", "5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  PS_GUARDED(c, this);
  const bool r = real(this, wrapped, t);
  __tsan_acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(Cond c, Duration d) {
  static auto real = Real<bool (*)(Mutex*, Cond, Duration)>(
      "_ZN",
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  PS_GUARDED(c, this);
  const bool r = real(this, wrapped, d);
  __tsan_acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(Cond c, Time t) {
  static auto real = Real<bool (*)(Mutex*, Cond, Time)>(
      "_ZN", "5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  PS_GUARDED(c, this);
  const bool r = real(this, wrapped, t);
  __tsan_acquire(this);
  return r;
}

void Mutex::Await(Cond c) {
  static auto real =
      Real<void (*)(Mutex*, Cond)>("_ZN", "5Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  PS_GUARDED(c, this);
  real(this, wrapped);
  __tsan_acquire(this);
}

bool Mutex::AwaitWithTimeout(Cond c, Duration d) {
  static auto real = Real<bool (*)(Mutex*, Cond, Duration)>(
      "_ZN", "5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  PS_GUARDED(c, this);
  const bool r = real(this, wrapped, d);
  __tsan_acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(Cond c, Time t) {
  static auto real = Real<bool (*)(Mutex*, Cond, Time)>(
      "_ZN", "5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  PS_GUARDED(c, this);
  const bool r = real(this, wrapped, t);
  __tsan_acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  static auto real =
      Real<void (*)(CondVar*, Mutex*)>("_ZN", "7CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(this);
  __tsan_acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration d) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "_ZN", "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool r = real(this, mu, d);
  __tsan_acquire(this);
  __tsan_acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time t) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, Time)>(
      "_ZN", "7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool r = real(this, mu, t);
  __tsan_acquire(this);
  __tsan_acquire(mu);
  return r;
}

void CondVar::Signal() {
  static auto real = Real<void (*)(CondVar*)>("_ZN", "7CondVar6SignalEv");
  __tsan_release(this);
  real(this);
}

void CondVar::SignalAll() {
  static auto real = Real<void (*)(CondVar*)>("_ZN", "7CondVar9SignalAllEv");
  __tsan_release(this);
  real(this);
}

void Notification::Notify() {
  static auto real =
      Real<void (*)(Notification*)>("_ZN", "12Notification6NotifyEv");
  __tsan_release(this);
  __tsan_release(NotifiedFlag(this));
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = Real<void (*)(const Notification*)>(
      "_ZNK", "12Notification19WaitForNotificationEv");
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration d) const {
  static auto real = Real<bool (*)(const Notification*, Duration)>(
      "_ZNK", "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool r = real(this, d);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time t) const {
  static auto real = Real<bool (*)(const Notification*, Time)>(
      "_ZNK", "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool r = real(this, t);
  if (r) __tsan_acquire(const_cast<Notification*>(this));
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
