"""The binding's basics against real processes: tables by name, sparse and
dense push / pull / push_pull / assign with the servers' update rules, scan,
stats, the job lifecycle, and bad use answered with a clear, typed error
before anything is sent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import ps
import ps.data

from conftest import timeout_scale

JOB = """
name: "py-basics"
cluster {{ num_servers: 2 num_workers: {workers} num_slots: 64
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 5000 }}
consistency {{ mode: {mode} }}
tables {{ id: 0 name: "emb" sparse {{ dim: 4 {sparse_extra} }}
         optimizer {{ sgd {{ learning_rate: 0.5 }} }}
         init {{ kind: UNIFORM scale: 0.1 seed: 3 }} }}
tables {{ id: 1 name: "wide" sparse {{ dim: 1 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 0.1 }} }} }}
tables {{ id: 2 name: "dense" dense {{ size: 10 block_size: 4 }}
         optimizer {{ sgd {{ learning_rate: 1 }} }}
         init {{ kind: NORMAL scale: 1 seed: 5 }} }}
"""


def job(write_config, mode="ASYNC", workers=1, sparse_extra=""):
    return write_config(JOB.format(mode=mode, workers=workers, sparse_extra=sparse_extra))


@pytest.fixture
def session(write_config, cluster_factory):
    config = job(write_config)
    cluster = cluster_factory(config)
    s = ps.Session(config, cluster.scheduler)
    yield s
    s.close()


def test_session_knows_its_place_and_tables(session):
    assert session.rank == 0
    assert (session.num_workers, session.num_servers) == (1, 2)
    assert session.mode == "ASYNC"
    assert session.start_clock == 0 and not session.resumed
    assert session.position == ps.DataPosition(0, 0, 0, False)
    assert session.table_names == ["emb", "wide", "dense"]
    emb, dense = session.table("emb"), session.table("dense")
    assert isinstance(emb, ps.SparseTable) and emb.dim == 4 and emb.optimizer == "sgd"
    assert isinstance(dense, ps.DenseTable) and dense.size == 10
    with pytest.raises(ps.InvalidArgument, match="its tables: emb, wide, dense"):
        session.table("nope")


def test_sparse_rows_start_at_the_servers_initial_values_and_follow_sgd(session):
    emb = session.table("emb")
    keys = np.array([5, 1 << 63, 17], dtype=np.uint64)
    initial = ps.data.initial_values(session.config_path, "emb", keys)
    assert np.abs(initial).max() <= 0.1 and np.abs(initial).max() > 0
    np.testing.assert_array_equal(emb.pull(keys).result(), initial)
    grads = np.arange(12, dtype=np.float32).reshape(3, 4)
    emb.push(keys, grads).result()
    np.testing.assert_array_equal(emb.pull(keys).result(), initial - 0.5 * grads)
    # push_pull answers the rows after the push.
    after = emb.push_pull(keys, grads).result()
    np.testing.assert_array_equal(after, initial - 1.0 * grads)
    # int64 keys are the same keys, bit-cast (1 << 63 is negative as int64).
    np.testing.assert_array_equal(emb.pull(keys.view(np.int64)).result(), after)
    # Pulling into a caller's buffer.
    out = np.zeros((3, 4), dtype=np.float32)
    assert emb.pull(keys, out=out).result() is out
    np.testing.assert_array_equal(out, after)


def test_adagrad_on_a_dim_one_table(session):
    wide = session.table("wide")
    keys = np.array([7, 8], dtype=np.uint64)
    g = np.array([[0.5], [-2.0]], dtype=np.float32)
    wide.push(keys, g).result()
    acc = 0.1 + g.astype(np.float64) ** 2
    want = -0.1 * g / np.sqrt(acc)
    np.testing.assert_allclose(wide.pull(keys).result(), want, rtol=1e-6)


def test_dense_pull_push_assign_across_blocks(session):
    dense = session.table("dense")
    initial = ps.data.initial_values(session.config_path, "dense", first=0, count=10)
    np.testing.assert_array_equal(dense.pull().result(), initial)
    np.testing.assert_array_equal(dense.pull(3, 5).result(), initial[3:8])
    dense.push(np.ones(6), begin=2).result()
    want = initial.copy()
    want[2:8] -= 1
    np.testing.assert_array_equal(dense.pull().result(), want)
    dense.assign(np.arange(10)).result()
    np.testing.assert_array_equal(dense.pull().result(), np.arange(10, dtype=np.float32))


def test_scan_and_stats(session):
    emb = session.table("emb")
    keys = np.arange(100, 150, dtype=np.uint64)
    emb.push(keys, np.ones((50, 4), np.float32)).result()
    got_keys, rows = emb.scan()
    order = np.argsort(got_keys)
    np.testing.assert_array_equal(got_keys[order], keys)
    np.testing.assert_array_equal(rows[order], ps.data.initial_values(
        session.config_path, "emb", keys) - 0.5)
    stats = emb.stats()
    assert len(stats) == 2  # one entry per server
    assert sum(s["rows"] for s in stats) == 50
    assert sum(s["keys_pushed"] for s in stats) == 50


def test_bad_use_is_refused_before_anything_is_sent(session):
    emb, dense = session.table("emb"), session.table("dense")
    keys = np.array([1, 2, 3], dtype=np.uint64)
    with pytest.raises(ps.InvalidArgument, match=r"shape \(3, 4\); got \(3, 3\)"):
        emb.push(keys, np.ones((3, 3), np.float32))
    with pytest.raises(ps.InvalidArgument, match="keys must be integers"):
        emb.pull(np.array([1.5, 2.5]))
    with pytest.raises(ps.InvalidArgument, match="must not be negative"):
        emb.pull(np.array([-1], dtype=np.int32))
    with pytest.raises(ps.InvalidArgument, match="keys must be 1-D"):
        emb.pull(np.ones((2, 2), dtype=np.uint64))
    with pytest.raises(ps.InvalidArgument, match="real numbers"):
        emb.push(keys, np.ones((3, 4), dtype=np.complex64))
    bad = np.zeros((3, 4), np.float32)
    bad[1, 2] = np.nan
    with pytest.raises(ps.InvalidArgument,
                       match=r"non-finite gradient at element 6 \(key 2, column 2\)"):
        emb.push(keys, bad)
    with pytest.raises(ps.InvalidArgument, match=r"element 4 \(table element 7\)"):
        g = np.zeros(5, np.float32)
        g[4] = np.inf
        dense.push(g, begin=3)
    with pytest.raises(ps.InvalidArgument, match="out of range"):
        dense.pull(8, 5)
    with pytest.raises(ps.InvalidArgument, match="C-contiguous float32"):
        emb.pull(keys, out=np.zeros((3, 4), np.float64))
    # Nothing of the above reached a server.
    assert sum(s["keys_pushed"] + s["keys_pulled"] for s in session.stats()) == 0


def test_a_full_table_is_resource_exhausted(write_config, cluster_factory):
    config = job(write_config,
                 sparse_extra="memory_budget_bytes: 1048576 eviction: EVICT_NONE")
    cluster = cluster_factory(config)
    with ps.Session(config, cluster.scheduler) as s:
        emb = s.table("emb")
        n = 1 << 17  # 2 MiB of rows and more of bookkeeping, on 2 servers
        with pytest.raises(ps.ResourceExhausted) as e:
            emb.push(np.arange(n, dtype=np.uint64), np.ones((n, 4), np.float32)).result()
        assert isinstance(e.value, MemoryError)
        assert "budget" in str(e.value)


def test_finish_elects_the_evaluator_and_the_job_ends(write_config, cluster_factory):
    config = job(write_config, mode="BSP")
    cluster = cluster_factory(config)
    s = ps.Session(config, cluster.scheduler)
    dense = s.table("dense")
    dense.push(np.ones(10)).result()
    s.end_step().result()
    assert s.clock == 1
    assert s.finish() is True
    assert s.clock == ps.FINISHED_CLOCK
    s.close()
    # Every worker left finished: the scheduler and the servers exit 0.
    codes = cluster.wait_all(timeout=30 * timeout_scale())
    assert set(codes.values()) == {0}, codes


def test_checkpoint_needs_a_checkpoint_dir(session):
    with pytest.raises(ps.FailedPrecondition, match="checkpoint.dir"):
        session.checkpoint()


def test_closed_session_refuses_use(write_config, cluster_factory):
    config = job(write_config)
    cluster = cluster_factory(config)
    s = ps.Session(config, cluster.scheduler)
    emb = s.table("emb")
    s.close()
    s.close()  # twice is fine
    with pytest.raises(ps.FailedPrecondition, match="closed"):
        emb.pull([1])


def test_unreachable_scheduler_and_bad_config(write_config, tmp_path):
    config = job(write_config)
    bad = write_config("cluster { num_servers: 0 }", "bad.pbtxt")
    with pytest.raises(ps.InvalidArgument):
        ps.Session(bad, "127.0.0.1:1")
    with pytest.raises(ps.PsError):
        ps.Session(str(tmp_path / "missing.pbtxt"), "127.0.0.1:1")
    with pytest.raises(ps.InvalidArgument, match="scheduler"):
        ps.Session(config, "")


def test_hash_key_matches_the_cpp_readers():
    # worker/data/keys.h CriteoKey(field, value) = HashCombine(Mix64(C + field), value).
    def mix64(x):
        m = (1 << 64) - 1
        x = (x + 0x9E3779B97F4A7C15) & m
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
        return x ^ (x >> 31)

    def criteo_key(field, value):
        return mix64(mix64(0x43726974656F0000 + field) ^ mix64(value))

    assert ps.hash_key(3, 0xABC) == criteo_key(3, 0xABC)
    values = np.array([0, 1, 1 << 32, 0xFFFFFFFF], dtype=np.uint64)
    np.testing.assert_array_equal(ps.hash_key(25, values),
                                  np.array([criteo_key(25, int(v)) for v in values],
                                           dtype=np.uint64))


INTERRUPT_SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np
    import ps
    config, scheduler = sys.argv[1], sys.argv[2]
    s = ps.Session(config, scheduler)
    print("rank", s.rank, flush=True)
    s.barrier("both")
    if s.rank == 1:
        time.sleep(60)   # never ends its step
        sys.exit(0)
    s.table("dense").push(np.ones(10)).result()
    s.end_step().result()
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    t = time.monotonic()
    try:
        s.table("dense").pull().result()   # held: rank 1 is at clock 0
        print("not held", flush=True)
    except KeyboardInterrupt:
        print("interrupted after %.3f" % (time.monotonic() - t - 0.5), flush=True)
    t = time.monotonic()
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    try:
        s.barrier("never", timeout=30)
    except KeyboardInterrupt:
        print("barrier interrupted after %.3f" % (time.monotonic() - t - 0.3), flush=True)
    s.close(finished=False)
    print("closed", flush=True)
""")


def test_ctrl_c_interrupts_a_blocked_wait(write_config, cluster_factory, tmp_path):
    config = job(write_config, mode="BSP", workers=2)
    cluster = cluster_factory(config)
    script = tmp_path / "interrupt.py"
    script.write_text(INTERRUPT_SCRIPT)
    procs = {name: cluster.python_worker(name, str(script), [config, cluster.scheduler])
             for name in ("w0", "w1")}
    # Ranks go by registration order, which a loaded machine may swap: the
    # worker that printed "rank 0" is the one interrupted.
    deadline = time.monotonic() + 30 * timeout_scale()
    first = None
    while first is None and time.monotonic() < deadline:
        first = next((n for n in procs if "rank 0" in cluster.output(n)), None)
        time.sleep(0.05)
    try:
        assert first is not None, cluster.log("w0") + cluster.log("w1")
        procs[first].wait(timeout=60 * timeout_scale())
    finally:
        for p in procs.values():
            p.kill()
    out = cluster.output(first)
    lines = dict(line.rsplit(" ", 1) for line in out.splitlines() if "after" in line)
    assert float(lines["interrupted after"]) < 1.0, out
    assert float(lines["barrier interrupted after"]) < 1.0, out
    assert "closed" in out


FORK_SCRIPT = textwrap.dedent("""
    import os, sys
    import ps
    s = ps.Session(sys.argv[1], sys.argv[2])
    emb = s.table("emb")
    emb.pull([1]).result()
    pid = os.fork()
    if pid == 0:
        try:
            emb.pull([1]).result()
            os._exit(3)
        except ps.ForkError as e:
            print("child:", e, flush=True)
            os._exit(0)
        except BaseException as e:
            print("child other:", type(e), e, flush=True)
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status), flush=True)
    print("parent still works", emb.pull([1]).result().shape, flush=True)
    s.close()
""")


def test_a_forked_child_gets_a_clear_error_not_a_hang(write_config, cluster_factory, tmp_path):
    config = job(write_config)
    cluster = cluster_factory(config)
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    p = cluster.python_worker("w0", str(script), [config, cluster.scheduler])
    assert p.wait(timeout=60 * timeout_scale()) == 0, cluster.log("w0")
    out = cluster.output("w0")
    assert "child exit 0" in out, out + cluster.log("w0")
    assert "forked child" in out
    assert "parent still works (1, 4)" in out


def test_a_timed_out_bsp_wait_names_the_workers_it_waits_for(write_config, cluster_factory):
    config = job(write_config, mode="BSP", workers=2)
    cluster = cluster_factory(config)
    a = ps.Session(config, cluster.scheduler)
    b = ps.Session(config, cluster.scheduler)
    try:
        # After a barrier every server counts both workers.
        met = threading.Thread(target=b.barrier, args=("both",))
        met.start()
        a.barrier("both")
        met.join()
        dense = a.table("dense")
        dense.push(np.ones(10)).result()
        a.end_step().result()
        held = dense.pull()   # at clock 1: waits for b's step 0
        with pytest.raises(ps.Timeout) as e:
            held.result(timeout=0.5)
        assert isinstance(e.value, TimeoutError)
        assert f"waiting for worker rank {b.rank} (clock 0" in str(e.value), str(e.value)
        # The request goes on and is answered once b ends its step.
        b.end_step().result()
        np.testing.assert_array_equal(held.result(timeout=10),
                                      ps.data.initial_values(config, "dense", first=0,
                                                             count=10) - 0.5)
    finally:
        a.close(finished=False)
        b.close(finished=False)


DROP_JOB = """
name: "py-dropped"
cluster {{ num_servers: 1 num_workers: 1 num_slots: 16
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: {timeout_ms} }}
tables {{ id: 0 name: "dense" dense {{ size: 4 }} optimizer {{ sgd {{ learning_rate: 1 }} }} }}
"""

DROP_SCRIPT = textwrap.dedent("""
    import sys, time
    import numpy as np
    import ps
    s = ps.Session(sys.argv[1], sys.argv[2])
    dense = s.table("dense")
    print("training", flush=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                dense.push(np.ones(4)).result()
                s.end_step().result()
            except ps.Dropped:
                raise
            except ps.PsError as e:
                print("other:", type(e).__name__, e, flush=True)
            time.sleep(0.02)
        print("never dropped", flush=True)
    except ps.Dropped as e:
        print("dropped:", isinstance(e, ps.Aborted), e, flush=True)
        try:
            s.barrier("after")
        except ps.Dropped:
            print("later waits too", flush=True)
    s.close()
    print("closed", flush=True)
""")


def test_a_worker_paused_past_the_heartbeat_timeout_gets_dropped(
        write_config, cluster_factory, tmp_path):
    timeout_ms = int(1000 * timeout_scale())
    config = write_config(DROP_JOB.format(timeout_ms=timeout_ms))
    cluster = cluster_factory(config)
    script = tmp_path / "dropped.py"
    script.write_text(DROP_SCRIPT)
    p = cluster.python_worker("w0", str(script), [config, cluster.scheduler])
    deadline = time.monotonic() + 60 * timeout_scale()
    while "training" not in cluster.output("w0"):
        assert time.monotonic() < deadline and p.poll() is None, cluster.log("w0")
        time.sleep(0.05)
    time.sleep(0.3)
    # Paused past the heartbeat timeout: the scheduler declares it dead; it
    # learns so from its first heartbeat after SIGCONT.
    os.kill(p.pid, signal.SIGSTOP)
    time.sleep(3 * timeout_ms / 1000)
    os.kill(p.pid, signal.SIGCONT)
    assert p.wait(timeout=60 * timeout_scale()) == 0, cluster.log("w0")
    out = cluster.output("w0")
    assert "dropped: True" in out, out + cluster.log("w0")
    assert "dropped by the scheduler" in out
    assert "later waits too" in out
    assert "closed" in out
