#!/usr/bin/env python3
"""DLRM in PyTorch on the parameter servers: the C++ trainer's DLRM-lite
(worker/models/model.cc) written as a PyTorch user would write it, with its
embeddings in sparse tables (ps.torch.EmbeddingBag) and its MLPs in dense
tables, trained through ps.torch.Trainer.

    PS_SCHEDULER=host:port examples/python/dlrm_torch.py \\
        --config=examples/python/dlrm_async.pbtxt

Architecture (as DLRM-lite): a bottom MLP (13 -> 64 -> 16, ReLU after
every layer) turns the numeric features into one 16-float vector; each of
the 26 categorical fields gives one 16-float embedding (the sum of its bag:
multi-hot fields work unchanged); the 27 vectors' pairwise dot products
(351) and the bottom output feed a top MLP (367 -> 64 -> 1, no ReLU on the
logit). Dense weights start He-normal (std sqrt(2 / fan_in), sqrt(1 /
fan_in) for the logit layer) with zero biases, as InitialDenseParameters
does; the servers apply each table's optimizer (the config's).

The categorical fields are split over several sparse tables, one per group
of fields (FIELD_GROUPS; here fields 0-12, whose vocabularies are the
largest, and fields 13-25), one pull and one push per table per step. All
groups share one width because every vector takes part in the dot
products; a table per group still lets each group have its own optimizer,
learning rate, initializer and admission rule in the config.

Every worker of the job runs this script; the consistency mode (ASYNC, BSP,
SSP) comes from the config alone. With mode ASYNC and training.prefetch the
next batch's rows are pulled before this step's pushes (one more step of
staleness, as the C++ trainer's prefetch). It trains the config's
data.synthetic_ctr examples shard by shard (sess.batches: a replacement
resumes a dead worker's shard; a worker that finishes early takes over
orphaned shards), then the evaluating worker scores the test split and
prints one JSON line (also to --summary_out, default $PS_SUMMARY_OUT: the
file the launchers read the job's summary from).

On SIGTERM or `psctl drain` it finishes the step in progress and leaves with
the exact position of its next batch, exit status 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import sys
import time
from typing import Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

try:
    import ps
except ImportError:  # running from a checkout
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import ps
import ps.data
import ps.metrics
import ps.torch

#: (sparse table, categorical fields it holds) of the synthetic data's 26 fields.
FIELD_GROUPS: Tuple[Tuple[str, Tuple[int, ...]], ...] = (
    ("emb_wide", tuple(range(0, 13))),
    ("emb_narrow", tuple(range(13, 26))),
)
#: Dense tables by parameter-name prefix (ps.torch.Trainer's dense_table=).
DENSE_TABLES = {"bottom.": "bottom_mlp", "top.": "top_mlp"}

#: One group's input: keys int64 (B, F_g) (one id per field), (B, F_g, L)
#: (L ids per field, summed), or (ids int64 (N,), offsets int64 (B * F_g,))
#: with bag b * F_g + j = example b's field j (any number of ids per bag).
GroupInput = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def mlp(widths: Sequence[int], last_relu: bool) -> nn.Sequential:
    """Linear layers widths[0] -> ... -> widths[-1], ReLU after each but
    (unless last_relu) the last, initialised as the C++ model's."""
    layers: List[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(widths[:-1], widths[1:])):
        linear = nn.Linear(fan_in, fan_out)
        relu = i + 2 < len(widths) or last_relu
        # He-normal for layers followed by a ReLU, LeCun-normal for the
        # logit (worker/models/model.cc InitialDenseParameters): torch's
        # default (uniform, std 1/sqrt(3 fan_in)) starts the ReLU stacks
        # with shrinking activations and trains visibly slower here.
        nn.init.normal_(linear.weight, std=math.sqrt((2.0 if relu else 1.0) / fan_in))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DLRM(nn.Module):
    """DLRM-lite: bottom MLP, per-field embedding bags, pairwise dot
    interactions, top MLP. forward(numeric float32 (B, num_numeric), groups:
    one GroupInput per FIELD_GROUPS entry) -> logits float32 (B,).

    Embedding modules are given by table name (bound to a session by
    ps.torch.Trainer), so the same factory also builds the local model of
    ps.torch.load_for_inference. local=True builds plain nn.EmbeddingBag
    tables of `local_rows` rows each instead (for the benchmark's baseline;
    keys must then be row indices).
    """

    def __init__(self, num_numeric: int = 13, embedding_dim: int = 16,
                 bottom: Sequence[int] = (64,), top: Sequence[int] = (64,),
                 groups: Sequence[Tuple[str, Sequence[int]]] = FIELD_GROUPS,
                 local_rows: int = 0) -> None:
        super().__init__()
        self.embedding_dim = dim = embedding_dim
        self.group_sizes = [len(fields) for _, fields in groups]
        if local_rows:
            self.tables = nn.ModuleList(
                nn.EmbeddingBag(local_rows, dim, mode="sum", sparse=True) for _ in groups)
            for t in self.tables:
                nn.init.normal_(t.weight, std=0.1)
        else:
            self.tables = nn.ModuleList(
                ps.torch.EmbeddingBag(name, embedding_dim=dim, mode="sum") for name, _ in groups)
        self.bottom = mlp([num_numeric, *bottom, dim], last_relu=True)
        n = sum(self.group_sizes) + 1  # the fields' vectors and the bottom output
        li, lj = torch.tril_indices(n, n, offset=-1)
        self.register_buffer("li", li, persistent=False)
        self.register_buffer("lj", lj, persistent=False)
        self.top = mlp([dim + n * (n - 1) // 2, *top, 1], last_relu=False)

    def forward(self, numeric: torch.Tensor, groups: Sequence[GroupInput]) -> torch.Tensor:
        b = numeric.shape[0]
        z = self.bottom(numeric)                                  # (B, dim)
        vectors = []
        for table, fields, g in zip(self.tables, self.group_sizes, groups):
            if isinstance(g, tuple):
                ids, offsets = g
                bags = table(ids, offsets)
            else:
                # One bag per (example, field): rows b * F_g + j.
                bags = table(g.reshape(b * fields, -1))
            vectors.append(bags.view(b, fields, self.embedding_dim))
        vectors.append(z.unsqueeze(1))
        t = torch.cat(vectors, dim=1)                             # (B, n, dim)
        dots = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]  # (B, n(n-1)/2)
        return self.top(torch.cat([z, dots], dim=1)).squeeze(1)

    def prefetch(self, groups: Sequence[GroupInput]) -> None:
        """Starts the pulls of a later forward's rows (PS tables only)."""
        for table, fields, g in zip(self.tables, self.group_sizes, groups):
            table.prefetch(g[0] if isinstance(g, tuple) else g)


def group_keys(keys: np.ndarray,
               groups: Sequence[Tuple[str, Sequence[int]]] = FIELD_GROUPS
               ) -> List[torch.Tensor]:
    """The model's per-group inputs of uint64 keys (B, fields): int64 (B, F_g)
    tensors holding the keys' bits."""
    k = torch.from_numpy(keys.view(np.int64))
    return [k[:, list(fields)] if len(fields) != k.shape[1] else k for _, fields in groups]


def batch_inputs(batch: ps.data.CtrBatch) -> Tuple[torch.Tensor, List[torch.Tensor],
                                                   torch.Tensor]:
    """(numeric float32 (B, 13), per-group keys, labels float32 (B,))."""
    return (torch.from_numpy(batch.numeric), group_keys(batch.keys),
            torch.from_numpy(batch.labels))


class Lookahead:
    """A shard's batches, one generated ahead, so the step can prefetch the
    next batch's rows. skip(n) as ps.data.ShardBatches (for resuming)."""

    def __init__(self, batches: ps.data.ShardBatches) -> None:
        self._it = batches
        self._next: Optional[ps.data.CtrBatch] = None
        self._started = False

    def skip(self, n: int) -> None:
        self._it.skip(n)

    def peek(self) -> Optional[ps.data.CtrBatch]:
        """The batch the next __next__ returns (None at the shard's end)."""
        if not self._started:
            self._started = True
            self._next = next(self._it, None)
        return self._next

    def __iter__(self) -> Iterator[ps.data.CtrBatch]:
        return self

    def __next__(self) -> ps.data.CtrBatch:
        batch = self.peek()
        if batch is None:
            raise StopIteration
        self._next = next(self._it, None)
        return batch


def evaluate(model: DLRM, data: ps.data.SyntheticCtr, chunk: int = 8192) -> dict:
    """Scores the test split with the model's current dense values and the
    servers' rows (keys never trained get their initial rows, as the C++
    evaluator's pulls do)."""
    model.eval()
    scores, labels, oracle = [], [], []
    with torch.no_grad():
        for begin in range(0, data.num_test, chunk):
            b = data.fill(1, begin, min(chunk, data.num_test - begin))
            numeric, groups, y = batch_inputs(b)
            scores.append(model(numeric, groups).double().numpy())
            labels.append(b.labels)
            oracle.append(b.true_logits)
    s, y, o = np.concatenate(scores), np.concatenate(labels), np.concatenate(oracle)
    return {"test_auc": ps.metrics.auc(s, y),
            "test_logloss": ps.metrics.logloss(ps.metrics.sigmoid(s), y),
            "oracle_auc": ps.metrics.auc(o, y),
            "oracle_logloss": ps.metrics.logloss(ps.metrics.sigmoid(o), y)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="job config (textproto)")
    parser.add_argument("--scheduler", default=None, help="host:port; default $PS_SCHEDULER")
    parser.add_argument("--summary_out", default=os.environ.get("PS_SUMMARY_OUT", ""),
                        help="the evaluator writes its JSON here; default $PS_SUMMARY_OUT")
    parser.add_argument("--log_every_steps", type=int, default=0,
                        help="print 'step N clock C loss L' every N steps (0: never)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (1: one core per worker, as the C++ "
                             "trainer's default training.threads)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the dense initial values")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    start = time.monotonic()
    sess = ps.init(args.config, args.scheduler)
    data = ps.data.SyntheticCtr(args.config)
    dims = {sess.table(name).dim for name, _ in FIELD_GROUPS}
    if len(dims) != 1:
        raise SystemExit(f"{args.config}: the tables {[n for n, _ in FIELD_GROUPS]} must share "
                         f"one dim (every vector takes part in the dot products); got {dims}")
    if sum(len(f) for _, f in FIELD_GROUPS) != data.num_categorical:
        raise SystemExit(f"{args.config}: FIELD_GROUPS covers {data.num_categorical} fields?")
    torch.manual_seed(args.seed)  # rank 0's values are the ones written
    model = DLRM(num_numeric=data.num_numeric, embedding_dim=dims.pop())
    prefetch = sess.mode == "ASYNC" and sess.prefetch
    trainer = ps.torch.Trainer(sess, model, DENSE_TABLES, prefetch=prefetch,
                               barrier_timeout=300)
    batch_size = sess.training["batch_size"] or 1024
    epochs = sess.training["epochs"] or 1
    k = sess.num_workers
    interleave = bool(sess.training.get("shard_by_batch", False))
    current: List[Lookahead] = []

    def batches_of(shard: int, epoch: int) -> Lookahead:
        it = Lookahead(data.shard_batches(shard, k, batch_size, interleave=interleave))
        current[:] = [it]
        return it

    steps = examples = 0
    loss_value = float("nan")
    train_start = time.monotonic()
    for batch in sess.batches(batches_of, epochs):
        numeric, groups, labels = batch_inputs(batch)
        loss = F.binary_cross_entropy_with_logits(model(numeric, groups), labels)
        upcoming = current[0].peek()
        hint = None
        if upcoming is not None:
            next_groups = group_keys(upcoming.keys)
            hint = lambda: model.prefetch(next_groups)  # noqa: E731
        # Without early prefetch the trainer calls hint after end_step, and
        # under BSP/SSP the pulls wait for the step there as any pull does.
        trainer.step(loss, prefetch=hint)
        steps += 1
        examples += len(batch)
        loss_value = float(loss.detach())
        if args.log_every_steps and steps % args.log_every_steps == 0:
            print(f"step {steps} clock {sess.clock} loss {loss_value:.4f}", flush=True)
    trainer.close()                        # removes the dense-sync hook, waits for pushes
    train_seconds = time.monotonic() - train_start

    if sess.stop_requested:                # SIGTERM or drain: hand the rest over
        sess.close()
        print(f"stopped after {steps} steps", flush=True)
        return 0
    if sess.finish():                      # True on the one worker that evaluates
        trainer.pull_dense()               # every worker's last pushes are in now
        summary = {"model": "DLRM-torch", "mode": sess.mode, "workers": k,
                   "servers": sess.num_servers, "evaluator_rank": sess.rank,
                   "prefetch": trainer.prefetch_early,
                   "steps": steps, "examples": examples,
                   "seconds": round(train_seconds, 2),
                   "examples_per_s": round(examples / max(train_seconds, 1e-9)),
                   "startup_seconds": round(train_start - start, 2),
                   "last_loss": loss_value,
                   "prefetch_hits": sum(t.prefetch_hits for t in model.tables),
                   "pulls": sum(t.pulls for t in model.tables)}
        summary.update(evaluate(model, data))
        line = json.dumps(summary)
        print(line, flush=True)
        if args.summary_out:
            pathlib.Path(args.summary_out).write_text(line + "\n")
    sess.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
