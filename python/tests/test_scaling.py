"""The Python examples train on while their job is scaled live, with real
processes on loopback.

The NumPy LR example (examples/python/lr_numpy.py, two workers, in BSP and
in ASYNC) and the PyTorch DLRM example (examples/python/dlrm_torch.py
through ps.torch, two workers, BSP) each train an elastic job (`cluster {
num_servers: 2 elastic { max_servers: 4 } }`); two spare servers join, `psctl scale --servers=4 --wait` moves half the
slots onto them once the workers are some steps in, and `psctl scale
--servers=3 --remove=1 --wait` empties server 1 (which leaves) some steps
later. Every process must exit 0, the workers must train every example
once, and the test AUC must be within 0.005 of an undisturbed run of the
same config in the same test.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import time
from typing import Dict, List, Tuple

import pytest

import ps.testing

from conftest import timeout_scale

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"
EXAMPLE = str(EXAMPLES / "lr_numpy.py")

NUM_TRAIN = 120000
BATCH = 1000
#: Long enough that the scale-in (three moves, then a drain) ends before
#: training does also on a loaded sanitizer run, where ASYNC's workers outran
#: it with 4 epochs.
EPOCHS = 5
#: Steps each worker trains: NUM_TRAIN / BATCH / 2 workers per epoch.
STEPS = NUM_TRAIN // BATCH // 2 * EPOCHS

CONFIG = f"""
name: "py-scaling"
cluster {{ num_servers: 2 num_workers: 2 num_slots: 256
          heartbeat_interval_ms: 100 heartbeat_timeout_ms: 3000
          request_timeout_ms: 60000
          elastic {{ max_servers: 4 }} }}
consistency {{ mode: MODE }}
tables {{ id: 0 name: "ctr_sparse" sparse {{ dim: 1 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 1e-6 }} }}
         init {{ kind: ZEROS }} }}
tables {{ id: 1 name: "ctr_dense" dense {{ size: 14 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 1e-6 }} }}
         init {{ kind: ZEROS }} }}
data {{ synthetic_ctr {{ num_train: {NUM_TRAIN} num_test: 20000 seed: 3 }} }}
training {{ batch_size: {BATCH} epochs: {EPOCHS} }}
"""


class Job:
    """A job of the config's 2 servers and two workers running `script`
    (an example that prints "step N ..." with --log_every_steps=1)."""

    def __init__(self, cluster_factory, config: str, script: str = EXAMPLE) -> None:
        self.cluster = cluster_factory(config)
        self.workers = ["w0", "w1"]
        for name in self.workers:
            self.cluster.python_worker(name, script,
                                       [f"--config={config}", "--log_every_steps=1"])

    def psctl(self, *args: str, timeout: float = 120) -> str:
        """Runs psctl against this job; its stdout. Fails the test unless it
        exits 0."""
        out = subprocess.run(
            [ps.testing.binary("psctl"), f"--scheduler={self.cluster.scheduler}",
             f"--timeout_ms={int(timeout * 1000)}", *args],
            capture_output=True, text=True, timeout=timeout * timeout_scale() + 30)
        assert out.returncode == 0, (f"psctl {' '.join(args)}: exit {out.returncode}\n"
                                     f"{out.stdout}{out.stderr}\n{self.tails()}")
        return out.stdout

    def steps(self, name: str) -> int:
        """The last step worker `name` printed (0 before the first)."""
        found = re.findall(r"^step (\d+) ", self.cluster.output(name), re.M)
        return int(found[-1]) if found else 0

    def wait_for_step(self, step: int, timeout: float = 60) -> None:
        """Waits until both workers printed `step`."""
        deadline = time.monotonic() + timeout * timeout_scale()
        while min(self.steps(n) for n in self.workers) < step:
            for n in self.workers:
                if self.cluster.procs[n].poll() is not None:
                    raise AssertionError(f"{n} exited before step {step}:\n{self.tails()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the workers never reached step {step}:\n{self.tails()}")
            time.sleep(0.02)

    def wait_for_spares(self, count: int, timeout: float = 30) -> str:
        """Waits until psctl status lists `count` spare servers; its output."""
        deadline = time.monotonic() + timeout * timeout_scale()
        while True:
            status = self.psctl("status")
            if status.count("spare (no slots)") == count:
                return status
            assert time.monotonic() < deadline, f"no {count} spares:\n{status}"
            time.sleep(0.1)

    def finish(self, timeout: float = 120) -> Dict[str, int]:
        """Waits for every process; their exit codes by name."""
        try:
            return self.cluster.wait_all(timeout=timeout * timeout_scale())
        except subprocess.TimeoutExpired:
            raise AssertionError("the job hung:\n" + self.tails())

    def lines(self, name: str) -> List[dict]:
        return [json.loads(line) for line in self.cluster.output(name).splitlines()
                if line.startswith("{")]

    def summary(self) -> dict:
        """The evaluator's JSON summary (test_auc: float in [0, 1])."""
        for name in self.workers:
            for line in self.lines(name):
                if "test_auc" in line:
                    return line
        raise AssertionError("no summary:\n" + self.tails())

    def trained_examples(self) -> int:
        return sum(line["examples"] for name in self.workers for line in self.lines(name)
                   if "worker_rank" in line)

    def tails(self) -> str:
        return "\n".join(f"---- {n}\n{self.cluster.log(n)[-2000:]}{self.cluster.output(n)[-500:]}"
                         for n in self.cluster.procs)


def scale_out_and_in(job: Job, steps: int) -> Tuple[int, int]:
    """Two spares join; once the workers are steps/9 steps in, 2 -> 4
    servers, steps/9 steps later 4 -> 3 (rank 1 leaves); checks psctl
    status after each. Returns the workers' steps after each scale."""
    for _ in range(2):
        job.cluster.start_server()
    job.wait_for_spares(2)
    job.wait_for_step(steps // 9)
    out = job.psctl("scale", "--servers=4", "--wait")
    print(out)
    scaled_out_at = min(job.steps(n) for n in job.workers)
    assert scaled_out_at < steps, "the job was done before the scale-out ended"
    status = job.psctl("status")
    assert "spare" not in status, status
    assert len(re.findall(r"server rank \d+\s+ALIVE.*slots \d+", status)) == 4, status
    job.wait_for_step(scaled_out_at + steps // 9)
    out = job.psctl("scale", "--servers=3", "--remove=1", "--wait")
    print(out)
    scaled_in_at = min(job.steps(n) for n in job.workers)
    assert scaled_in_at < steps, "the job was done before the scale-in ended"
    status = job.psctl("status")
    live = re.findall(r"server rank (\d+)\s+ALIVE.*slots \d+", status)
    assert sorted(int(r) for r in live) == [0, 2, 3], status
    return scaled_out_at, scaled_in_at


@pytest.mark.parametrize("mode", ["BSP", "ASYNC"])
def test_lr_numpy_trains_through_scale_out_and_in(write_config, cluster_factory,
                                                   mode: str) -> None:
    t0 = time.monotonic()
    config = write_config(CONFIG.replace("MODE", mode), f"{mode}.pbtxt")
    reference = Job(cluster_factory, config)
    codes = reference.finish()
    assert set(codes.values()) == {0}, (codes, reference.tails())
    assert reference.trained_examples() == NUM_TRAIN * EPOCHS
    reference_auc = reference.summary()["test_auc"]
    t1 = time.monotonic()

    job = Job(cluster_factory, config)
    scaled_out_at, scaled_in_at = scale_out_and_in(job, STEPS)

    codes = job.finish()
    t2 = time.monotonic()
    assert set(codes.values()) == {0}, (codes, job.tails())
    assert len(codes) == 1 + 4 + 2  # scheduler, 4 servers, 2 workers
    assert job.trained_examples() == NUM_TRAIN * EPOCHS
    auc = job.summary()["test_auc"]
    print(f"{mode}: undisturbed AUC {reference_auc:.5f} ({t1 - t0:.1f} s); scaled 2 -> 4 at step "
          f"{scaled_out_at}, 4 -> 3 at step {scaled_in_at} of {STEPS}: AUC {auc:.5f} "
          f"({t2 - t1:.1f} s)")
    assert abs(auc - reference_auc) <= 0.005, (auc, reference_auc)


DLRM_TRAIN = 200_000
DLRM_BATCH = 512
#: Steps each worker trains (shard_by_batch: every other batch, 1 epoch).
DLRM_STEPS = -(-DLRM_TRAIN // DLRM_BATCH) // 2


def test_dlrm_torch_trains_through_scale_out_and_in(write_config, cluster_factory) -> None:
    text = (EXAMPLES / "dlrm_bsp.pbtxt").read_text()
    text = re.sub(r"num_train:\s*\d+", f"num_train: {DLRM_TRAIN}", text)
    text = re.sub(r"num_test:\s*\d+", "num_test: 20000", text)
    text = re.sub(r"batch_size:\s*\d+", f"batch_size: {DLRM_BATCH}", text)
    text = re.sub(r"cluster \{[^}]*\}", """cluster {
  num_servers: 2 num_workers: 2 num_slots: 256
  heartbeat_interval_ms: 100 heartbeat_timeout_ms: 3000
  request_timeout_ms: 60000
  elastic { max_servers: 4 }
}""", text, count=1)
    assert "elastic" in text and f"num_train: {DLRM_TRAIN}" in text
    config = write_config(text, "dlrm.pbtxt")
    script = str(EXAMPLES / "dlrm_torch.py")
    t0 = time.monotonic()
    reference = Job(cluster_factory, config, script)
    codes = reference.finish(timeout=240)
    assert set(codes.values()) == {0}, (codes, reference.tails())
    reference_auc = reference.summary()["test_auc"]
    t1 = time.monotonic()

    job = Job(cluster_factory, config, script)
    scaled_out_at, scaled_in_at = scale_out_and_in(job, DLRM_STEPS)
    codes = job.finish(timeout=240)
    t2 = time.monotonic()
    assert set(codes.values()) == {0}, (codes, job.tails())
    assert len(codes) == 1 + 4 + 2  # scheduler, 4 servers, 2 workers
    summary = job.summary()
    assert summary["model"] == "DLRM-torch" and summary["mode"] == "BSP", summary
    auc = summary["test_auc"]
    print(f"DLRM-torch BSP: undisturbed AUC {reference_auc:.5f} ({t1 - t0:.1f} s); scaled "
          f"2 -> 4 at step {scaled_out_at}, 4 -> 3 at step {scaled_in_at} of {DLRM_STEPS}: "
          f"AUC {auc:.5f} ({t2 - t1:.1f} s)")
    # It learned (an untrained model scores 0.5; one epoch of this much
    # data reaches about 0.79), so agreeing is not agreeing on failure.
    assert reference_auc > 0.75, reference_auc
    assert abs(auc - reference_auc) <= 0.005, (auc, reference_auc)
