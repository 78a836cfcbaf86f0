#!/usr/bin/python3
"""The Python binding's cost: `tests/bench.sh python`.

Figures (one JSON line each, in tests/bench.sh's format):

  python_ps_dlrm_b512_examples_per_s_per_core: examples/python/dlrm_torch.py
    as the one worker of a job with one server on loopback (ASYNC, batch
    512, training.prefetch, torch on one thread), from its summary
    (training only, data generation included). Baseline: plain_torch.
  plain_torch_dlrm_b512_examples_per_s_per_core: the same model class (its
    tables as in-memory nn.EmbeddingBag, sparse Adagrad on them and Adam on
    the MLPs, the servers' optimizers) trained on the same synthetic
    batches by one PyTorch process on one thread, measured in this run.
  cpp_dlrm_b512_examples_per_s_per_core: the C++ trainer's DLRM-lite
    (worker/trainer) on the same job, from its summary.
  pull_1key_round_trip_us: a pull of one key (table.pull(k).result()) on the
    one-server job, mean over many calls.
  ctypes_noop_call_us: a call of a C function that does nothing
    (ps_abi_version) through the binding's ctypes library object.

Ends with {"bench":"python","summary":{...}} holding every figure and the
ratio python_ps / plain_torch (target >= 0.8). Usage:

  tests/bench/python_bench.py [--num_train=300000] [--seconds=8]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import tempfile
import time
from typing import Optional

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(ROOT / "examples" / "python"))

import ps  # noqa: E402
import ps._native  # noqa: E402
import ps.data  # noqa: E402
import ps.testing  # noqa: E402

BATCH = 512


def emit(metric: str, value: float, unit: str, baseline: Optional[float] = None) -> None:
    ratio = round(value / baseline, 3) if baseline else None
    print(json.dumps({"bench": "python", "metric": metric, "value": round(value, 3),
                      "unit": unit, "baseline": None if baseline is None else round(baseline),
                      "ratio": ratio}), flush=True)


def job_config(num_train: int) -> str:
    """examples/python/dlrm_async.pbtxt with one server and one worker."""
    text = (ROOT / "examples" / "python" / "dlrm_async.pbtxt").read_text()
    text = re.sub(r"num_servers:\s*\d+", "num_servers: 1", text)
    text = re.sub(r"num_workers:\s*\d+", "num_workers: 1", text)
    text = re.sub(r"num_train:\s*\d+", f"num_train: {num_train}", text)
    text = re.sub(r"num_test:\s*\d+", "num_test: 2048", text)
    return text


def cpp_config(text: str) -> str:
    """The same job for the C++ trainer's DLRM-lite (one sparse table)."""
    text = re.sub(r"tables {.*?\n}\n", "", text, flags=re.S)
    tables = """
tables { id: 0 name: "embeddings" sparse { dim: 16 }
         optimizer { adagrad { learning_rate: 0.3 initial_accumulator: 1e-6 } }
         init { kind: NORMAL scale: 0.1 } }
tables { id: 1 name: "mlp" dense { size: 0 } optimizer { adam { learning_rate: 0.01 } } }
"""
    text = text.replace("data {", tables + "data {", 1)
    return re.sub(r"training {", 'training {\n  sparse_table: "embeddings" dense_table: "mlp"\n'
                  '  model { kind: DLRM embedding_dim: 16 bottom_mlp: 64 top_mlp: 64 }', text)


def run_job(config: str, python: bool) -> dict:
    """Runs the one-worker job; returns the worker's JSON summary."""
    with ps.testing.LocalCluster(config) as c:
        out = pathlib.Path(c.dir) / "summary.json"
        if python:
            c.python_worker("w", str(ROOT / "examples" / "python" / "dlrm_torch.py"),
                            [f"--config={config}", f"--summary_out={out}"])
        else:
            c.start_process("w", [ps.testing.binary("trainer"), f"--config={config}",
                                  f"--scheduler={c.scheduler}", f"--summary_out={out}",
                                  "--log_level=warn"])
        codes = c.wait_all(timeout=600)
        if any(codes.values()):
            raise RuntimeError(f"exit codes {codes}: {c.log('w')[-2000:]}")
        return json.loads(out.read_text())


def plain_torch(config: str, seconds: float) -> float:
    """Examples/s of the same DLRM in plain PyTorch on one thread."""
    import torch
    import torch.nn.functional as F
    import dlrm_torch
    torch.set_num_threads(1)
    torch.manual_seed(1)
    rows = 1 << 20  # keys map to rows by their low bits: cheap, nearly collision-free here
    model = dlrm_torch.DLRM(local_rows=rows)
    sparse = [p for n, p in model.named_parameters() if n.startswith("tables.")]
    dense = [p for n, p in model.named_parameters() if not n.startswith("tables.")]
    opt_sparse = torch.optim.Adagrad(sparse, lr=0.3, initial_accumulator_value=1e-6)
    opt_dense = torch.optim.Adam(dense, lr=0.01)
    data = ps.data.SyntheticCtr(config)
    batches = iter(data.shard_batches(0, 1, BATCH))

    def step() -> None:
        nonlocal batches
        b = next(batches, None)
        if b is None:  # a pass over the data is shorter than the timed run: go again
            batches = iter(data.shard_batches(0, 1, BATCH))
            b = next(batches)
        idx = torch.from_numpy((b.keys & np.uint64(rows - 1)).astype(np.int64))
        groups = [idx[:, list(f)] for _, f in dlrm_torch.FIELD_GROUPS]
        loss = F.binary_cross_entropy_with_logits(
            model(torch.from_numpy(b.numeric), groups), torch.from_numpy(b.labels))
        opt_sparse.zero_grad()
        opt_dense.zero_grad()
        loss.backward()
        opt_sparse.step()
        opt_dense.step()

    for _ in range(10):
        step()
    n = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    return n * BATCH / (time.perf_counter() - start)


def binding_overheads(config: str, calls: int = 3000) -> tuple:
    """(µs per 1-key pull round trip, µs per no-op ctypes call)."""
    with ps.testing.LocalCluster(config) as c:
        sess = ps.Session(config, c.scheduler)
        table = sess.table("emb_wide")
        key = np.array([12345], dtype=np.uint64)
        out = np.empty((1, table.dim), dtype=np.float32)
        for _ in range(200):
            table.pull(key, out=out).result()
        start = time.perf_counter()
        for _ in range(calls):
            table.pull(key, out=out).result()
        pull_us = (time.perf_counter() - start) / calls * 1e6
        sess.close(finished=False)
    lib = ps._native.lib()
    noop = lib.ps_abi_version
    start = time.perf_counter()
    for _ in range(100000):
        noop()
    return pull_us, (time.perf_counter() - start) / 100000 * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num_train", type=int, default=300000,
                    help="examples the Python and C++ jobs train on")
    ap.add_argument("--seconds", type=float, default=8.0,
                    help="how long the plain PyTorch loop is timed")
    args = ap.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="python-bench-"))
    config = work / "dlrm.pbtxt"
    config.write_text(job_config(args.num_train))
    cconfig = work / "dlrm_cpp.pbtxt"
    cconfig.write_text(cpp_config(config.read_text()))

    # The baseline runs first and alone: both figures use one core of the
    # two, the job's server the other.
    torch_rate = plain_torch(str(config), args.seconds)
    emit("plain_torch_dlrm_b512_examples_per_s_per_core", torch_rate, "examples/s")
    py = run_job(str(config), python=True)
    if not py.get("prefetch"):
        raise RuntimeError("the Python job did not prefetch")
    py_rate = float(py["examples_per_s"])
    emit("python_ps_dlrm_b512_examples_per_s_per_core", py_rate, "examples/s", torch_rate)
    cpp = run_job(str(cconfig), python=False)
    cpp_rate = float(cpp["rank0_examples_per_s"])
    emit("cpp_dlrm_b512_examples_per_s_per_core", cpp_rate, "examples/s", torch_rate)
    pull_us, noop_us = binding_overheads(str(config))
    emit("pull_1key_round_trip_us", pull_us, "us")
    emit("ctypes_noop_call_us", noop_us, "us")
    summary = {"python_ps": round(py_rate), "plain_torch": round(torch_rate),
               "cpp": round(cpp_rate), "python_ps_over_plain_torch": round(py_rate / torch_rate, 3),
               "pull_1key_us": round(pull_us, 1), "ctypes_noop_us": round(noop_us, 3)}
    print(json.dumps({"bench": "python", "summary": summary}), flush=True)
    print(f"# python_ps / plain_torch = {py_rate / torch_rate:.3f} (target >= 0.8)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
