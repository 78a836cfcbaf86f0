// The scheduler's side of the workers' all-reduce ring for dense tables
// with sync: ALLREDUCE (worker/dense_ring.h): which workers form the ring,
// and the rendezvous store its members connect through. Membership already
// lives in the scheduler, so the ring needs no other service.
//
// Generations. A generation is one fixed, ordered set of members; a new one
// forms when a worker asks to join (a new or replacement worker, or one
// that got training work again), when a member leaves (no work left, or it
// exits), or when a member's collective failed (a peer died or hung) and it
// asks to join again. A formation waits until every member of the current
// generation that is still a live worker has asked to join, so members
// that have not noticed yet are told through Watch; a member that died is
// dropped once the scheduler declares it dead (cluster.heartbeat_timeout_ms),
// which bounds how long the others wait. Generation numbers start at the
// scheduler's start time in ms and only grow, so a restarted scheduler
// never hands out a generation a worker still holds.
//
// The store holds the keys gloo's connectFullMesh exchanges, "<generation>/
// <key>", for the current generation only (older ones are dropped when a
// generation forms); at most kMaxStoreBytes in all.
//
// Nothing here is journaled: after a scheduler restart the members' next
// Watch tells them to join again, and the ring forms anew.
//
// Thread safety: every method may be called from any thread (the gRPC
// service's); blocking calls wait at most their timeout (capped at 30 s)
// and return early on Close().
#ifndef PS_SCHEDULER_RING_REGISTRY_H_
#define PS_SCHEDULER_RING_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "proto/scheduler.pb.h"

namespace ps {

class RingRegistry {
 public:
  static constexpr size_t kMaxStoreBytes = 8 << 20;
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kMaxValueBytes = 64 << 10;

  // `is_live_worker(node_id)`: whether the node is a registered worker that
  // has not left or been declared dead (ClusterState). Called with this
  // registry's lock held, so it must not call back into the registry.
  // `first_generation`: the generation before the first one formed (the
  // scheduler passes its start time in ms).
  // `live_workers()`: how many live workers the job has (caps the
  // min_members a caller asks for). Same rules as is_live_worker.
  RingRegistry(std::function<bool(uint64_t)> is_live_worker,
               std::function<size_t()> live_workers, uint64_t first_generation);
  RingRegistry(const RingRegistry&) = delete;
  RingRegistry& operator=(const RingRegistry&) = delete;

  // Joins the next generation and waits until it forms (JoinRingRequest:
  // min_members, after_generation). Not formed within `timeout`: an answer
  // with formed false (the caller stays asked: calling again waits for the
  // same formation). NOT_FOUND for a caller that is not a live worker;
  // UNAVAILABLE after Close().
  absl::StatusOr<JoinRingResponse> Join(uint64_t node_id, uint32_t min_members,
                                        uint64_t after_generation,
                                        absl::Duration timeout);
  // Leaves the ring; the remaining members form a new generation. Leaving
  // twice, or without having joined, is OK.
  absl::Status Leave(uint64_t node_id);
  // Whether the caller, a member of `generation`, must join again: a new
  // generation is forming, or `generation` is not current, or it does not
  // hold the caller. Waits up to `timeout` for that to become true.
  absl::StatusOr<bool> Watch(uint64_t node_id, uint64_t generation,
                             absl::Duration timeout);
  // RingStoreRequest: sets a key, and/or waits for keys and returns their
  // values (see the proto). Errors as the class comment and
  // Scheduler.RingStore say.
  absl::StatusOr<RingStoreResponse> Store(const RingStoreRequest& request,
                                          absl::Duration timeout);
  // Wakes every waiter; later blocking calls fail with UNAVAILABLE.
  void Close();

  // For tests and /status: the current generation and its members.
  uint64_t generation() const;
  std::vector<uint64_t> members() const;

 private:
  // Drops members that are no longer live workers from a formation in
  // progress and forms the generation once every expected node has asked.
  void TryFormLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a formation expecting the current live members (no-op while one
  // is in progress).
  void StartFormingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to a member of the current generation.
  JoinRingResponse FormedLocked(uint64_t node_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The generation number a store key names; INVALID_ARGUMENT when it has
  // none or names another generation than the current one.
  absl::StatusOr<uint64_t> KeyGeneration(const std::string& key) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<bool(uint64_t)> is_live_worker_;
  const std::function<size_t()> live_workers_;
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> members_ ABSL_GUARDED_BY(mu_);
  bool forming_ ABSL_GUARDED_BY(mu_) = false;
  // While forming: the nodes whose join the formation waits for, and those
  // that have asked.
  absl::flat_hash_set<uint64_t> expected_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> waiting_ ABSL_GUARDED_BY(mu_);
  // The largest min_members of the formation's callers.
  uint32_t min_members_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, std::string> store_ ABSL_GUARDED_BY(mu_);
  size_t store_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ps

#endif  // PS_SCHEDULER_RING_REGISTRY_H_
