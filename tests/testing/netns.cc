#include "tests/testing/netns.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace ps::testing {
namespace {

// Set once by EnterPrivateNetwork (main thread, before others exist).
std::atomic<bool> in_private_network{false};
// Labs made by this process so far: part of every name, so a lab made
// while an earlier one is still being torn down never collides with it.
std::atomic<int> labs_created{0};

constexpr char kNetnsDir[] = "/run/netns";
constexpr char kLockDir[] = "/run/pslab";
constexpr char kTable[] = "pslab";

// $PATH with the usual sbin directories added: bazel's test environment
// (--incompatible_strict_action_env) has only /bin:/usr/bin, and nft and
// tc live in /usr/sbin.
std::string SearchPath() {
  const char* path = std::getenv("PATH");
  return absl::StrCat(path != nullptr ? path : "",
                      ":/usr/sbin:/sbin:/usr/bin:/bin");
}

// The full path of `tool` (in SearchPath()), or "" if none.
std::string Which(const std::string& tool) {
  if (tool.find('/') != std::string::npos) return tool;
  for (absl::string_view dir :
       absl::StrSplit(SearchPath(), ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", tool);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The single number after `label ` in `text` (e.g. "packets 12"), summed
// over every occurrence; nullopt-as-error when there is none.
absl::StatusOr<uint64_t> SumAfter(const std::string& text,
                                  const std::string& label) {
  const std::regex re(label + " ([0-9]+)");
  uint64_t total = 0;
  bool found = false;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end;
       ++it) {
    uint64_t v = 0;
    if (!absl::SimpleAtoi((*it)[1].str(), &v)) continue;
    total += v;
    found = true;
  }
  if (!found) {
    return absl::InternalError(absl::StrCat("no '", label, " N' in: ", text));
  }
  return total;
}

}  // namespace

absl::StatusOr<std::string> NetworkLab::Run(
    const std::vector<std::string>& argv) {
  if (argv.empty()) return absl::InvalidArgumentError("empty command");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", strerror(errno)));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  const std::string binary = Which(argv[0]);
  std::vector<char*> args;
  for (const std::string& a : argv)
    args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // Children (`ip netns exec NS nft ...`) search the same extended PATH.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "PATH=", 5) != 0) env_strings.push_back(*e);
  }
  env_strings.push_back("PATH=" + SearchPath());
  std::vector<char*> env;
  for (std::string& e : env_strings) env.push_back(e.data());
  env.push_back(nullptr);
  pid_t pid = -1;
  const int rc = binary.empty() ? ENOENT
                                : posix_spawn(&pid, binary.c_str(), &actions,
                                              nullptr, args.data(), env.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  const std::string command = absl::StrJoin(argv, " ");
  if (rc != 0) {
    close(fds[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run `", command, "`: ", strerror(rc)));
  }
  std::string output;
  char buf[4096];
  while (true) {
    const ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n > 0) {
      output.append(buf, n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return output;
  const std::string how =
      WIFEXITED(status) ? absl::StrCat("exit status ", WEXITSTATUS(status))
                        : absl::StrCat("signal ", WTERMSIG(status));
  return absl::InternalError(
      absl::StrCat("`", command, "` failed (", how, "): ", output));
}

absl::Status NetworkLab::EnterPrivateNetwork() {
  if (in_private_network) return absl::OkStatus();
  if (std::string why = Unavailable(); !why.empty()) {
    return absl::FailedPreconditionError(why);
  }
  // Only this thread would move: refuse rather than leave others behind.
  int threads = 0;
  if (DIR* d = opendir("/proc/self/task"); d != nullptr) {
    while (dirent* e = readdir(d)) threads += e->d_name[0] != '.';
    closedir(d);
  }
  if (threads > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("EnterPrivateNetwork: ", threads,
                     " threads run; call it from main() first"));
  }
  if (unshare(CLONE_NEWNET) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("unshare(CLONE_NEWNET): ", strerror(errno)));
  }
  in_private_network = true;
  // `ip` inherits the new namespace.
  auto lo = Run({"ip", "link", "set", "lo", "up"});
  if (!lo.ok()) return lo.status();
  return absl::OkStatus();
}

bool NetworkLab::InPrivateNetwork() { return in_private_network; }

std::string NetworkLab::Unavailable() {
  if (geteuid() != 0) return "not root (network namespaces need CAP_NET_ADMIN)";
  for (const char* tool : {"ip", "nft", "tc"}) {
    if (Which(tool).empty()) {
      return absl::StrCat(
          "`", tool, "` not found (deploy/install_deps.sh installs ",
          std::string(tool) == "nft" ? "nftables" : "iproute2", ")");
    }
  }
  return "";
}

namespace {

// This process's tag, the prefix of every namespace it makes:
// "pn<pid>x<random>" (the pid alone repeats across pid namespaces, e.g.
// bazel's sandboxes). While the process lives it holds an flock on
// kLockDir/<tag>.lock; a lock file whose lock can be taken belongs to a
// process that is gone, and its namespaces are stale. Empty with `error`
// set when the lock file cannot be made.
struct ProcessTag {
  std::string tag;
  std::string error;
};

const ProcessTag& Tag() {
  static const ProcessTag* const tag = [] {
    auto* t = new ProcessTag;
    std::random_device random;
    t->tag = absl::StrFormat("pn%dx%04x", static_cast<int>(getpid()),
                             random() & 0xffff);
    mkdir(kLockDir, 0755);
    // Locked before it appears under its final name, so a cleanup never
    // sees it unlocked.
    const std::string tmp = absl::StrCat(kLockDir, "/.", t->tag);
    const int fd = open(tmp.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (fd < 0 || flock(fd, LOCK_EX) != 0 ||
        rename(tmp.c_str(),
               absl::StrCat(kLockDir, "/", t->tag, ".lock").c_str()) != 0) {
      t->error = absl::StrCat("cannot make the lab's lock file ", tmp, ": ",
                              strerror(errno));
    }
    // fd stays open (and locked) until the process exits.
    return t;
  }();
  return *tag;
}

}  // namespace

int NetworkLab::CleanStale() {
  const std::string own = Tag().tag;
  std::vector<std::string> stale_tags;
  if (DIR* d = opendir(kLockDir); d != nullptr) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name[0] == '.' || !absl::EndsWith(name, ".lock")) continue;
      const std::string tag = name.substr(0, name.size() - 5);
      if (tag == own) continue;
      const std::string path = absl::StrCat(kLockDir, "/", name);
      const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
      if (fd < 0) continue;
      if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
        stale_tags.push_back(tag);
        unlink(path.c_str());
      }
      close(fd);
    }
    closedir(d);
  }
  if (stale_tags.empty()) return 0;
  int removed = 0;
  if (DIR* d = opendir(kNetnsDir); d != nullptr) {
    std::vector<std::string> stale;
    while (dirent* e = readdir(d)) {
      for (const std::string& tag : stale_tags) {
        if (absl::StartsWith(e->d_name, tag + "-")) stale.push_back(e->d_name);
      }
    }
    closedir(d);
    for (const std::string& ns : stale) {
      if (Run({"ip", "netns", "del", ns}).ok()) ++removed;
    }
  }
  return removed;
}

absl::StatusOr<std::unique_ptr<NetworkLab>> NetworkLab::Create(
    std::vector<std::string> node_names) {
  if (std::string why = Unavailable(); !why.empty()) {
    return absl::FailedPreconditionError(why);
  }
  if (node_names.empty() || node_names.size() > 200) {
    return absl::InvalidArgumentError("a lab has 1 to 200 nodes");
  }
  std::set<std::string> distinct(node_names.begin(), node_names.end());
  if (distinct.size() != node_names.size()) {
    return absl::InvalidArgumentError("node names must be distinct");
  }
  if (!Tag().error.empty()) return absl::FailedPreconditionError(Tag().error);
  CleanStale();
  std::unique_ptr<NetworkLab> lab(new NetworkLab());
  const int pid = static_cast<int>(getpid());
  const int k = labs_created++;
  lab->prefix_ = absl::StrCat(Tag().tag, "-", k);
  // 10.<64..223>.<0..255>: from the pid and the lab's number; every lab is
  // private, so this only keeps addresses in logs distinct.
  const uint32_t v =
      static_cast<uint32_t>(pid) * 8 + static_cast<uint32_t>(k % 8);
  lab->subnet_ = absl::StrCat("10.", 64 + (v >> 8) % 160, ".", v & 255, ".");
  if (!in_private_network) lab->hub_ns_ = lab->prefix_ + "-h";
  lab->number_ = k;
  lab->bridge_ = absl::StrCat("pnbr", k % 100000);
  if (absl::Status s = lab->Setup(node_names); !s.ok()) {
    return s;  // the destructor removes what was made
  }
  return lab;
}

std::vector<std::string> NetworkLab::HubIp() const {
  if (hub_ns_.empty()) return {"ip"};
  return {"ip", "-n", hub_ns_};
}

absl::Status NetworkLab::Setup(const std::vector<std::string>& names) {
  auto run = [](std::vector<std::string> argv) { return Run(argv).status(); };
  auto hub = [&](std::vector<std::string> rest) {
    std::vector<std::string> argv = HubIp();
    argv.insert(argv.end(), rest.begin(), rest.end());
    return run(argv);
  };
  if (!hub_ns_.empty()) {
    if (auto s = run({"ip", "netns", "add", hub_ns_}); !s.ok()) return s;
    created_ns_.push_back(hub_ns_);
    if (auto s = hub({"link", "set", "lo", "up"}); !s.ok()) return s;
  }
  if (auto s = hub({"link", "add", bridge_, "type", "bridge"}); !s.ok())
    return s;
  if (auto s = hub({"addr", "add", HubAddress() + "/24", "dev", bridge_});
      !s.ok())
    return s;
  if (auto s = hub({"link", "set", bridge_, "up"}); !s.ok()) return s;
  for (size_t i = 0; i < names.size(); ++i) {
    Node node;
    node.name = names[i];
    node.ns = absl::StrCat(prefix_, "-", i);
    node.address = absl::StrCat(subnet_, i + 1);
    node.hub_if = absl::StrCat("pn", number_ % 100000, "v", i);  // <= 13 chars
    node.node_if = "eth0";
    if (auto s = run({"ip", "netns", "add", node.ns}); !s.ok()) return s;
    created_ns_.push_back(node.ns);
    const std::vector<std::string> in_ns = {"ip", "-n", node.ns};
    auto in = [&](std::vector<std::string> rest) {
      std::vector<std::string> argv = in_ns;
      argv.insert(argv.end(), rest.begin(), rest.end());
      return run(argv);
    };
    // The peer end is created directly in the node's namespace.
    if (auto s = hub({"link", "add", node.hub_if, "type", "veth", "peer",
                      "name", node.node_if, "netns", node.ns});
        !s.ok()) {
      return s;
    }
    if (auto s = hub({"link", "set", node.hub_if, "master", bridge_, "up"});
        !s.ok()) {
      return s;
    }
    if (auto s = in({"link", "set", "lo", "up"}); !s.ok()) return s;
    if (auto s = in({"addr", "add", node.address + "/24", "dev", node.node_if});
        !s.ok()) {
      return s;
    }
    if (auto s = in({"link", "set", node.node_if, "up"}); !s.ok()) return s;
    // Partitions drop on arrival (input), not on sending (output): a drop
    // in the output hook fails the sender's send() at once with EPERM,
    // which a real partition never does; packets must vanish silently.
    // `blocked` holds the sources whose packets are dropped.
    const std::string ruleset = absl::StrCat(
        "add table inet ", kTable, "\n", "add counter inet ", kTable,
        " dropped\n", "add counter inet ", kTable, " udp_in\n", "add set inet ",
        kTable, " blocked { type ipv4_addr; }\n", "add chain inet ", kTable,
        " input { type filter hook input priority -10; policy accept; }\n",
        "add rule inet ", kTable,
        " input ip saddr @blocked counter name dropped drop\n",
        "add rule inet ", kTable,
        " input meta l4proto udp counter name udp_in\n");
    if (auto s = run({"ip", "netns", "exec", node.ns, "nft", ruleset}); !s.ok())
      return s;
    nodes_.push_back(std::move(node));
  }
  return absl::OkStatus();
}

NetworkLab::~NetworkLab() {
  // Deleting a node's namespace deletes its veth pair with it; the bridge
  // lives in the hub (this process's namespace, or a named one deleted
  // last).
  for (auto it = created_ns_.rbegin(); it != created_ns_.rend(); ++it) {
    if (*it == hub_ns_) continue;
    (void)Run({"ip", "netns", "del", *it});
  }
  if (hub_ns_.empty()) {
    (void)Run({"ip", "link", "del", bridge_});
  } else if (!created_ns_.empty() && created_ns_.front() == hub_ns_) {
    (void)Run({"ip", "netns", "del", hub_ns_});
  }
}

absl::StatusOr<const NetworkLab::Node*> NetworkLab::Find(
    const std::string& name) const {
  for (const Node& n : nodes_) {
    if (n.name == name) return &n;
  }
  return absl::NotFoundError(absl::StrCat("no node '", name, "' in the lab"));
}

std::string NetworkLab::Address(const std::string& name) const {
  auto n = Find(name);
  return n.ok() ? (*n)->address : "";
}

std::string NetworkLab::Namespace(const std::string& name) const {
  auto n = Find(name);
  return n.ok() ? (*n)->ns : "";
}

std::vector<std::string> NetworkLab::ExecPrefix(const std::string& name) const {
  auto n = Find(name);
  if (!n.ok()) return {};
  return {Which("ip"), "netns", "exec", (*n)->ns};
}

absl::Status NetworkLab::Block(const Node& from, const Node& to) {
  // Dropped where they arrive: in `to`'s namespace, by source address.
  auto s = Run({"ip", "netns", "exec", to.ns, "nft", "add", "element", "inet",
                kTable, "blocked", absl::StrCat("{ ", from.address, " }")});
  return s.status();
}

absl::Status NetworkLab::Unblock(const Node& from, const Node& to) {
  auto list = Run({"ip", "netns", "exec", to.ns, "nft", "list", "set", "inet",
                   kTable, "blocked"});
  if (!list.ok()) return list.status();
  // Deleting an element that is not there is an error in nft.
  const std::regex re(
      "[{ ,]" + std::regex_replace(from.address, std::regex("\\."), "\\.") +
      "[ ,}\n]");
  if (!std::regex_search(*list, re)) return absl::OkStatus();
  return Run({"ip", "netns", "exec", to.ns, "nft", "delete", "element", "inet",
              kTable, "blocked", absl::StrCat("{ ", from.address, " }")})
      .status();
}

absl::Status NetworkLab::Partition(const std::string& a, const std::string& b,
                                   Direction direction) {
  auto na = Find(a);
  if (!na.ok()) return na.status();
  auto nb = Find(b);
  if (!nb.ok()) return nb.status();
  if (*na == *nb)
    return absl::InvalidArgumentError("a node cannot be cut from itself");
  if (direction != Direction::kBtoA) {
    if (auto s = Block(**na, **nb); !s.ok()) return s;
  }
  if (direction != Direction::kAtoB) {
    if (auto s = Block(**nb, **na); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NetworkLab::Isolate(const std::string& name) {
  auto node = Find(name);
  if (!node.ok()) return node.status();
  std::vector<std::string> others;
  for (const Node& n : nodes_) {
    if (&n != *node) others.push_back(n.address);
  }
  if (others.empty()) return absl::OkStatus();
  // Everything it receives first, in one command; then what it sends, at
  // each receiver.
  auto in = Run({"ip", "netns", "exec", (*node)->ns, "nft", "add", "element",
                 "inet", kTable, "blocked",
                 absl::StrCat("{ ", absl::StrJoin(others, ", "), " }")});
  if (!in.ok()) return in.status();
  for (const Node& n : nodes_) {
    if (&n == *node) continue;
    if (auto s = Block(**node, n); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status NetworkLab::Heal(const std::string& a, const std::string& b) {
  auto na = Find(a);
  if (!na.ok()) return na.status();
  auto nb = Find(b);
  if (!nb.ok()) return nb.status();
  if (auto s = Unblock(**na, **nb); !s.ok()) return s;
  return Unblock(**nb, **na);
}

absl::Status NetworkLab::HealAll() {
  for (const Node& n : nodes_) {
    auto s = Run({"ip", "netns", "exec", n.ns, "nft", "flush", "set", "inet",
                  kTable, "blocked"});
    if (!s.ok()) return s.status();
  }
  return absl::OkStatus();
}

absl::Status NetworkLab::LimitBandwidth(const std::string& name,
                                        const std::string& rate,
                                        const std::string& burst,
                                        const std::string& latency) {
  auto n = Find(name);
  if (!n.ok()) return n.status();
  const std::vector<std::string> tbf = {"root",  "tbf", "rate",    rate,
                                        "burst", burst, "latency", latency};
  // What the node sends leaves through its own end; what it receives
  // leaves the bridge through the hub's end.
  std::vector<std::string> out = {"ip",      "netns", "exec",
                                  (*n)->ns,  "tc",    "qdisc",
                                  "replace", "dev",   (*n)->node_if};
  out.insert(out.end(), tbf.begin(), tbf.end());
  if (auto s = Run(out); !s.ok()) return s.status();
  std::vector<std::string> in;
  if (!hub_ns_.empty()) in = {"ip", "netns", "exec", hub_ns_};
  in.insert(in.end(), {"tc", "qdisc", "replace", "dev", (*n)->hub_if});
  in.insert(in.end(), tbf.begin(), tbf.end());
  return Run(in).status();
}

absl::Status NetworkLab::ClearLimits(const std::string& name) {
  auto n = Find(name);
  if (!n.ok()) return n.status();
  std::vector<std::string> hub_prefix;
  if (!hub_ns_.empty()) hub_prefix = {"ip", "netns", "exec", hub_ns_};
  const std::vector<std::pair<std::vector<std::string>, std::string>> ends = {
      {{"ip", "netns", "exec", (*n)->ns}, (*n)->node_if},
      {hub_prefix, (*n)->hub_if}};
  for (const auto& [prefix, dev] : ends) {
    std::vector<std::string> show = prefix;
    show.insert(show.end(), {"tc", "qdisc", "show", "dev", dev, "root"});
    auto shown = Run(show);
    if (!shown.ok()) return shown.status();
    // Deleting the default qdisc is an error: only a tbf of ours.
    if (shown->find("tbf") == std::string::npos) continue;
    std::vector<std::string> del = prefix;
    del.insert(del.end(), {"tc", "qdisc", "del", "dev", dev, "root"});
    if (auto s = Run(del); !s.ok()) return s.status();
  }
  return absl::OkStatus();
}

absl::Status NetworkLab::ClearLimits() {
  for (const Node& n : nodes_) {
    if (auto s = ClearLimits(n.name); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<NetworkLab::Counters> NetworkLab::GetCounters(
    const std::string& name) {
  auto n = Find(name);
  if (!n.ok()) return n.status();
  Counters c;
  for (auto [counter, field] :
       {std::pair<const char*, uint64_t*>{"dropped", &c.dropped},
        {"udp_in", &c.udp_received}}) {
    auto text = Run({"ip", "netns", "exec", (*n)->ns, "nft", "list", "counter",
                     "inet", kTable, counter});
    if (!text.ok()) return text.status();
    auto v = SumAfter(*text, "packets");
    if (!v.ok()) return v.status();
    *field = *v;
  }
  return c;
}

absl::StatusOr<uint64_t> NetworkLab::LimitDrops(const std::string& name) {
  auto n = Find(name);
  if (!n.ok()) return n.status();
  std::vector<std::string> hub_tc;
  if (!hub_ns_.empty()) hub_tc = {"ip", "netns", "exec", hub_ns_};
  hub_tc.insert(hub_tc.end(),
                {"tc", "-s", "qdisc", "show", "dev", (*n)->hub_if, "root"});
  uint64_t total = 0;
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{"ip", "netns", "exec", (*n)->ns, "tc", "-s",
                                 "qdisc", "show", "dev", (*n)->node_if, "root"},
        hub_tc}) {
    auto text = Run(argv);
    if (!text.ok()) return text.status();
    auto v = SumAfter(*text, "dropped");
    if (!v.ok()) return v.status();
    total += *v;
  }
  return total;
}

}  // namespace ps::testing
