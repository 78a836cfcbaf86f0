// A private network of Linux network namespaces for network-fault tests:
// partitions (nftables drop rules) and slow links (tc tbf) between the
// processes of a job, without touching the host's network.
//
// Layout: every node is a named namespace "pn<pid>x<random>-<lab>-<i>"
// with loopback up
// and one veth onto a bridge in the hub; the nodes have the addresses
// 10.<a>.<b>.1, .2, ... of a /24 derived from this process's pid (so two
// concurrent tests pick different ones, though each lab is private anyway)
// and the bridge has .254. The hub is this process's own network namespace
// after EnterPrivateNetwork() (then this process reaches every node, e.g.
// a test's gRPC stub the scheduler); without it, a named namespace
// "...-h" that only the nodes reach.
//
// Faults act inside the node namespaces, so traffic between the hub (the
// test itself) and a node is never cut:
//  - Partition(a, b, kAtoB) drops, in a's namespace, every packet a sends
//    to b (an `inet pslab` table with an output chain and a set of blocked
//    destination addresses); kBoth also drops what b sends to a. Over TCP
//    a one-way drop stops the handshake either way; UDP shows the
//    difference.
//  - LimitBandwidth(name, ...) puts a tc token bucket (tbf) on both ends of
//    the node's veth, so the node sends and receives at most `rate`.
//
// Requirements: root (CAP_NET_ADMIN and CAP_SYS_ADMIN), `ip` (iproute2),
// `nft` (nftables) and `tc`; Unavailable() says what is missing so a test
// can skip. Every failed command comes back as an error naming the command
// and its output.
//
// Thread safety: a NetworkLab is not thread-safe; use it from one thread.
// Destroying it deletes every namespace it made (and with them the veths,
// rules and qdiscs); processes still running in one keep it alive until
// they exit. Create() first deletes namespaces left behind by crashed runs:
// a process making labs holds an flock on /run/pslab/<its prefix>.lock for
// its lifetime, and namespaces whose prefix's lock is free are stale.
//
// Bazel: a test using the lab needs tags = ["no-sandbox"] (the sandbox
// mounts /run read-only and gives the test a pid namespace).
#ifndef PS_TESTS_TESTING_NETNS_H_
#define PS_TESTS_TESTING_NETNS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"

namespace ps::testing {

class NetworkLab {
 public:
  enum class Direction {
    kBoth,  // neither reaches the other
    kAtoB,  // packets from a to b are dropped; b to a pass
    kBtoA,  // packets from b to a are dropped; a to b pass
  };

  // Moves this process into a new, empty network namespace of its own
  // (loopback up) that becomes the hub of every lab it creates, so the
  // process reaches every node's address. Call it from main() before any
  // thread starts: a namespace switch affects only the calling thread, and
  // threads started later (gRPC's) inherit it. Error (and nothing changed)
  // when not permitted; calling it again is a no-op.
  static absl::Status EnterPrivateNetwork();
  // Whether EnterPrivateNetwork() succeeded.
  static bool InPrivateNetwork();

  // Why a lab cannot be created here: "" when it can, else e.g. "not
  // root" or "`nft` not found". Cheap; what tests check to skip.
  static std::string Unavailable();

  // Creates one namespace per name (names distinct, at most 200 nodes),
  // each with its address, and the bridge joining them.
  static absl::StatusOr<std::unique_ptr<NetworkLab>> Create(
      std::vector<std::string> node_names);

  NetworkLab(const NetworkLab&) = delete;
  NetworkLab& operator=(const NetworkLab&) = delete;
  ~NetworkLab();

  // The node's IPv4 address ("10.123.45.1"); "" for an unknown name.
  std::string Address(const std::string& name) const;
  // The bridge's address: this process's, when InPrivateNetwork().
  std::string HubAddress() const { return subnet_ + "254"; }
  // Whether this process is on the hub (reaches the nodes).
  bool reachable_from_here() const { return hub_ns_.empty(); }
  // The node's namespace name; "" for an unknown name.
  std::string Namespace(const std::string& name) const;
  // argv prefix that runs a command in the node's namespace:
  // {"/usr/bin/ip", "netns", "exec", <namespace>} (ip's full path; the
  // command itself is searched in $PATH, so give it as a full path).
  // Empty for an unknown name.
  std::vector<std::string> ExecPrefix(const std::string& name) const;

  // Drops traffic between a and b in `direction` (adds to what is already
  // blocked). NOT_FOUND for an unknown name.
  absl::Status Partition(const std::string& a, const std::string& b,
                         Direction direction = Direction::kBoth);
  // Cuts `name` off from every other node, both ways (the hub still
  // reaches it). What `name` receives from all of them is dropped from one
  // moment on (one nft command in its namespace), as when its link goes
  // down: a sequence of Partition calls would silence the others one by
  // one, tens of milliseconds apart. NOT_FOUND for an unknown name.
  absl::Status Isolate(const std::string& name);
  // Lets traffic between a and b pass again, both ways.
  absl::Status Heal(const std::string& a, const std::string& b);
  // Lifts every partition.
  absl::Status HealAll();

  // Limits what the node sends and what it receives to `rate` each (tc
  // rate syntax: "2mbit", "500kbit"), with a bucket of `burst` ("32kbit")
  // and packets queued at most `latency` before being dropped.
  absl::Status LimitBandwidth(const std::string& name, const std::string& rate,
                              const std::string& burst = "32kbit",
                              const std::string& latency = "400ms");
  // Removes the node's limits (no-op without any); every node's.
  absl::Status ClearLimits(const std::string& name);
  absl::Status ClearLimits();

  // Packet counters kept by the node's nftables table since Create().
  struct Counters {
    uint64_t dropped = 0;       // sent packets dropped by partitions
    uint64_t udp_received = 0;  // UDP packets that arrived (input hook)
  };
  absl::StatusOr<Counters> GetCounters(const std::string& name);

  // Packets dropped by the node's bandwidth limit (tbf) on what it sends
  // and what it receives together.
  absl::StatusOr<uint64_t> LimitDrops(const std::string& name);

  // Runs `argv` (no shell), waiting for it; its stdout and stderr together
  // on success, else an error with the command, its exit status and its
  // output. Used for every command the lab runs; public for tests.
  static absl::StatusOr<std::string> Run(const std::vector<std::string>& argv);

  // Deletes the namespaces of labs whose process is gone; how many.
  static int CleanStale();

 private:
  struct Node {
    std::string name;
    std::string ns;       // "pn<pid>-<i>"
    std::string address;  // subnet_ + (i + 1)
    std::string hub_if;   // veth end on the bridge
    std::string node_if;  // veth end in the node
  };

  NetworkLab() = default;
  absl::StatusOr<const Node*> Find(const std::string& name) const;
  // argv prefix of `ip` acting in the hub.
  std::vector<std::string> HubIp() const;
  absl::Status Setup(const std::vector<std::string>& names);
  absl::Status Block(const Node& from, const Node& to);
  absl::Status Unblock(const Node& from, const Node& to);

  int number_ = 0;      // labs this process made before this one
  std::string prefix_;  // "pn<pid>x<random>-<number>"
  std::string subnet_;  // "10.a.b."
  std::string hub_ns_;  // "" when the hub is this process's namespace
  std::string bridge_;
  std::vector<Node> nodes_;
  std::vector<std::string> created_ns_;  // deleted by the destructor
};

}  // namespace ps::testing

#endif  // PS_TESTS_TESTING_NETNS_H_
