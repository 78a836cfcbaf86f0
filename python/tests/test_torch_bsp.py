"""Under BSP, k workers at batch b train like one worker at batch k*b,
through ps.torch: two worker processes at batch 32 on interleaved shards
and one worker at batch 64 end with the same parameters after 50 steps."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ps.data  # noqa: E402

from conftest import timeout_scale  # noqa: E402
from helpers import torch_ctr  # noqa: E402

WORKER = str(pathlib.Path(__file__).resolve().parent / "helpers" / "torch_bsp_worker.py")
STEPS = 50
B = 32

# The bar: |a - b| <= TOLERANCE * max|a| per tensor. The two runs differ only
# in float32 rounding: the servers average two half-batch means, (g1 + g2)/2,
# where the single worker takes one mean over 2b examples, so each step's
# gradient differs by a few ulps (~1e-7 relative), and 50 small steps add
# these up without amplifying them (observed: 1.2e-7 of the scale for SGD
# and for Adagrad; a wrong average or shard is off by 1e-3 or more).
TOLERANCE = 2e-7


def run(config: str, cluster_factory, tmp_path: pathlib.Path, workers: int,
        batch: int) -> dict:
    cluster = cluster_factory(config, num_workers=workers)
    out = str(tmp_path / f"export{workers}.pt")
    for r in range(workers):
        cluster.python_worker(f"worker{r}", WORKER, [config, str(batch), out])
    for r in range(workers):
        code = cluster.wait(f"worker{r}", timeout=60 * timeout_scale())
        assert code == 0, cluster.log(f"worker{r}")[-3000:]
        assert cluster.output(f"worker{r}").split() == ["steps", str(STEPS), "nonfinite",
                                                        "0"], cluster.output(f"worker{r}")
    return torch.load(out)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_two_workers_at_b_equal_one_at_2b(optimizer, write_config, cluster_factory, tmp_path):
    config = write_config(torch_ctr.ctr_config("BSP", 2, optimizer,
                                               num_train=STEPS * 2 * B))
    two = run(config, cluster_factory, tmp_path, 2, B)
    one = run(config, cluster_factory, tmp_path, 1, 2 * B)
    assert sorted(two) == sorted(one)

    # Both moved well away from the start (so equality is not trivial).
    keys = one["_ps_tables.emb.keys"].numpy().view(np.uint64)
    initial = ps.data.initial_values(config, "emb", keys)
    assert np.abs(one["_ps_tables.emb.rows"].numpy() - initial).max() > 1e-2

    order_one = np.argsort(one["_ps_tables.emb.keys"].numpy())
    order_two = np.argsort(two["_ps_tables.emb.keys"].numpy())
    np.testing.assert_array_equal(one["_ps_tables.emb.keys"].numpy()[order_one],
                                  two["_ps_tables.emb.keys"].numpy()[order_two])
    worst = 0.0
    for name in one:
        if name.endswith(".keys"):
            continue
        a, b = one[name].numpy(), two[name].numpy()
        if name.endswith(".rows"):
            a, b = a[order_one], b[order_two]
        scale = np.abs(a).max()
        err = np.abs(a - b).max() / scale
        worst = max(worst, err)
        assert err <= TOLERANCE, f"{name}: max |diff| {err:.3g} of its scale {scale:.3g}"
    print(f"largest difference: {worst:.3g} of the scale")
