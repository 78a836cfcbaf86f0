"""A ps.torch worker process for python/tests/test_checkpoint.py: trains
helpers/torch_ctr.py's model on its interleaved shard of the job's synthetic
CTR data (the config's batch size, one epoch), in one of two phases.

    ckpt_worker.py first  CONFIG OUT_DIR CHECKPOINT_DIR REQUEST_AT
    ckpt_worker.py resume CONFIG OUT_DIR [nobarrier]

first: rank 0 asks for a checkpoint (Session.checkpoint()) once its clock is
  REQUEST_AT and writes the clock C it answered to OUT_DIR/requested.json.
  Under BSP rank 0 also records, at clock C, the rows of every key the job
  trained in steps < C and the whole dense table (a BSP pull at clock C sees
  exactly the steps < C applied) in OUT_DIR/at_clock.npz. Every worker keeps
  training until a checkpoint under CHECKPOINT_DIR is committed (its
  MANIFEST exists) and then holds (OUT_DIR/holding-RANK), never finishing:
  the test kills the whole job there. A worker whose shard runs out first
  exits with status 3.

resume: the job was restored from a checkpoint. The workers meet at a
  barrier before any trains (not with nobarrier); each writes what its
  session says then (OUT_DIR/start-RANK.json: start_clock, resumed,
  position), trains the rest of its shard, and writes
  OUT_DIR/done-RANK.json (steps trained). The evaluator scores the test
  split with the PS-backed model (OUT_DIR/eval.json with the AUC,
  OUT_DIR/scores.npy) and exports it (OUT_DIR/model.pt).

The scheduler comes from $PS_SCHEDULER (ps.testing.LocalCluster.python_worker).
"""

from __future__ import annotations

import glob
import json
import os
import pathlib
import sys
import time
from typing import Any, Optional

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.metrics  # noqa: E402
import ps.torch  # noqa: E402

from helpers import torch_ctr  # noqa: E402

#: Exit status of a first-phase worker whose shard ended before it could hold.
RAN_OUT = 3
#: Seconds rank 0 waits before asking for the checkpoint: three heartbeats
#: of the test's config (heartbeat_interval_ms: 100).
HEARTBEAT_WAIT = 0.35
#: Seconds each first-phase worker pauses after a step, times slowdown(). It
#: bounds the pace (so the checkpoint, placed about three heartbeats of steps
#: ahead, falls well inside the shards), above all under ASYNC, where rank 1
#: keeps training while rank 0 waits for the heartbeats. Scaled as that wait
#: is: under TSan (8x) an unscaled pause let rank 1 run 260 steps ahead
#: during rank 0's 2.8 s wait, and the checkpoint fell at clock 288 of 300.
STEP_PAUSE = 0.005


def slowdown() -> float:
    """How much longer to wait under sanitizers (python/tests/conftest.py)."""
    scale = float(os.environ.get("PS_TIMEOUT_SCALE", "1") or 1)
    return max(scale, 3.0) if os.environ.get("PS_SANITIZER") else scale


def write_json(path: pathlib.Path, value: Any) -> None:
    """Writes `value` as JSON atomically (the test polls for these files)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    os.replace(tmp, path)


def committed(checkpoint_dir: str) -> bool:
    """True once some checkpoint under `checkpoint_dir` has its MANIFEST."""
    return bool(glob.glob(os.path.join(checkpoint_dir, "ckpt-*", "MANIFEST")))


def record_at_clock(sess: ps.Session, data: ps.data.SyntheticCtr, clock: int,
                    out: pathlib.Path) -> None:
    """BSP, at `clock`: saves the rows of every key of the steps < clock of
    all shards (global batches 0..k*clock-1 under interleaving) and the dense
    table, pulled at this worker's clock, so exactly those steps are in."""
    assert sess.clock == clock, (sess.clock, clock)
    n = min(sess.num_workers * clock * int(sess.training["batch_size"]), data.num_train)
    keys = np.unique(data.fill(0, 0, n).keys.reshape(-1))
    rows = sess.table("emb").pull(keys)
    dense = sess.table("dense").pull()
    tmp = out / "at_clock.tmp.npz"
    np.savez(tmp, clock=clock, keys=keys, rows=rows.result(), dense=dense.result())
    os.replace(tmp, out / "at_clock.npz")


def hold(out: pathlib.Path, rank: int) -> None:
    """Says so and waits to be killed (the job must still be running then)."""
    (out / f"holding-{rank}").write_text("")
    while True:
        time.sleep(0.1)


def first(config: str, out: pathlib.Path, checkpoint_dir: str, request_at: int) -> int:
    """Trains, asks for a checkpoint at `request_at` (rank 0), and holds
    once a checkpoint is committed."""
    sess = ps.init(config)
    model = torch_ctr.ps_net()
    trainer = ps.torch.Trainer(sess, model, "dense")
    data = ps.data.SyntheticCtr(config)
    k, b = sess.num_workers, int(sess.training["batch_size"])
    clock: Optional[int] = None
    recorded = sess.mode != "BSP"
    pause = STEP_PAUSE * slowdown()
    for batch in sess.batches(lambda shard, epoch: data.shard_batches(shard, k, b)):
        trainer.step(torch_ctr.loss_of(model, batch))
        time.sleep(pause)
        if sess.rank == 0 and clock is None and sess.clock == request_at:
            at = sess.clock
            # The scheduler places the checkpoint a margin past the workers'
            # clocks as their heartbeats last reported them; the request
            # does not carry this worker's clock. Let a few heartbeats
            # (100 ms apart) report it first, or the clock answered may be
            # one this worker already passed (then abandoned, and retried
            # at another clock this worker is never told of).
            trainer.wait()
            time.sleep(HEARTBEAT_WAIT * slowdown())
            clock = sess.checkpoint()
            write_json(out / "requested.json", {"clock": clock, "asked_at": at})
            if clock <= at:
                print(f"checkpoint clock {clock} is not ahead of this worker's {at}",
                      file=sys.stderr, flush=True)
                return 2
        if sess.rank == 0 and not recorded and clock is not None and sess.clock == clock:
            trainer.wait()
            record_at_clock(sess, data, clock, out)
            recorded = True
        if committed(checkpoint_dir) and (sess.rank != 0 or recorded):
            trainer.wait()
            hold(out, sess.rank)
    print(f"rank {sess.rank}: the shard ended after {trainer.steps} steps before a "
          "checkpoint was committed", file=sys.stderr, flush=True)
    return RAN_OUT


def resume(config: str, out: pathlib.Path, meet: bool = True) -> int:
    """Reports where the restored session starts, trains the rest, and the
    evaluator scores the test split and exports the model. meet=False
    leaves out the barrier before training."""
    sess = ps.init(config)
    # A restored job does not wait for its workers (Session.batches meets
    # only in a fresh job): the first to join would train alone (even under
    # BSP) and a later one would join at the job's clock then, not at the
    # checkpoint's. Meet before anyone trains.
    if meet:
        sess.barrier("restored")
    p = sess.position
    write_json(out / f"start-{sess.rank}.json", {
        "rank": sess.rank, "start_clock": sess.start_clock, "resumed": sess.resumed,
        "position": None if p is None else [p.shard, p.epoch, p.batch, p.done]})
    model = torch_ctr.ps_net(seed=1000 + sess.rank)  # restored values must win
    trainer = ps.torch.Trainer(sess, model, "dense")
    data = ps.data.SyntheticCtr(config)
    k, b = sess.num_workers, int(sess.training["batch_size"])
    for batch in sess.batches(lambda shard, epoch: data.shard_batches(shard, k, b)):
        trainer.step(torch_ctr.loss_of(model, batch))
    trainer.wait()
    write_json(out / f"done-{sess.rank}.json", {"steps": trainer.steps,
                                                "nonfinite": trainer.nonfinite_steps})
    if sess.finish():
        trainer.pull_dense()  # every worker's last steps (ASYNC: after this one's)
        test = data.fill(1, 0, data.num_test)
        keys, numeric, labels = torch_ctr.batch_tensors(test)
        model.eval()
        with torch.no_grad():
            scores = model(keys, numeric).numpy()
        np.save(out / "scores.npy", scores)
        trainer.export(str(out / "model.pt"))
        write_json(out / "eval.json", {"auc": ps.metrics.auc(scores, test.labels),
                                       "rank": sess.rank})
    sess.close()
    return 0


def main() -> int:
    phase = sys.argv[1]
    if phase == "first":
        return first(sys.argv[2], pathlib.Path(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    if phase == "resume":
        meet = len(sys.argv) < 5 or sys.argv[4] != "nobarrier"
        return resume(sys.argv[2], pathlib.Path(sys.argv[3]), meet)
    raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    sys.exit(main())
