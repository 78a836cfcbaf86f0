"""Dense tables by ring all-reduce (dense { sync: ALLREDUCE }) from Python,
with real scheduler, server and worker processes:

- equivalence: the same ps.torch.Trainer job, its dense table on the servers
  under BSP or all-reduced by the workers, 1 and 3 workers, SGD and Adam,
  200 steps each: the final dense values are equal within 1e-5, and every
  worker's replica (values and optimizer state) is bit-identical to what
  the servers hold at the end;
- a worker killed mid-training (sparse tables ASYNC or BSP): the
  survivor's ring re-forms without it, and a replacement joining the
  running job receives the ring's state (its replica takes the survivor's
  step) and trains on with it;
- the C ABI's errors: a table on the servers, a sparse one, tables with
  different optimizers; a replica from the tables' initializers.
"""

from __future__ import annotations

import ctypes
import json
import pathlib
import signal
import subprocess
import time
from typing import Dict, List

import numpy as np
import pytest

import ps
import ps.data
from ps import _native

from conftest import timeout_scale

pytest.importorskip("torch")

from helpers import allreduce_worker  # noqa: E402

WORKER = str(pathlib.Path(__file__).resolve().parent / "helpers" / "allreduce_worker.py")
STEPS = 200
BATCH = 32
NUM_NUMERIC = 16
#: Floats of helpers/allreduce_worker.py's MLP: 16 -> 64 -> 32 -> 1.
DENSE_SIZE = NUM_NUMERIC * 64 + 64 + 64 * 32 + 32 + 32 + 1

OPTIMIZERS = {
    "sgd": "sgd { learning_rate: 0.1 }",
    "adam": "adam { learning_rate: 0.01 }",
}

# The two runs differ only in float rounding: the servers average a step's
# gradients in double and divide, the ring sums in float (in ring order) and
# multiplies by 1/P, a few ulps per step. Measured after 200 steps: 0 with
# one worker (bit-identical), about 1e-7 with three; a lost or doubled step
# is off by 1e-3 or more.
TOLERANCE = 1e-5


def job(optimizer: str, workers: int, sync: str, mode: str = "BSP",
        steps: int = STEPS, extra: str = "") -> str:
    return f"""
name: "py-allreduce"
cluster {{ num_servers: 1 num_workers: {workers} num_slots: 16
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 2000 }}
consistency {{ mode: {mode} }}
tables {{ id: 0 name: "mlp" dense {{ size: {DENSE_SIZE} sync: {sync} }}
         optimizer {{ {OPTIMIZERS[optimizer]} }} }}
data {{ synthetic_ctr {{ num_train: {steps * BATCH * workers} num_test: 64 seed: 5
                        num_numeric: {NUM_NUMERIC} num_categorical: 2 }} }}
training {{ batch_size: {BATCH} }}
allreduce {{ timeout_ms: 10000 form_timeout_ms: 30000 }}
{extra}
"""


def lines(cluster, name: str) -> List[dict]:
    return [json.loads(line) for line in cluster.output(name).splitlines()
            if line.startswith("{")]


def wait_ok(cluster, names: List[str], timeout: float = 90) -> None:
    for name in names:
        try:
            code = cluster.wait(name, timeout=timeout * timeout_scale())
        except subprocess.TimeoutExpired:
            raise AssertionError("hung:\n" + "\n".join(
                f"---- {n}\n{cluster.log(n)[-2000:]}" for n in cluster.procs))
        assert code == 0, f"{name} exited {code}:\n{cluster.log(name)[-3000:]}"


def run(write_config, cluster_factory, tmp_path: pathlib.Path, optimizer: str,
        workers: int, sync: str) -> Dict[str, np.ndarray]:
    """Trains the job; the servers' final values and each worker's replica."""
    config = write_config(job(optimizer, workers, sync), f"{sync}-{workers}.pbtxt")
    out = tmp_path / f"{sync}-{optimizer}-{workers}"
    out.mkdir()
    cluster = cluster_factory(config)
    names = [f"w{r}" for r in range(workers)]
    for name in names:
        cluster.python_worker(name, WORKER, [config, str(out), name])
    wait_ok(cluster, names)
    for name in names:
        (line,) = lines(cluster, name)
        assert line["steps"] == STEPS, line
        if sync == "ALLREDUCE":
            # Every step all-reduced over every worker, from the first.
            assert line["first_ring"] == {"step": 1, "ring_size": workers}, line
            assert line["ring_step"] == STEPS, line
    result = {path.stem: np.load(path) for path in out.glob("*.npy")}
    assert "servers" in result, sorted(result)
    return result


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_allreduce_trains_as_bsp_on_the_servers(optimizer, workers, write_config,
                                                cluster_factory, tmp_path):
    servers = run(write_config, cluster_factory, tmp_path, optimizer, workers, "SERVERS")
    ring = run(write_config, cluster_factory, tmp_path, optimizer, workers, "ALLREDUCE")
    a, b = servers["servers"], ring["servers"]
    assert a.shape == b.shape == (DENSE_SIZE,)
    # Trained well away from the start, so equality is not trivial.
    initial = allreduce_worker.flat(allreduce_worker.mlp(NUM_NUMERIC))
    assert np.abs(a - initial).max() > 1e-2
    diff = float(np.abs(a - b).max())
    print(f"{optimizer} {workers} workers: max |servers BSP - all-reduce| = {diff:.3g}")
    assert diff <= TOLERANCE
    # The replicas are identical, and are what the servers hold, optimizer
    # state included (Adam's, in the companion table "mlp.allreduce_state").
    replicas = [v for k, v in ring.items() if k.startswith("replica-w")]
    assert len(replicas) == workers
    for r in replicas:
        np.testing.assert_array_equal(r, b)
    states = [v for k, v in ring.items() if k.startswith("replica-state-")]
    assert len(states) == workers
    if optimizer == "adam":
        assert states[0].size > DENSE_SIZE and np.abs(states[0]).max() > 0
        for st in states:
            np.testing.assert_array_equal(st, ring["servers-state"])
    else:
        assert states[0].size == 0 and "servers-state" not in ring


def wait_for_line(cluster, name: str, needle: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout * timeout_scale()
    while needle not in cluster.output(name):
        if cluster.procs[name].poll() is not None:
            raise AssertionError(f"{name} exited before {needle!r}:\n{cluster.log(name)[-3000:]}")
        assert time.monotonic() < deadline, f"{name} never printed {needle!r}"
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["ASYNC", "BSP"])
def test_a_replacement_receives_the_rings_state(mode, write_config, cluster_factory, tmp_path):
    # Under BSP the survivor's pulls also wait for the replacement's clock:
    # it waits to join with its clock finished, then resumes at the ring's.
    steps = 300
    config = write_config(job("adam", 2, "ALLREDUCE", mode=mode, steps=steps))
    out = tmp_path / "out"
    out.mkdir()
    cluster = cluster_factory(config, log_level="info")
    for name in ("w0", "w1"):
        cluster.python_worker(name, WORKER, [config, str(out), name, "0.02"])
    wait_for_line(cluster, "w1", "step 40\n")
    cluster.kill("w1", signal.SIGKILL)
    killed_rank = int(cluster.output("w1").split()[3])
    # The survivor's collective fails at once; its ring re-forms without w1
    # once the scheduler declares w1 dead (2 s); the replacement registers
    # then (its rank is free) and resumes w1's shard.
    cluster.python_worker("w2", WORKER, [config, str(out), "w2", "0.02"])
    wait_ok(cluster, ["w0", "w2"], timeout=120)
    (survivor,) = lines(cluster, "w0")
    (replacement,) = lines(cluster, "w2")
    assert survivor["steps"] == steps
    assert replacement["rank"] == killed_rank
    # It resumed w1's shard after w1's last acknowledged step.
    assert 0 < replacement["steps"] < steps - 30, replacement
    # It started its replica at step 0 and took the survivor's state when
    # it joined: the ring had applied at least the 40 steps w1 took part in.
    first = replacement["first_ring"]
    assert first["ring_size"] == 2, replacement
    assert first["step"] >= 40, replacement
    # Both trained in one ring to the end: the last to finish holds the most
    # steps, and the servers hold its replica.
    last = max((survivor, replacement), key=lambda line: line["ring_step"])
    assert last["ring_step"] >= steps
    np.testing.assert_array_equal(np.load(out / f"replica-{last['name']}.npy"),
                                  np.load(out / "servers.npy"))


def test_a_checkpoint_holds_the_replica_and_a_restored_job_resumes_it(
        write_config, cluster_factory, tmp_path):
    # The ring's first member writes the replica (values and Adam's state)
    # to the servers just before the checkpoint's cut; the restored job's
    # workers start their replicas from exactly that.
    steps = 100
    root = tmp_path / "ckpts"
    out = tmp_path / "out"
    out.mkdir()
    first = write_config(job("adam", 2, "ALLREDUCE", steps=steps,
                             extra=f'checkpoint {{ dir: "{root}" }}'), "first.pbtxt")
    cluster = cluster_factory(first)
    for name in ("w0", "w1"):
        # Paced, so the clock the scheduler picks for the checkpoint (a
        # little past the fastest clock its heartbeats report) is still
        # ahead of the workers when they learn of it, also on a busy machine.
        cluster.python_worker(name, WORKER, [first, str(out), name, "0.03", "20"])
    wait_ok(cluster, ["w0", "w1"])
    cluster.close()
    cut = np.load(out / "at-checkpoint.npy")
    assert cut.size == DENSE_SIZE * 4  # values, then Adam's 3 floats per element
    restored = write_config(job("adam", 2, "ALLREDUCE", steps=steps,
                                extra=f'checkpoint {{ dir: "{root}" restore: true }}'),
                            "restored.pbtxt")
    cluster = cluster_factory(restored)
    for name in ("r0", "r1"):
        cluster.python_worker(name, WORKER, [restored, str(out), name])
    wait_ok(cluster, ["r0", "r1"])
    for name in ("r0", "r1"):
        np.testing.assert_array_equal(np.load(out / f"restored-{name}.npy"), cut)
        (line,) = lines(cluster, name)
        # Resumed at the cut: the rest of the steps, and the ring's count.
        assert line["steps"] < steps and line["ring_step"] == steps, line


# ---- the C ABI

ABI_JOB = """
name: "py-allreduce-abi"
cluster { num_servers: 1 num_workers: 1 num_slots: 16
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 2000 }
tables { id: 0 name: "emb" sparse { dim: 2 } optimizer { sgd { learning_rate: 1 } } }
tables { id: 1 name: "on_servers" dense { size: 4 } optimizer { sgd { learning_rate: 1 } } }
tables { id: 2 name: "a" dense { size: 3 sync: ALLREDUCE }
         optimizer { sgd { learning_rate: 0.5 } } init { kind: NORMAL scale: 0.1 seed: 4 } }
tables { id: 3 name: "b" dense { size: 2 sync: ALLREDUCE }
         optimizer { sgd { learning_rate: 0.5 } } init { kind: ZEROS } }
tables { id: 4 name: "c" dense { size: 2 sync: ALLREDUCE }
         optimizer { adam { learning_rate: 0.5 } } }
allreduce { form_timeout_ms: 10000 }
"""


def create(s: ps.Session, ids: List[int]) -> int:
    lib = _native.lib()
    arr = (ctypes.c_uint32 * len(ids))(*ids)
    h = ctypes.c_void_p()
    code = lib.ps_allreduce_create(s._ptr, arr, len(ids), None, 0, 0, b"", ctypes.byref(h))
    if code != 0:
        raise ps.errors.last_failure(code)
    return h.value


def test_the_abi_checks_the_tables_and_fuses_them(write_config, cluster_factory):
    config = write_config(ABI_JOB)
    cluster = cluster_factory(config)
    with ps.Session(config, cluster.scheduler) as s:
        with pytest.raises(ps.InvalidArgument, match="on_servers is updated by the servers"):
            create(s, [1])
        with pytest.raises(ps.InvalidArgument, match="emb is sparse"):
            create(s, [0])
        with pytest.raises(ps.InvalidArgument, match="same optimizer config"):
            create(s, [2, 4])
        with pytest.raises(ps.InvalidArgument, match="given twice"):
            create(s, [2, 2])
        with pytest.raises(ps.InvalidArgument, match="no table with id 9"):
            create(s, [9])
        lib = _native.lib()
        h = create(s, [2, 3])
        try:
            # NULL initial values: the tables' initializers, as the servers'.
            values = np.empty(5, np.float32)
            assert lib.ps_allreduce_values(h, 0, values.ctypes.data, 5) == 0
            initial = ps.data.initial_values(config, "a", count=3)
            assert np.abs(initial).max() > 0
            np.testing.assert_array_equal(values[:3], initial)
            np.testing.assert_array_equal(values[3:], np.zeros(2, np.float32))
            # A ring of one: the step applies the gradient itself.
            g = np.array([1, 2, 3, 4, 5], np.float32)
            assert lib.ps_allreduce_step(h, g.ctypes.data, 4) == ps.InvalidArgument.code
            bad = np.array([0, np.nan, 0, 0, 0], np.float32)
            assert lib.ps_allreduce_step(h, bad.ctypes.data, 5) == ps.InvalidArgument.code
            assert "non-finite gradient at element 1" in _native.last_error()
            assert lib.ps_allreduce_step(h, g.ctypes.data, 5) == 0, _native.last_error()
            after = np.empty(5, np.float32)
            assert lib.ps_allreduce_values(h, 0, after.ctypes.data, 5) == 0
            np.testing.assert_allclose(after, values - 0.5 * g, rtol=1e-6)
            info = _native.RingInfo()
            assert lib.ps_allreduce_info(h, ctypes.byref(info)) == 0
            assert (info.size, info.step, info.ring_size) == (5, 1, 1)
            assert lib.ps_allreduce_leave(h) == 0
            assert lib.ps_allreduce_info(h, ctypes.byref(info)) == 0
            assert info.ring_size == 0
        finally:
            lib.ps_allreduce_free(h)
