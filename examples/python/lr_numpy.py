#!/usr/bin/env python3
"""Logistic regression in NumPy on the parameter servers: the demo's model
(one weight per categorical id in table ctr_sparse, 13 numeric weights and a
bias in ctr_dense), written by hand as a user would write their own model.

    PS_SCHEDULER=host:port examples/python/lr_numpy.py --config=examples/ctr/async.pbtxt

Every worker of the job runs this script. The consistency mode (ASYNC, BSP,
SSP) comes from the config alone; the script is the same. It trains the
synthetic CTR data of the config's data.synthetic_ctr block, shard by shard
(a replacement worker resumes a dead one's shard, a worker that finishes
early takes over orphaned shards), then the evaluating worker scores the
test split and prints one JSON line (also to --summary_out, default
$PS_SUMMARY_OUT: the file the launchers read the job's summary from).

On SIGTERM or `psctl drain` it finishes the step in progress and leaves with
the exact position of its next batch, exit status 0.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

try:
    import ps
except ImportError:  # running from a checkout
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "python"))
    import ps
import ps.data
import ps.metrics


def step(sess: ps.Session, sparse: ps.SparseTable, dense: ps.DenseTable,
         batch: ps.data.CtrBatch) -> float:
    """One step on `batch`; returns its mean log loss."""
    n, fields = batch.keys.shape
    # One gradient per distinct key: a key listed twice in a push is applied
    # twice by the servers' optimizer.
    uniq, inv = np.unique(batch.keys.reshape(-1), return_inverse=True)
    pulled_w, pulled_d = sparse.pull(uniq), dense.pull()   # both in flight at once
    w, d = pulled_w.result()[:, 0], pulled_d.result()
    z = w[inv].reshape(n, fields).sum(axis=1) + batch.numeric @ d[:-1] + d[-1]
    p = ps.metrics.sigmoid(z)
    g = (p - batch.labels) / n                       # d(mean log loss) / dz
    grad_w = np.bincount(inv, weights=np.repeat(g, fields), minlength=uniq.size)
    sparse.push(uniq, grad_w[:, None])
    dense.push(np.append(batch.numeric.T @ g, g.sum()))
    loss = ps.metrics.logloss(p, batch.labels)
    sess.end_step(examples=n, loss=loss)             # once per step, any mode; feeds /status
    return loss


def evaluate(sparse: ps.SparseTable, dense: ps.DenseTable, data: ps.data.SyntheticCtr,
             chunk: int = 16384) -> dict:
    """Scores the test split with the servers' current parameters."""
    d = dense.pull().result()
    scores, labels, oracle = [], [], []
    for begin in range(0, data.num_test, chunk):
        b = data.fill(1, begin, min(chunk, data.num_test - begin))
        uniq, inv = np.unique(b.keys.reshape(-1), return_inverse=True)
        w = sparse.pull(uniq).result()[:, 0]
        scores.append(w[inv].reshape(b.keys.shape).sum(axis=1) + b.numeric @ d[:-1] + d[-1])
        labels.append(b.labels)
        oracle.append(b.true_logits)
    s, y, o = np.concatenate(scores), np.concatenate(labels), np.concatenate(oracle)
    return {"test_auc": ps.metrics.auc(s, y),
            "test_logloss": ps.metrics.logloss(ps.metrics.sigmoid(s), y),
            "oracle_auc": ps.metrics.auc(o, y)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="job config (textproto)")
    parser.add_argument("--scheduler", default=None, help="host:port; default $PS_SCHEDULER")
    parser.add_argument("--summary_out", default=os.environ.get("PS_SUMMARY_OUT", ""),
                        help="the evaluator writes its JSON here; default $PS_SUMMARY_OUT")
    parser.add_argument("--sparse_table", default="ctr_sparse")
    parser.add_argument("--dense_table", default="ctr_dense")
    parser.add_argument("--log_every_steps", type=int, default=0,
                        help="print 'step N clock C' every N steps (0: never)")
    args = parser.parse_args()

    start = time.monotonic()
    sess = ps.init(args.config, args.scheduler)
    print(f"joined as worker {sess.rank} of {sess.num_workers} ({sess.mode}), at clock "
          f"{sess.start_clock}, position {sess.position}", flush=True)
    sparse, dense = sess.table(args.sparse_table), sess.table(args.dense_table)
    data = ps.data.SyntheticCtr(args.config)
    if dense.size != data.num_numeric + 1 or sparse.dim != 1:
        raise SystemExit(f"{args.config}: this model needs a sparse table of dim 1 and a "
                         f"dense table of {data.num_numeric + 1} (numeric weights, bias)")
    batch_size = sess.training["batch_size"] or 1024
    epochs = sess.training["epochs"] or 1
    k = sess.num_workers

    # A fresh job starts from the tables' initial values (config `init`), so
    # no worker has to write initial values and nobody waits for anyone.
    def batches_of(shard: int, epoch: int) -> ps.data.ShardBatches:
        return data.shard_batches(shard, k, batch_size, interleave=True)

    steps = examples = 0
    loss = float("nan")
    for batch in sess.batches(batches_of, epochs):
        loss = step(sess, sparse, dense, batch)
        steps += 1
        examples += len(batch)
        if args.log_every_steps and steps % args.log_every_steps == 0:
            print(f"step {steps} clock {sess.clock} loss {loss:.4f}", flush=True)
    train_seconds = time.monotonic() - start

    # What this worker trained, for tools and tests (every example once in a
    # job without failures, also when a worker was stopped and another took
    # over the rest of its shard).
    print(json.dumps({"worker_rank": sess.rank, "steps": steps, "examples": examples,
                      "stopped": sess.stop_requested}), flush=True)
    if sess.stop_requested:               # SIGTERM or drain: hand the rest over
        sess.close()
        return 0
    if sess.finish():                     # True on the one worker that evaluates
        summary = {"model": "LR-numpy", "mode": sess.mode, "workers": k,
                   "servers": sess.num_servers, "evaluator_rank": sess.rank,
                   "steps": steps, "examples": examples,
                   "seconds": round(train_seconds, 2),
                   "examples_per_s": round(examples / max(train_seconds, 1e-9)),
                   "last_loss": loss}
        summary.update(evaluate(sparse, dense, data))
        for name in ("test_auc", "test_logloss"):   # curves metric/<name> on /status
            if np.isfinite(summary[name]):
                sess.report_metric(name, summary[name])
        line = json.dumps(summary)
        print(line, flush=True)
        if args.summary_out:
            pathlib.Path(args.summary_out).write_text(line + "\n")
    sess.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
