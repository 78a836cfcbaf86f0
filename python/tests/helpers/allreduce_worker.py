"""A ps.torch worker process for python/tests/test_allreduce.py: trains an
MLP (all dense: table "mlp") on the numeric features of the job's synthetic
CTR data, one epoch of its shard at the config's batch size, with
ps.torch.Trainer and no DDP wrapper, whatever the table's dense.sync.

    allreduce_worker.py CONFIG OUT_DIR NAME [STEP_SLEEP_S [CHECKPOINT_AT]]

The scheduler comes from $PS_SCHEDULER (ps.testing.LocalCluster). A worker
that finds every rank taken (a replacement started before the scheduler
declared the one it replaces dead) tries again for up to 30 s. Prints
"step N" after each step and, at the end, one JSON line: name, rank, steps,
first_ring (the replica's step and ring size after the first step; null
without all-reduce), ring_step (the replica's step at the end). Writes
OUT_DIR/replica-NAME.npy (the replica after the last step, all-reduce
only; its optimizer state in replica-state-NAME.npy) and, on the
evaluator, OUT_DIR/servers.npy (the servers' final dense values, read
through the trainer after finish; their optimizer state, when the table
keeps one, in servers-state.npy). With CHECKPOINT_AT, rank 0 asks for a
checkpoint after that many steps and saves its replica (values, then
optimizer state) at the checkpoint's clock in OUT_DIR/at-checkpoint.npy; a
worker of a job restored from a checkpoint saves its replica as it starts
in OUT_DIR/restored-NAME.npy.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

HIDDEN = (64, 32)


def mlp(num_numeric: int) -> nn.Sequential:
    """num_numeric -> 64 -> 32 -> 1, tanh between (3201 floats for 16 inputs)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(num_numeric, HIDDEN[0]), nn.Tanh(),
                         nn.Linear(HIDDEN[0], HIDDEN[1]), nn.Tanh(),
                         nn.Linear(HIDDEN[1], 1))


def dense_size(num_numeric: int) -> int:
    """Floats of mlp(num_numeric)'s parameters."""
    a, b = HIDDEN
    return num_numeric * a + a + a * b + b + b + 1


def start(config: str) -> ps.Session:
    deadline = time.monotonic() + 30
    while True:
        try:
            return ps.init(config)
        except ps.ResourceExhausted:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def replica(ring: "ps.AllReducedDense") -> np.ndarray:
    """The replica's values, then its optimizer state, as one float32 array."""
    return np.concatenate([ring.values(), ring.optimizer_state().reshape(-1)])


def flat(model: nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def main() -> int:
    config, out_dir, name = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
    pause = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    checkpoint_at = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    torch.set_num_threads(1)
    sess = start(config)
    print(f"joined as worker {sess.rank}", flush=True)
    data = ps.data.SyntheticCtr(config)
    model = mlp(data.num_numeric)
    # The job's only dense table: "mlp" (not its optimizer state's companion
    # table, "mlp.allreduce_state", which an all-reduced Adam table has).
    trainer = ps.torch.Trainer(sess, model)
    ring = sess.dense_allreduce
    if ring is not None and sess.restored_start:
        np.save(out_dir / f"restored-{name}.npy", replica(ring))
    batch_size, k = sess.training["batch_size"], sess.num_workers
    steps, first_ring, cut = 0, None, 0
    for batch in sess.batches(lambda shard, epoch: data.shard_batches(shard, k, batch_size)):
        logits = model(torch.from_numpy(batch.numeric)).squeeze(1)
        trainer.step(F.binary_cross_entropy_with_logits(logits, torch.from_numpy(batch.labels)))
        steps += 1
        if steps == 1 and ring is not None:
            first_ring = {"step": ring.step, "ring_size": ring.ring_size}
        print(f"step {steps}", flush=True)
        if checkpoint_at and steps == checkpoint_at and sess.rank == 0 and not sess.resumed:
            cut = sess.checkpoint()
        if cut and sess.clock == cut:
            np.save(out_dir / "at-checkpoint.npy", replica(ring))
        if pause:
            time.sleep(pause)
    trainer.close()
    if ring is not None:
        np.save(out_dir / f"replica-{name}.npy", ring.values())
        np.save(out_dir / f"replica-state-{name}.npy", ring.optimizer_state().reshape(-1))
    line = {"name": name, "rank": sess.rank, "steps": steps, "first_ring": first_ring,
            "ring_step": ring.step if ring is not None else None}
    if sess.finish():
        trainer.pull_dense()  # the servers' final values
        np.save(out_dir / "servers.npy", flat(model))
        if "mlp.allreduce_state" in sess.table_names:
            np.save(out_dir / "servers-state.npy",
                    sess.table("mlp.allreduce_state").pull().result())
    print(json.dumps(line), flush=True)
    sess.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
