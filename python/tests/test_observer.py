"""Observers read tables while a BSP job trains: a Python observer session
and kv_tool (which reads through one) are answered while the job runs,
never hold it back, and leave its result unchanged (BSP is deterministic:
the same parameters with and without them)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import threading
import time

import numpy as np
import pytest

import ps
import ps.data
import ps.testing

from conftest import timeout_scale

EXAMPLE = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" /
              "lr_numpy.py")

CONFIG = """
name: "py-observer"
cluster { num_servers: 2 num_workers: 2 num_slots: 256
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 3000 }
consistency { mode: BSP }
tables { id: 0 name: "ctr_sparse" sparse { dim: 1 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
         init { kind: ZEROS } }
tables { id: 1 name: "ctr_dense" dense { size: 14 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 1e-6 } }
         init { kind: ZEROS } }
data { synthetic_ctr { num_train: 150000 num_test: 20000 seed: 5 } }
training { batch_size: 500 epochs: 1 }
"""


def run_job(cluster_factory, config: str, observe: bool):
    cluster = cluster_factory(config)
    workers = [cluster.python_worker(f"w{i}", EXAMPLE, [f"--config={config}"])
               for i in range(2)]
    reads = {"python": 0, "kv_tool": 0, "changed": 0}
    errors = []
    stop = threading.Event()

    def job_ending(wait: float = 10.0) -> bool:
        # A read fails once the job ends (its servers exit after the last
        # worker left): only then is a failure expected.
        deadline = time.monotonic() + wait * timeout_scale()
        while time.monotonic() < deadline:
            if any(w.poll() is not None for w in workers):
                return True
            time.sleep(0.05)
        return False

    def python_observer():
        try:
            with ps.observe(config, cluster.scheduler) as o:
                assert o.observer and o.node_id == 0
                dense, sparse = o.table("ctr_dense"), o.table("ctr_sparse")
                keys = ps.data.SyntheticCtr(config).fill(0, 0, 64).keys.reshape(-1)
                last = None
                while not stop.is_set():
                    try:
                        d = dense.pull().result(timeout=10)
                        sparse.pull(keys).result(timeout=10)
                    except ps.PsError:
                        if job_ending():
                            return
                        raise
                    reads["python"] += 1
                    if last is not None and not np.array_equal(last, d):
                        reads["changed"] += 1
                    last = d
                    with pytest.raises(ps.FailedPrecondition, match="observer"):
                        dense.push(np.zeros(14))
                    time.sleep(0.01)
        except BaseException as e:  # noqa: BLE001  (reported by the test)
            errors.append(e)

    def kv_tool_reader():
        while not stop.is_set():
            out = subprocess.run(
                [ps.testing.binary("kv_tool"), f"--config={config}",
                 f"--scheduler={cluster.scheduler}", "--table=ctr_dense",
                 "--op=pull_dense", "--count=14"],
                capture_output=True, text=True, timeout=30 * timeout_scale())
            if out.returncode != 0:
                if not job_ending():
                    errors.append(AssertionError(out.stderr))
                return
            assert len(out.stdout.split()) == 14, out.stdout
            reads["kv_tool"] += 1

    threads = []
    if observe:
        threads = [threading.Thread(target=python_observer),
                   threading.Thread(target=kv_tool_reader)]
        for t in threads:
            t.start()
    try:
        for i, w in enumerate(workers):
            assert w.wait(timeout=120 * timeout_scale()) == 0, cluster.log(f"w{i}")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors, errors
    summary = next(json.loads(line) for i in range(2)
                   for line in cluster.output(f"w{i}").splitlines() if "test_auc" in line)
    return summary, reads


def test_observers_read_a_bsp_job_without_changing_it(write_config, cluster_factory):
    config = write_config(CONFIG)
    alone, _ = run_job(cluster_factory, config, observe=False)
    observed, reads = run_job(cluster_factory, config, observe=True)
    # Read while training, and saw the parameters move.
    assert reads["python"] >= 5 and reads["changed"] >= 2, reads
    assert reads["kv_tool"] >= 1, reads
    # BSP: the same steps applied in the same order give the same model.
    assert observed["steps"] == alone["steps"]
    assert observed["test_auc"] == alone["test_auc"]
    assert observed["test_logloss"] == alone["test_logloss"]
    # Not held back: the observed job trained at no less than a third of the
    # pace of the job alone. The observers share the 2 CPUs with it, and
    # under sanitizers each of kv_tool's back-to-back starts costs several
    # times more CPU, so the bound widens by the sanitizer's time scale; a
    # job held back by an observer would wait for request timeouts and
    # miss any of these bounds by far.
    slowest = alone["examples_per_s"] / (3 * timeout_scale())
    assert observed["examples_per_s"] > slowest, (alone, observed)
