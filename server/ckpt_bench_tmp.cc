#include <cstdio>
#include "absl/time/clock.h"
#include "server/checkpoint.h"
#include "common/hash.h"
int main() {
  using namespace ps;
  TableConfig c; c.set_id(1); c.set_name("e"); c.mutable_sparse()->set_dim(16);
  auto* a = c.mutable_optimizer()->mutable_adam(); a->set_learning_rate(0.01f); a->set_beta1(0.9f); a->set_beta2(0.999f); a->set_epsilon(1e-8f);
  auto t = Table::Create(c).value();
  SparseTable& s = *t->AsSparse();
  std::vector<float> st(s.state_floats(), 0.5f);
  const uint64_t N = 1000000;
  for (uint64_t k = 0; k < N; ++k) { st[0] = k; (void)s.ImportRow(Mix64(k), st); }
  std::vector<const Table*> tables{t.get()};
  absl::Time t0 = absl::Now();
  auto f = WriteShard("/tmp/ckbench/ckpt-00000000000000000001", 0, 1, 4096, tables).value();
  absl::Time t1 = absl::Now();
  CheckpointManifest m; m.set_clock(1); m.set_num_servers(1); *m.add_shards() = f;
  (void)WriteManifest("/tmp/ckbench/ckpt-00000000000000000001", m);
  absl::Time t2 = absl::Now();
  auto v = VerifyCheckpoint("/tmp/ckbench/ckpt-00000000000000000001");
  absl::Time t3 = absl::Now();
  auto t2t = Table::Create(c).value();
  std::vector<Table*> rt{t2t.get()};
  auto r = RestoreShards("/tmp/ckbench/ckpt-00000000000000000001", m, rt);
  absl::Time t4 = absl::Now();
  auto d = DigestCheckpoint("/tmp/ckbench/ckpt-00000000000000000001");
  absl::Time t5 = absl::Now();
  std::printf("bytes %.1f MB write %.2fs verify %.2fs(%d) restore %.2fs(%d rows %llu) digest %.2fs\n", f.bytes()/1e6,
    absl::ToDoubleSeconds(t1-t0), absl::ToDoubleSeconds(t3-t2), v.ok(), absl::ToDoubleSeconds(t4-t3), r.ok(), (unsigned long long)(r.ok()? r->rows_restored:0), absl::ToDoubleSeconds(t5-t4));
}
