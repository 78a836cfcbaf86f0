"""ps.torch's surface as a PyTorch user reads it: modules take
`embedding_dim=` (as torch.nn.Embedding names it; `dim=` too), a model with
PS-backed rows refuses state_dict()/load_state_dict() with a message that
names what to use instead (its rows live on the servers), the trainer has
no second name for step(), and futures are typed."""

from __future__ import annotations

import typing

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

from helpers import torch_ctr  # noqa: E402


@pytest.mark.parametrize("cls", [ps.torch.EmbeddingBag, ps.torch.Embedding])
def test_modules_take_embedding_dim_and_dim(cls):
    assert cls("emb", embedding_dim=5).embedding_dim == 5
    assert cls("emb", dim=5).embedding_dim == 5
    assert cls("emb", embedding_dim=5, dim=5).embedding_dim == 5
    with pytest.raises(TypeError, match="embedding_dim=6 and dim=5 differ"):
        cls("emb", embedding_dim=6, dim=5)
    with pytest.raises(TypeError, match="embedding_dim is required for table 'emb'"):
        cls("emb")
    with pytest.raises(ValueError, match="embedding_dim must be >= 1; got 0"):
        cls("emb", embedding_dim=0)
    assert "embedding_dim=5" in repr(cls("emb", embedding_dim=5))


def test_state_dict_of_a_model_with_server_rows_is_refused():
    model = torch_ctr.ps_net()
    for call, where in ((model.state_dict, " (module 'emb')"), (model.emb.state_dict, "")):
        with pytest.raises(RuntimeError) as e:
            call()
        assert f"rows of table 'emb'{where} live on the servers" in str(e.value)
        assert "ps.torch.Trainer.export(path)" in str(e.value)
    # The dense part alone is still a plain state dict.
    assert set(model.mlp.state_dict()) == {"0.weight", "0.bias", "2.weight", "2.bias"}

    plain = {n: p.detach().clone() for n, p in model.named_parameters()}
    with pytest.raises(RuntimeError, match="ps.torch.load_for_inference"):
        model.load_state_dict(plain)
    with pytest.raises(RuntimeError, match="ps.torch.load_for_inference"):
        model.load_state_dict(plain, strict=False)


def test_an_export_loads_strictly_into_the_inference_model(
        write_config, cluster_factory, tmp_path):
    config = write_config(torch_ctr.ctr_config("BSP", 1, num_train=4 * 32))
    cluster = cluster_factory(config)
    data = ps.data.SyntheticCtr(config)
    path = str(tmp_path / "model.pt")
    with ps.Session(config, cluster.scheduler) as sess:
        model = torch_ctr.ps_net()
        trainer = ps.torch.Trainer(sess, model, "dense")
        for i in range(4):
            trainer.step(torch_ctr.loss_of(model, data.fill(0, i * 32, 32)))
        trainer.export(path)
    local = ps.torch.load_for_inference(path, torch_ctr.ps_net)
    # The inference model's own state dict round-trips strictly.
    again = ps.torch.load_for_inference(path, torch_ctr.ps_net)
    with torch.no_grad():
        for p in again.parameters():
            p.zero_()
    again.load_state_dict(local.state_dict(), strict=True)
    keys, numeric, _ = torch_ctr.batch_tensors(data.fill(1, 0, 64))
    with torch.no_grad():
        torch.testing.assert_close(again(keys, numeric), local(keys, numeric))


def test_trainer_has_no_backward_alias():
    assert not hasattr(ps.torch.Trainer, "backward")


def test_futures_are_typed():
    hints = typing.get_type_hints
    assert hints(ps.SparseTable.pull)["return"] == ps.Future[np.ndarray]
    assert hints(ps.SparseTable.push)["return"] == ps.Future[None]
    assert hints(ps.DenseTable.pull)["return"] == ps.Future[np.ndarray]
    assert hints(ps.DenseTable.push)["return"] == ps.Future[None]
    assert hints(ps.DenseTable.assign)["return"] == ps.Future[None]
    assert hints(ps.Session.end_step)["return"] == ps.Future[None]
    assert typing.get_origin(ps.Future[np.ndarray]) is ps.Future
    # result() returns the future's type parameter.
    (param,) = ps.Future.__parameters__
    assert hints(ps.Future.result)["return"] == param
