"""ps.torch trains exactly like plain PyTorch: one BSP worker against two
servers and the same model with the rows in an nn.EmbeddingBag and a
torch.optim optimizer set to the servers' rule give the same per-step
losses and the same parameters after 200 steps, for SGD and for Adagrad."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

from helpers import torch_ctr  # noqa: E402

STEPS = 200
BATCH = 32


def torch_optimizer(name: str, params) -> "torch.optim.Optimizer":
    """torch.optim configured to the servers' rule (server/optimizer.cc).

    SGD: w -= lr * g, as torch.optim.SGD without momentum or decay.
    Adagrad (proto AdagradConfig): acc starts at initial_accumulator;
    acc += g^2; w -= lr * g / (sqrt(acc) + epsilon): torch.optim.Adagrad with
    initial_accumulator_value = initial_accumulator, eps = epsilon and
    lr_decay = 0 is the same rule (eps added outside the sqrt in both). The
    only difference is rounding: torch computes w + (-lr) * (g / d), the
    servers w - (lr * g) / d, one float32 rounding apart per step.
    """
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.Adagrad(params, lr=0.05, initial_accumulator_value=0.1, eps=1e-8)


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad"])
def test_bsp_one_worker_trains_like_plain_pytorch(optimizer, write_config, cluster_factory):
    config = write_config(torch_ctr.ctr_config("BSP", 1, optimizer,
                                               num_train=STEPS * BATCH))
    data = ps.data.SyntheticCtr(config)
    batches = [data.fill(0, i * BATCH, BATCH) for i in range(STEPS)]
    all_keys = np.concatenate([b.keys.reshape(-1) for b in batches])

    # Plain PyTorch.
    ref = torch_ctr.reference_net(config, all_keys)
    opt = torch_optimizer(optimizer, ref.parameters())
    ref_losses = []
    for b in batches:
        opt.zero_grad()
        loss = torch_ctr.loss_of(ref, b)
        loss.backward()
        opt.step()
        ref_losses.append(loss.item())

    # The same model on the servers.
    cluster = cluster_factory(config)
    sess = ps.Session(config, cluster.scheduler)
    model = torch_ctr.ps_net()
    trainer = ps.torch.Trainer(sess, model, "dense")
    losses = []
    for b in batches:
        loss = torch_ctr.loss_of(model, b)
        losses.append(loss.item())
        assert trainer.step(loss)
    assert sess.clock == STEPS and trainer.nonfinite_steps == 0
    trainer.sync()
    keys, rows = sess.table("emb").scan()
    sess.close()

    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5, atol=0)
    # The model moved: the test compares trained parameters, not initial ones.
    assert losses[-1] < losses[0] - 0.01
    for name, value in torch_ctr.dense_state(ref).items():
        got = dict(model.named_parameters())[name].detach().numpy()
        np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-5, err_msg=name)
    # Every key of the data was pushed, and only those: one row each.
    np.testing.assert_array_equal(np.sort(keys), ref.emb.keys)
    expected = ref.emb.rows_of(keys)
    initial = ps.data.initial_values(config, "emb", keys)
    assert np.abs(expected - initial).max() > 1e-3
    np.testing.assert_allclose(rows, expected, rtol=1e-5, atol=1e-5)
