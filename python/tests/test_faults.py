"""Python workers under faults, with real processes (the NumPy LR example,
examples/python/lr_numpy.py, as the worker):

- one of two workers SIGKILLed at a seeded random step, in each mode: the job
  finishes, every process else exits 0, and the test AUC is within 0.005 of
  an undisturbed run;
- SIGTERM and `psctl drain`: the worker exits 0 and hands over its exact
  position, so the two workers together train every example exactly once;
- uneven batch counts under BSP: the job ends without anybody waiting out a
  heartbeat timeout.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import signal
import subprocess
import time
from typing import Dict, List, Optional

import pytest

import ps.testing

from conftest import timeout_scale

EXAMPLE = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" /
              "lr_numpy.py")

NUM_TRAIN = 120000
BATCH = 1000
EPOCHS = 2

CONFIG = """
name: "py-faults"
cluster {{ num_servers: 2 num_workers: 2 num_slots: 256
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 3000 }}
consistency {{ mode: {mode} {staleness} }}
tables {{ id: 0 name: "ctr_sparse" sparse {{ dim: 1 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 1e-6 }} }}
         init {{ kind: ZEROS }} }}
tables {{ id: 1 name: "ctr_dense" dense {{ size: 14 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 1e-6 }} }}
         init {{ kind: ZEROS }} }}
data {{ synthetic_ctr {{ num_train: {num_train} num_test: 20000 seed: 3 }} }}
training {{ batch_size: {batch} epochs: {epochs} }}
"""


def write_job(write_config, mode: str, num_train: int = NUM_TRAIN, name: str = "job.pbtxt"):
    staleness = "staleness: 2" if mode == "SSP" else ""
    return write_config(CONFIG.format(mode=mode, staleness=staleness, num_train=num_train,
                                      batch=BATCH, epochs=EPOCHS), name)


class Job:
    """A 2-server job with two Python LR workers."""

    def __init__(self, cluster_factory, config: str) -> None:
        self.cluster = cluster_factory(config)
        self.config = config
        self.workers = [
            self.cluster.python_worker(f"w{i}", EXAMPLE,
                                       [f"--config={config}", "--log_every_steps=1"])
            for i in range(2)]

    def wait_for_step(self, name: str, step: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout * timeout_scale()
        needle = f"step {step} "
        while time.monotonic() < deadline:
            if needle in self.cluster.output(name):
                return
            if self.cluster.procs[name].poll() is not None:
                raise AssertionError(f"{name} exited before step {step}:\n"
                                     + self.cluster.log(name)[-3000:])
            time.sleep(0.01)
        raise AssertionError(f"{name} never reached step {step}")

    def rank(self, name: str) -> int:
        """The worker rank process `name` registered as."""
        for line in self.cluster.output(name).splitlines():
            if line.startswith("joined as worker "):
                return int(line.split()[3])
        raise AssertionError(f"{name} did not say its rank")

    def finish(self, timeout: float = 120) -> Dict[str, int]:
        try:
            return self.cluster.wait_all(timeout=timeout * timeout_scale())
        except subprocess.TimeoutExpired:
            raise AssertionError("the job hung:\n" + "\n".join(
                f"---- {n}\n{self.cluster.log(n)[-2000:]}" for n in self.cluster.procs))

    def failed_logs(self, codes: Dict[str, int]) -> str:
        """The exit codes, then the end of each failed process's log."""
        return f"{codes}\n" + "\n".join(
            f"---- {n} exited {c}\n{self.cluster.log(n)[-3000:]}"
            for n, c in codes.items() if c != 0)

    def lines(self, name: str) -> List[dict]:
        return [json.loads(line) for line in self.cluster.output(name).splitlines()
                if line.startswith("{")]

    def summary(self) -> dict:
        for name in ("w0", "w1"):
            for line in self.lines(name):
                if "test_auc" in line:
                    return line
        raise AssertionError("no summary:\n" + self.cluster.log("w0")[-2000:]
                             + self.cluster.log("w1")[-2000:])

    def trained_examples(self) -> int:
        return sum(line["examples"] for name in ("w0", "w1") for line in self.lines(name)
                   if "worker_rank" in line)


_reference_auc: Dict[str, float] = {}


def reference_auc(write_config, cluster_factory, mode: str) -> float:
    if mode not in _reference_auc:
        job = Job(cluster_factory, write_job(write_config, mode, name=f"ref-{mode}.pbtxt"))
        codes = job.finish()
        assert set(codes.values()) == {0}, codes
        assert job.trained_examples() == NUM_TRAIN * EPOCHS
        _reference_auc[mode] = job.summary()["test_auc"]
    return _reference_auc[mode]


@pytest.mark.parametrize("mode", ["ASYNC", "BSP", "SSP"])
@pytest.mark.parametrize("seed", [1, 2])
def test_a_killed_worker_costs_no_quality(write_config, cluster_factory, mode, seed):
    reference = reference_auc(write_config, cluster_factory, mode)
    victim_step = random.Random(seed * 7919 + len(mode)).randrange(5, NUM_TRAIN // BATCH)
    job = Job(cluster_factory, write_job(write_config, mode))
    victim = f"w{seed % 2}"
    job.wait_for_step(victim, victim_step)
    job.cluster.kill(victim, signal.SIGKILL)
    codes = job.finish()
    assert codes[victim] == -signal.SIGKILL
    assert all(c == 0 for n, c in codes.items() if n != victim), codes
    summary = job.summary()
    # The survivor trained the victim's shard from its last acknowledged
    # step (a few batches twice, none skipped).
    assert summary["examples"] >= NUM_TRAIN * EPOCHS // 2
    assert abs(summary["test_auc"] - reference) < 0.005, (
        f"seed {seed} {mode}: killed {victim} at step {victim_step}: AUC "
        f"{summary['test_auc']:.5f} vs {reference:.5f} undisturbed")


@pytest.mark.parametrize("how", ["sigterm", "drain"])
@pytest.mark.parametrize("mode", ["ASYNC", "BSP"])
def test_a_stopped_worker_hands_over_its_exact_position(write_config, cluster_factory,
                                                        mode, how):
    # A drain goes through psctl and the scheduler to the worker's next
    # heartbeat; under ASan the worker once trained its last 90 steps before
    # it arrived, so that job is four times as long.
    num_train = NUM_TRAIN * (4 if how == "drain" else 1)
    job = Job(cluster_factory, write_job(write_config, mode, num_train))
    job.wait_for_step("w1", 30)
    if how == "sigterm":
        job.cluster.kill("w1", signal.SIGTERM)
    else:
        rank = job.rank("w1")
        out = subprocess.run([ps.testing.binary("psctl"), f"--scheduler={job.cluster.scheduler}",
                              "drain", f"worker:{rank}"], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, out.stderr
    codes = job.finish()
    assert set(codes.values()) == {0}, job.failed_logs(codes)
    stopped = [line for line in job.lines("w1") if "worker_rank" in line]
    assert stopped and stopped[-1]["stopped"], job.cluster.output("w1")
    assert 30 <= stopped[-1]["steps"] < num_train * EPOCHS // BATCH // 2
    # Every example trained exactly once between the two workers.
    assert job.trained_examples() == num_train * EPOCHS, (
        job.cluster.output("w0"), job.cluster.output("w1"))
    assert job.summary()["test_auc"] > 0.8


def test_uneven_batch_counts_never_hang_bsp(write_config, cluster_factory):
    # 60 batches of 1000 and a partial one: shard 0 gets 31, shard 1 gets 30.
    num_train = 60500
    job = Job(cluster_factory, write_job(write_config, "BSP", num_train=num_train))
    start = time.monotonic()
    codes = job.finish()
    elapsed = time.monotonic() - start
    assert set(codes.values()) == {0}, codes
    assert job.trained_examples() == num_train * EPOCHS
    assert "declared dead" not in job.cluster.log("scheduler")
    steps = {line["worker_rank"]: line["steps"] for n in ("w0", "w1")
             for line in job.lines(n) if "worker_rank" in line}
    assert steps == {0: 31 * EPOCHS, 1: 30 * EPOCHS}, steps
    assert elapsed < 60 * timeout_scale()
