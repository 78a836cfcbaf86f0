"""A sparse table whose rows mostly live on its servers' disk tier, used
from Python exactly as a table in RAM: the same pushes give the same rows,
bit for bit, as a table without a budget, and Session.stats() shows the
tier (cold rows, demotions, promotions), and a prefetch has the servers read
the next batch's rows from disk ahead of its pull."""

from __future__ import annotations

import time

import numpy as np

import ps

JOB = """
name: "py-tiered"
cluster { num_servers: 2 num_workers: 1 num_slots: 64
          heartbeat_interval_ms: 200 heartbeat_timeout_ms: 5000 }
consistency { mode: ASYNC }
tables { id: 0 name: "plain" sparse { dim: 16 admit_after_pushes: 1 }
         optimizer { adam { learning_rate: 0.01 } }
         init { kind: CONSTANT value: 0.25 } }
tables { id: 1 name: "tiered"
         sparse { dim: 16 admit_after_pushes: 1 memory_budget_bytes: 1048576
                  eviction: EVICT_LRU disk_tier { dir: "%s" buffered_io: true } }
         optimizer { adam { learning_rate: 0.01 } }
         init { kind: CONSTANT value: 0.25 } }
"""


def test_a_tiered_table_trains_like_one_in_ram(tmp_path, write_config, cluster_factory):
    config = write_config(JOB % (tmp_path / "tier"))
    cluster = cluster_factory(config)
    sess = ps.Session(config, cluster.scheduler)
    try:
        plain, tiered = sess.table("plain"), sess.table("tiered")
        rng = np.random.default_rng(5)
        # 24 000 ids, about 5 times what the two servers' budgets hold in RAM
        # (Adam keeps 3 floats per weight), pushed in batches that come back
        # to earlier ids.
        ids = rng.permutation(np.arange(1, 24001, dtype=np.uint64) * 7919)
        for step in range(12):
            keys = ids[(step % 6) * 4000:(step % 6 + 1) * 4000]
            grads = rng.standard_normal((keys.size, 16)).astype(np.float32)
            plain.push(keys, grads).result()
            tiered.push(keys, grads).result()
        a = plain.pull(ids).result()
        b = tiered.pull(ids).result()
        assert a.shape == (ids.size, 16)
        assert a.tobytes() == b.tobytes()
        assert np.abs(a - 0.25).max() > 1e-3

        stats = [s for s in sess.stats() if s["name"] == "tiered"]
        assert len(stats) == 2
        hot = sum(s["rows"] for s in stats)
        cold = sum(s["cold_rows"] for s in stats)
        assert hot + cold == ids.size
        assert cold > 3 * hot
        assert sum(s["promotions"] for s in stats) > 0
        assert sum(s["demotions"] for s in stats) == cold + sum(s["promotions"] for s in stats)
        assert all(s["tier_errors"] == 0 and s["tier_memory_bytes"] > 0 for s in stats)
        assert all(s["cold_rows"] == 0 for s in sess.stats() if s["name"] == "plain")

        # Fetch ahead: the servers read the rows of the next batch's keys
        # into RAM while the worker does something else; the pull then finds
        # them there, the same rows. On a table in RAM the hint does nothing.
        def tier(field: str) -> int:
            return sum(s[field] for s in sess.stats() if s["name"] == "tiered")

        # The pull above brought the ids into RAM in order: the first ones
        # went back to disk as the later ones came.
        ahead = ids[:3000]
        read, promoted = tier("rows_read_ahead"), tier("promotions")
        plain.prefetch(ahead).result()
        tiered.prefetch(ahead).result()
        deadline = time.monotonic() + 10
        while tier("promotions") == promoted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tier("promotions") > promoted
        assert tier("rows_read_ahead") > read
        assert tiered.pull(ahead).result().tobytes() == plain.pull(ahead).result().tobytes()
        assert all(s["rows_read_ahead"] == 0 for s in sess.stats() if s["name"] == "plain")
    finally:
        sess.close()
