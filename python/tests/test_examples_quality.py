"""The Python examples learn as well as the C++ trainer and the oracle.

Each case runs whole jobs of real processes (a scheduler, 2 servers, 2
worker processes) on loopback:

  * examples/python/dlrm_torch.py (PyTorch DLRM through ps.torch) against
    the C++ trainer's DLRM-lite (worker/trainer) on the same synthetic
    data, batch size, sharding and optimizers, in ASYNC (with prefetch),
    BSP and SSP: the test AUCs must agree within 0.005.
  * examples/python/lr_numpy.py (logistic regression in NumPy) must come
    within 0.003 of the AUC of the model that generated the data.

Sizes: the DLRM data (interaction_rank 8) has a phase in which the models
learn the interactions: up to ~1M examples the test AUC still climbs
steeply and differs by +-0.01 between runs of the *same* C++ trainer with
different initial weights. By 1.6M examples seen (800k x 2 epochs) it is
within a few thousandths of its plateau (~0.894), where runs agree.

ASYNC and SSP run only with PS_QUALITY_ALL_MODES=1. One run of each side
cannot be held to 0.005 there: the order in which two workers' updates
interleave decides when the model learns the interactions, so the C++
trainer alone, on this exact job, scored 0.803, 0.875, 0.884, 0.879, 0.869,
0.880, 0.886, 0.870 and 0.835 in nine ASYNC runs with prefetch (0.857-0.892
without) and 0.873-0.889 in five SSP runs, while the Python example scored
0.862-0.867 (prefetch), 0.866-0.889 (none) and 0.849/0.883 (SSP): the two
distributions overlap, and the deterministic BSP job agrees to 0.0005.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import time
from typing import Dict, List

import pytest

import ps.testing

from conftest import timeout_scale

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python"

DLRM_TRAIN = 800_000
DLRM_EPOCHS = 2
DLRM_TEST = 50_000
LR_TRAIN = 1_000_000
LR_EPOCHS = 3
LR_TEST = 100_000
#: examples/ctr/async.pbtxt (the demo's logistic regression), resized.
LR_CONFIG = f"""
name: "lr-numpy-quality"
cluster {{ num_servers: 2 num_workers: 2 }}
consistency {{ mode: ASYNC }}
tables {{ id: 0 name: "ctr_sparse" sparse {{ dim: 1 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 1e-6 }} }}
         init {{ kind: ZEROS }} }}
tables {{ id: 1 name: "ctr_dense" dense {{ size: 14 }}
         optimizer {{ adagrad {{ learning_rate: 0.1 initial_accumulator: 1e-6 }} }}
         init {{ kind: ZEROS }} }}
data {{ synthetic_ctr {{ num_train: {LR_TRAIN} num_test: {LR_TEST} seed: 1 }} }}
training {{ batch_size: 1024 epochs: {LR_EPOCHS} }}
"""


def resize(text: str, num_train: int, num_test: int, epochs: int) -> str:
    """The config `text` with other data and epoch counts."""
    text = re.sub(r"num_train:\s*\d+", f"num_train: {num_train}", text)
    text = re.sub(r"num_test:\s*\d+", f"num_test: {num_test}", text)
    return re.sub(r"epochs:\s*\d+", f"epochs: {epochs}", text)


def cpp_dlrm_config(python_config: str) -> str:
    """The C++ trainer's DLRM-lite on the data, consistency, batch size,
    sharding and optimizers of the Python example's config: one sparse
    table for the 26 fields instead of one per field group, one dense
    table for both MLPs (sized by the trainer)."""
    def block(name: str) -> str:
        m = re.search(rf"^{name} {{.*?^}}", python_config, re.S | re.M)
        assert m, f"no {name} block"
        return m.group(0)

    emb = re.search(r"optimizer { adagrad {[^}]*} }", python_config).group(0)
    init = re.search(r"init { kind: NORMAL[^}]*}", python_config).group(0)
    dense = re.search(r"optimizer { adam {[^}]*} }", python_config).group(0)
    training = block("training")
    training = training.rstrip("}") + """  sparse_table: "embeddings"
  dense_table: "mlp"
  model { kind: DLRM embedding_dim: 16 bottom_mlp: 64 top_mlp: 64 }
}"""
    return f"""name: "dlrm-cpp"
{block("cluster")}
{block("consistency")}
tables {{ id: 0 name: "embeddings" sparse {{ dim: 16 }} {emb} {init} }}
tables {{ id: 1 name: "mlp" dense {{ size: 0 }} {dense} }}
{block("data")}
{training}
"""


def run_job(cluster_factory, config: str, workers: Dict[str, List[str]],
            python: bool, timeout: float) -> dict:
    """Runs a job to its end: every process must exit 0. Returns the
    evaluator's JSON summary."""
    cluster = cluster_factory(config)
    out = pathlib.Path(cluster.dir) / "summary.json"
    for name, args in workers.items():
        args = args + [f"--summary_out={out}"]
        if python:
            cluster.python_worker(name, args[0], args[1:])
        else:
            cluster.start_process(name, [ps.testing.binary("trainer"), *args,
                                         f"--scheduler={cluster.scheduler}"])
    codes = cluster.wait_all(timeout=timeout)
    logs = "\n".join(f"--- {n}\n{cluster.log(n)[-1500:]}{cluster.output(n)[-500:]}"
                     for n in workers)
    assert all(c == 0 for c in codes.values()), f"exit codes {codes}\n{logs}"
    return json.loads(out.read_text())


ALL_MODES = bool(os.environ.get("PS_QUALITY_ALL_MODES"))
NOISY = pytest.mark.skipif(
    not ALL_MODES, reason="ASYNC/SSP AUC varies by more than 0.005 between runs of the same "
    "trainer (see the module docstring); set PS_QUALITY_ALL_MODES=1 to run")


@pytest.mark.parametrize("mode", [pytest.param("async", marks=NOISY), "bsp",
                                  pytest.param("ssp", marks=NOISY)])
def test_dlrm_torch_matches_cpp_dlrm(mode: str, write_config, cluster_factory) -> None:
    text = resize((EXAMPLES / f"dlrm_{mode}.pbtxt").read_text(), DLRM_TRAIN, DLRM_TEST,
                  DLRM_EPOCHS)
    py_config = write_config(text, "python.pbtxt")
    cpp_config = write_config(cpp_dlrm_config(text), "cpp.pbtxt")
    timeout = 240 * timeout_scale()
    script = str(EXAMPLES / "dlrm_torch.py")
    t0 = time.monotonic()
    py = run_job(cluster_factory, py_config,
                 {f"py{i}": [script, f"--config={py_config}"] for i in range(2)},
                 python=True, timeout=timeout)
    t1 = time.monotonic()
    cpp = run_job(cluster_factory, cpp_config,
                  {f"cpp{i}": [f"--config={cpp_config}", "--log_level=warn"] for i in range(2)},
                  python=False, timeout=timeout)
    t2 = time.monotonic()
    print(f"{mode}: python AUC {py['test_auc']:.5f} ({t1 - t0:.1f} s), C++ AUC "
          f"{cpp['test_auc']:.5f} ({t2 - t1:.1f} s), oracle {py['oracle_auc']:.5f}")
    assert py["mode"] == cpp["mode"] == mode.upper()
    assert py["prefetch"] == (mode == "async")
    assert py["examples"] + cpp["rank0_examples"] > 0
    # Both scored the same test split.
    assert py["oracle_auc"] == pytest.approx(cpp["oracle_auc"], abs=1e-4)
    # Both learned the interactions (logistic regression stays near 0.80
    # on this data), so agreeing is not agreeing on failure.
    assert cpp["test_auc"] > 0.87, cpp
    assert abs(py["test_auc"] - cpp["test_auc"]) <= 0.005, (py, cpp)


def test_lr_numpy_reaches_the_oracle(write_config, cluster_factory) -> None:
    config = write_config(LR_CONFIG, "lr.pbtxt")
    script = str(EXAMPLES / "lr_numpy.py")
    t0 = time.monotonic()
    s = run_job(cluster_factory, config,
                {f"lr{i}": [script, f"--config={config}"] for i in range(2)},
                python=True, timeout=240 * timeout_scale())
    print(f"LR: AUC {s['test_auc']:.5f} oracle {s['oracle_auc']:.5f} "
          f"({time.monotonic() - t0:.1f} s)")
    assert s["workers"] == 2 and s["mode"] == "ASYNC"
    assert s["oracle_auc"] - s["test_auc"] <= 0.003, s
