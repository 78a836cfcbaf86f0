"""Trainer.export -> load_for_inference: a plain module that scores like the
PS-backed model with the cluster stopped; unknown keys get the table's
initial values with the job config, zeros without."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

from helpers import torch_ctr  # noqa: E402

STEPS = 30
B = 32


def test_exported_model_scores_like_the_ps_model_without_servers(
        write_config, cluster_factory, tmp_path):
    config = write_config(torch_ctr.ctr_config("BSP", 1, "adagrad", num_train=STEPS * B,
                                               init_scale=0.3))
    data = ps.data.SyntheticCtr(config)
    cluster = cluster_factory(config)
    sess = ps.Session(config, cluster.scheduler)
    model = torch_ctr.ps_net()
    trainer = ps.torch.Trainer(sess, model, "dense")
    for batch in sess.batches(lambda shard, epoch: data.shard_batches(shard, 1, B)):
        trainer.step(torch_ctr.loss_of(model, batch))
    assert trainer.steps == STEPS and trainer.nonfinite_steps == 0
    assert sess.finish()
    path = str(tmp_path / "model.pt")
    trainer.export(path)

    test = data.fill(1, 0, 512)
    keys, numeric, _ = torch_ctr.batch_tensors(test)
    model.eval()
    with torch.no_grad():
        expected = model(keys, numeric)
    sess.close()
    cluster.close()
    assert all(p.poll() is not None for p in cluster.procs.values())

    # A plain state dict: dense parameters and each table's keys and rows.
    state = torch.load(path)
    assert set(state) == {"mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias",
                          "_ps_tables.emb.keys", "_ps_tables.emb.rows"}
    trained = state["_ps_tables.emb.keys"].numpy().view(np.uint64)
    known = np.isin(test.keys, trained).all(axis=1)
    assert 0 < known.sum() < len(known)  # both kinds of test example

    local = ps.torch.load_for_inference(path, torch_ctr.ps_net, config=config)
    assert not ps.torch.table_modules(local)
    assert not local.training
    with torch.no_grad():
        got = local(keys, numeric)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)

    # Without the config an unknown key's row is zeros: the examples with
    # only trained keys score the same, the others differently.
    zeros = ps.torch.load_for_inference(path, torch_ctr.ps_net)
    with torch.no_grad():
        got0 = zeros(keys, numeric)
    k = torch.from_numpy(known)
    torch.testing.assert_close(got0[k], expected[k], rtol=1e-6, atol=1e-6)
    assert (got0[~k] - expected[~k]).abs().min() > 0


class _RunsCodeWhenLoaded:
    """A pickled object whose unpickling calls a function (here: appends to
    a list), as a crafted model file could run anything."""

    def __reduce__(self):
        return (_LOADED.append, ("code ran",))


_LOADED: list = []


def test_load_for_inference_loads_tensors_only(tmp_path):
    path = str(tmp_path / "crafted.pt")
    torch.save({"mlp.0.bias": torch.zeros(torch_ctr.HIDDEN), "x": _RunsCodeWhenLoaded()},
               path)
    with pytest.raises(ValueError, match="not a file of tensors only.*weights_only=True"):
        ps.torch.load_for_inference(path, torch_ctr.ps_net)
    assert _LOADED == []
