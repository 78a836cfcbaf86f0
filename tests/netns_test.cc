// The network lab (tests/testing/netns.h) itself: nodes reach each other
// and this process, a partition silences a link and Heal restores it, a
// one-way partition drops one direction only, a bandwidth limit drops what
// exceeds it, and destroying the lab removes its namespaces.
//
// Reachability is probed without listeners: a TCP connect to a closed port
// is answered at once with a reset ("Connection refused") when packets
// flow both ways, and times out when the link is cut. A one-way cut stops
// TCP either way (the answer cannot come back), so the one-way test sends
// UDP and reads the nftables counters of the receiving namespace.
//
// Skips (with the reason) when not root or when ip/nft/tc are missing.
#include "tests/testing/netns.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace ps::testing {
namespace {

enum class Probe { kAnswered, kSilent, kError };

// A TCP connect from `prefix`'s namespace (empty: this process's) to
// port 9 of `address`, given 2 s.
Probe Connect(const std::vector<std::string>& prefix,
              const std::string& address, std::string* detail) {
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(), {"timeout", "2", "bash", "-c",
                           absl::StrCat("exec 3<>/dev/tcp/", address, "/9")});
  auto out = NetworkLab::Run(argv);
  *detail = out.ok() ? *out : std::string(out.status().message());
  if (out.ok() || absl::StrContains(*detail, "Connection refused"))
    return Probe::kAnswered;
  if (absl::StrContains(*detail, "exit status 124")) return Probe::kSilent;
  return Probe::kError;
}

// `n` UDP datagrams from `prefix`'s namespace to port 9999 of `address`.
absl::Status SendUdp(const std::vector<std::string>& prefix,
                     const std::string& address, int n) {
  std::vector<std::string> argv = prefix;
  argv.insert(argv.end(),
              {"bash", "-c",
               absl::StrCat("for i in $(seq ", n, "); do echo x > /dev/udp/",
                            address, "/9999; done")});
  return NetworkLab::Run(argv).status();
}

class NetworkLabTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = NetworkLab::Unavailable(); !why.empty()) {
      GTEST_SKIP() << "no network lab here: " << why;
    }
    auto lab = NetworkLab::Create({"a", "b", "c"});
    ASSERT_TRUE(lab.ok()) << lab.status();
    lab_ = *std::move(lab);
  }

  Probe Between(const std::string& from, const std::string& to) {
    std::string detail;
    Probe p = Connect(lab_->ExecPrefix(from), lab_->Address(to), &detail);
    EXPECT_NE(p, Probe::kError) << from << " -> " << to << ": " << detail;
    return p;
  }

  std::unique_ptr<NetworkLab> lab_;
};

TEST_F(NetworkLabTest, NodesHaveDistinctAddressesAndReachEachOther) {
  EXPECT_NE(lab_->Address("a"), lab_->Address("b"));
  EXPECT_EQ(lab_->Address("nobody"), "");
  EXPECT_TRUE(lab_->ExecPrefix("nobody").empty());
  // Each node's address is on its own interface, in its own namespace.
  auto addr = NetworkLab::Run(
      {"ip", "netns", "exec", lab_->Namespace("a"), "ip", "-br", "addr"});
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_TRUE(absl::StrContains(*addr, lab_->Address("a") + "/24")) << *addr;
  EXPECT_FALSE(absl::StrContains(*addr, lab_->Address("b") + "/24")) << *addr;
  EXPECT_EQ(Between("a", "b"), Probe::kAnswered);
  EXPECT_EQ(Between("b", "c"), Probe::kAnswered);
  // Loopback is up in every node.
  std::string detail;
  EXPECT_EQ(Connect(lab_->ExecPrefix("c"), "127.0.0.1", &detail),
            Probe::kAnswered)
      << detail;
  if (lab_->reachable_from_here()) {
    EXPECT_EQ(Connect({}, lab_->Address("a"), &detail), Probe::kAnswered)
        << detail;
  }
}

TEST_F(NetworkLabTest, PartitionSilencesTheLinkAndHealRestoresIt) {
  ASSERT_EQ(Between("a", "b"), Probe::kAnswered);
  ASSERT_TRUE(lab_->Partition("a", "b").ok());
  EXPECT_EQ(Between("a", "b"), Probe::kSilent);
  EXPECT_EQ(Between("b", "a"), Probe::kSilent);
  // Only that link.
  EXPECT_EQ(Between("a", "c"), Probe::kAnswered);
  EXPECT_EQ(Between("c", "b"), Probe::kAnswered);
  std::string detail;
  if (lab_->reachable_from_here()) {
    EXPECT_EQ(Connect({}, lab_->Address("a"), &detail), Probe::kAnswered)
        << detail;
  }
  auto counters = lab_->GetCounters("b");
  ASSERT_TRUE(counters.ok()) << counters.status();
  EXPECT_GT(counters->dropped, 0u);

  ASSERT_TRUE(lab_->Heal("a", "b").ok());
  EXPECT_EQ(Between("a", "b"), Probe::kAnswered);
  EXPECT_EQ(Between("b", "a"), Probe::kAnswered);
  // Healing what is not cut is fine.
  EXPECT_TRUE(lab_->Heal("a", "c").ok());

  ASSERT_TRUE(lab_->Partition("a", "b").ok());
  ASSERT_TRUE(lab_->Partition("b", "c").ok());
  EXPECT_EQ(Between("c", "b"), Probe::kSilent);
  ASSERT_TRUE(lab_->HealAll().ok());
  EXPECT_EQ(Between("a", "b"), Probe::kAnswered);
  EXPECT_EQ(Between("c", "b"), Probe::kAnswered);

  EXPECT_TRUE(absl::IsNotFound(lab_->Partition("a", "nobody")));
}

TEST_F(NetworkLabTest, IsolateCutsOneNodeFromEveryOtherBothWays) {
  ASSERT_TRUE(lab_->Isolate("a").ok());
  EXPECT_EQ(Between("a", "b"), Probe::kSilent);
  EXPECT_EQ(Between("c", "a"), Probe::kSilent);
  EXPECT_EQ(Between("a", "c"), Probe::kSilent);
  // The others still reach each other, and the hub still reaches it.
  EXPECT_EQ(Between("b", "c"), Probe::kAnswered);
  std::string detail;
  if (lab_->reachable_from_here()) {
    EXPECT_EQ(Connect({}, lab_->Address("a"), &detail), Probe::kAnswered)
        << detail;
  }
  ASSERT_TRUE(lab_->HealAll().ok());
  EXPECT_EQ(Between("a", "b"), Probe::kAnswered);
  EXPECT_EQ(Between("c", "a"), Probe::kAnswered);
  EXPECT_TRUE(absl::IsNotFound(lab_->Isolate("nobody")));
}

TEST_F(NetworkLabTest, OneWayPartitionDropsOnlyThatDirection) {
  ASSERT_TRUE(lab_->Partition("a", "b", NetworkLab::Direction::kAtoB).ok());
  auto a0 = lab_->GetCounters("a");
  auto b0 = lab_->GetCounters("b");
  ASSERT_TRUE(a0.ok() && b0.ok()) << a0.status() << b0.status();
  ASSERT_TRUE(SendUdp(lab_->ExecPrefix("a"), lab_->Address("b"), 5).ok());
  ASSERT_TRUE(SendUdp(lab_->ExecPrefix("b"), lab_->Address("a"), 7).ok());
  auto a1 = lab_->GetCounters("a");
  auto b1 = lab_->GetCounters("b");
  ASSERT_TRUE(a1.ok() && b1.ok()) << a1.status() << b1.status();
  // a -> b: all 5 dropped at b, none received. (`dropped` also counts
  // the ICMP port-unreachable answers a sends to b for the 7, fewer when
  // the kernel rate-limits them.)
  EXPECT_GE(b1->dropped - b0->dropped, 5u);
  EXPECT_EQ(b1->udp_received, b0->udp_received);
  // b -> a: all 7 arrived.
  EXPECT_EQ(a1->udp_received - a0->udp_received, 7u);
  EXPECT_EQ(a1->dropped, a0->dropped);
  // Over TCP the answer cannot come back: silent both ways.
  EXPECT_EQ(Between("a", "b"), Probe::kSilent);
  EXPECT_EQ(Between("b", "a"), Probe::kSilent);

  // The other direction.
  ASSERT_TRUE(lab_->HealAll().ok());
  ASSERT_TRUE(lab_->Partition("a", "b", NetworkLab::Direction::kBtoA).ok());
  auto a2 = lab_->GetCounters("a");
  auto b2 = lab_->GetCounters("b");
  ASSERT_TRUE(SendUdp(lab_->ExecPrefix("a"), lab_->Address("b"), 3).ok());
  ASSERT_TRUE(SendUdp(lab_->ExecPrefix("b"), lab_->Address("a"), 4).ok());
  auto a3 = lab_->GetCounters("a");
  auto b3 = lab_->GetCounters("b");
  ASSERT_TRUE(a2.ok() && b2.ok() && a3.ok() && b3.ok());
  EXPECT_EQ(b3->udp_received - b2->udp_received, 3u);
  EXPECT_GE(a3->dropped - a2->dropped, 4u);
  EXPECT_EQ(a3->udp_received, a2->udp_received);
}

TEST_F(NetworkLabTest, BandwidthLimitDropsWhatExceedsIt) {
  auto none = lab_->LimitDrops("a");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, 0u);
  ASSERT_TRUE(lab_->LimitBandwidth("a", "1mbit", "16kbit", "100ms").ok());
  auto shown = NetworkLab::Run({"ip", "netns", "exec", lab_->Namespace("a"),
                                "tc", "qdisc", "show", "dev", "eth0"});
  ASSERT_TRUE(shown.ok()) << shown.status();
  EXPECT_TRUE(absl::StrContains(*shown, "tbf")) << *shown;
  // 2 MB at once into a 1 mbit link with 100 ms of queue: much of it is
  // dropped (UDP does not wait for the queue). b drops what arrives, so
  // no ICMP port-unreachable makes the sender's next write fail.
  ASSERT_TRUE(lab_->Partition("a", "b", NetworkLab::Direction::kAtoB).ok());
  auto sent = NetworkLab::Run(
      {"ip", "netns", "exec", lab_->Namespace("a"), "bash", "-c",
       absl::StrCat(
           "dd if=/dev/zero bs=1000 count=2000 2>/dev/null > /dev/udp/",
           lab_->Address("b"), "/9999")});
  ASSERT_TRUE(sent.ok()) << sent.status();
  auto drops = lab_->LimitDrops("a");
  ASSERT_TRUE(drops.ok()) << drops.status();
  EXPECT_GT(*drops, 100u);
  // Still connected, only slow.
  ASSERT_TRUE(lab_->HealAll().ok());
  EXPECT_EQ(Between("a", "b"), Probe::kAnswered);
  ASSERT_TRUE(lab_->ClearLimits().ok());
  shown = NetworkLab::Run({"ip", "netns", "exec", lab_->Namespace("a"), "tc",
                           "qdisc", "show", "dev", "eth0"});
  ASSERT_TRUE(shown.ok());
  EXPECT_FALSE(absl::StrContains(*shown, "tbf")) << *shown;
  EXPECT_TRUE(lab_->ClearLimits("a").ok());  // nothing left to clear
}

TEST(NetworkLabLifetime, DestroyingTheLabRemovesItsNamespaces) {
  if (std::string why = NetworkLab::Unavailable(); !why.empty()) {
    GTEST_SKIP() << "no network lab here: " << why;
  }
  // What a crashed run leaves: a namespace, and its process's lock file
  // that nobody holds.
  const std::string stale = "pn0xdead-0-0";
  (void)NetworkLab::Run({"ip", "netns", "del", stale});
  ASSERT_TRUE(NetworkLab::Run({"ip", "netns", "add", stale}).ok());
  mkdir("/run/pslab", 0755);
  ASSERT_TRUE(NetworkLab::Run({"touch", "/run/pslab/pn0xdead.lock"}).ok());
  std::string ns;
  {
    auto lab = NetworkLab::Create({"x"});
    ASSERT_TRUE(lab.ok()) << lab.status();
    ns = (*lab)->Namespace("x");
    struct stat st;
    ASSERT_EQ(stat(("/run/netns/" + ns).c_str(), &st), 0) << ns;
    EXPECT_TRUE(
        absl::IsInvalidArgument(NetworkLab::Create({"y", "y"}).status()));
    struct stat gone;
    EXPECT_NE(stat(("/run/netns/" + stale).c_str(), &gone), 0)
        << "stale lab left";
    EXPECT_NE(stat("/run/pslab/pn0xdead.lock", &gone), 0);
  }
  struct stat st;
  EXPECT_NE(stat(("/run/netns/" + ns).c_str(), &st), 0) << ns << " left behind";
  auto links = NetworkLab::Run({"ip", "-br", "link"});
  ASSERT_TRUE(links.ok());
  EXPECT_FALSE(absl::StrContains(*links, "pnbr")) << *links;
}

// Without EnterPrivateNetwork the lab's hub is a namespace of its own: the
// same tests, in a child process of this binary started that way.
TEST(NetworkLabLifetime, WorksWithANamedHubToo) {
  if (std::string why = NetworkLab::Unavailable(); !why.empty()) {
    GTEST_SKIP() << "no network lab here: " << why;
  }
  if (std::getenv("NETNS_TEST_NAMED_HUB") != nullptr)
    GTEST_SKIP() << "in the child";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  auto out = NetworkLab::Run({"env", "NETNS_TEST_NAMED_HUB=1", self,
                              "--gtest_filter=NetworkLabTest.*"});
  EXPECT_TRUE(out.ok()) << out.status();
  if (out.ok()) {
    EXPECT_TRUE(absl::StrContains(*out, "[  PASSED  ]")) << *out;
  }
}

}  // namespace
}  // namespace ps::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // Before any thread: this process becomes the labs' hub (reaches every
  // node), unless the named-hub case runs this binary to test the other way.
  if (ps::testing::NetworkLab::Unavailable().empty() &&
      std::getenv("NETNS_TEST_NAMED_HUB") == nullptr) {
    if (absl::Status s = ps::testing::NetworkLab::EnterPrivateNetwork();
        !s.ok()) {
      std::fprintf(stderr, "EnterPrivateNetwork: %s\n",
                   std::string(s.message()).c_str());
      return 1;
    }
  }
  return RUN_ALL_TESTS();
}
