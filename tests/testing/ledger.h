// Exactly-once checks on a running job, as tests/replication_test.cc does
// them: pushers (tests/replication_pusher) push integer gradients to the
// keys 0..N-1 of a sparse SGD table (dim 1, learning rate 1, zero initial
// values: every sum is exact) and keep a ledger of what was acknowledged;
// at the end a fresh kv_tool reads every key back (--finish: the job ends)
// and every key must equal exactly minus the sum of its acknowledged
// gradients: no acknowledged push lost, none applied twice.
//
// The job's config must have such a table and room for `pushers` workers
// (cluster.num_workers); the pushers are its workers. Their files go to
// Options::dir: pusher<i>.out/.log, ledger<i>, progress<i>, stop, and
// reader.out/.log.
//
// Not thread-safe. Destroying it SIGKILLs pushers still running.
#ifndef PS_TESTS_TESTING_LEDGER_H_
#define PS_TESTS_TESTING_LEDGER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/status.h"
#include "tests/testing/job_harness.h"
#include "tests/testing/subprocess.h"

namespace ps::testing {

class LedgerPushers {
 public:
  struct Options {
    std::string dir;
    std::string config_path;        // the job's textproto
    std::string scheduler_address;  // host:port
    std::string table = "sgd";
    int pushers = 2;
    int keys = 2000;
    // Pusher i gets seed * 10 + i.
    uint64_t seed = 1;
    // Each push spans every server (tests/replication_pusher --mixed)
    // instead of carrying one server's keys.
    bool mixed = false;
    // Each pusher ends a step after every this many pushes
    // (tests/replication_pusher --clock_every); 0: never.
    int clock_every = 0;
    // Binaries, as Runfile() paths.
    std::string pusher_binary = "tests/replication_pusher";
    std::string reader_binary = "worker/kv_tool";
    // An argv prefix for the process named `name` ("pusher<i>", "reader"),
    // e.g. a NetworkLab's ExecPrefix to run it in a network namespace;
    // unset or empty = none.
    std::function<std::vector<std::string>(const std::string& name)> wrap;
  };

  // An acknowledged push, from a pusher's ledger: the server group (rank)
  // its keys belong to, when it was issued and when it was acknowledged
  // (Unix microseconds).
  struct Ack {
    uint32_t group = 0;
    int64_t issue_us = 0;
    int64_t ack_us = 0;
  };

  // What StopAndVerify found.
  struct Verdict {
    // Empty when the ledger holds (and every pusher and the reader exited 0).
    std::vector<std::string> problems;
    size_t acknowledged = 0;  // pushes acknowledged, all pushers together
    // Each of them, pusher by pusher.
    std::vector<Ack> acks;
  };

  // Options for pushers into `job`: its directory (for their files), its
  // job.pbtxt and its scheduler; pusher seeds from `seed`; the rest as
  // above.
  static Options ForJob(const JobHarness& job, uint64_t seed);

  // Starts the pushers and waits (up to `timeout`, scaled) until each had
  // 100 pushes acknowledged.
  static absl::StatusOr<LedgerPushers> Start(Options options, absl::Duration timeout);

  LedgerPushers(LedgerPushers&&) = default;
  LedgerPushers& operator=(LedgerPushers&&) = default;

  Subprocess& pusher(int i) { return pushers_[i]; }

  // Stops the pushers, reads their ledgers and reads every key back with a
  // kv_tool that finishes the job; compares.
  Verdict StopAndVerify();

  // Stops the pushers without ending the job (they leave unfinished, their
  // ledgers complete) and waits for them to exit; INTERNAL naming the first
  // that did not exit 0. StopAndVerify may follow (it finds them exited).
  absl::Status Stop();

 private:
  LedgerPushers() = default;
  Options options_;
  std::vector<Subprocess> pushers_;
};

// The sum of the acknowledged gradients of each key 0..keys-1 over the
// ledgers dir/ledger0 .. dir/ledger<pushers-1> ("sum KEY SUM" lines) of
// pushers that have exited: the value such a key must hold is minus it.
// NOT_FOUND for a missing ledger, INVALID_ARGUMENT for a key out of range.
absl::StatusOr<std::vector<double>> LedgerSums(const std::string& dir,
                                               int pushers, int keys);

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_LEDGER_H_
