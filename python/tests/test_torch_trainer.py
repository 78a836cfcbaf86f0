"""ps.torch.Trainer's rules: no torch.optim optimizer, dense sizes that must
match, non-finite steps that push nothing yet end the step (BSP peers go
on), and prefetch before the pushes in ASYNC mode only."""

from __future__ import annotations

import threading
from typing import List

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

from conftest import timeout_scale  # noqa: E402
from helpers import torch_ctr  # noqa: E402

B = 32


def start(write_config, cluster_factory, **kwargs):
    config = write_config(torch_ctr.ctr_config(**kwargs))
    cluster = cluster_factory(config)
    return config, cluster


def test_refuses_a_torch_optimizer_and_a_wrong_dense_size(write_config, cluster_factory):
    config, cluster = start(write_config, cluster_factory,
                            dense_size=torch_ctr.DENSE_SIZE + 1)
    with ps.Session(config, cluster.scheduler) as sess:
        model = torch_ctr.ps_net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with pytest.raises(TypeError, match="servers own the update"):
            ps.torch.Trainer(sess, model, "dense", optimizer=opt)
        with pytest.raises(TypeError, match="servers own the update"):
            ps.torch.Trainer(sess, opt)
        with pytest.raises(ValueError) as e:
            ps.torch.Trainer(sess, model, "dense")
        assert str(e.value) == (f"dense table 'dense' has size {torch_ctr.DENSE_SIZE + 1}; "
                                f"this model has {torch_ctr.DENSE_SIZE} parameters")
        with pytest.raises(ValueError, match="'mlp.2.weight' matches no dense_table prefix"):
            ps.torch.Trainer(sess, model, {"mlp.0.": "dense"})
        with pytest.raises(ValueError, match="not bound|has dim"):
            ps.torch.Trainer(sess, torch_ctr.CtrNet(ps.torch.EmbeddingBag("emb", dim=3)))


def test_nonfinite_step_pushes_nothing_and_bsp_peers_go_on(write_config, cluster_factory):
    """Two BSP workers (sessions in two threads); worker 0's step 1 has a NaN
    loss and its step 2 an infinite gradient: both are skipped and counted,
    and both workers still finish all their steps."""
    steps = 4
    config, cluster = start(write_config, cluster_factory, workers=2,
                            num_train=steps * 2 * B)
    data = ps.data.SyntheticCtr(config)
    results: List[dict] = [{}, {}]
    errors: List[BaseException] = []

    def worker() -> None:
        try:
            with ps.Session(config, cluster.scheduler) as sess:
                model = torch_ctr.ps_net()
                trainer = ps.torch.Trainer(sess, model, "dense", barrier_timeout=30)
                ok = []
                for i, batch in enumerate(data.shard_batches(sess.rank, 2, B)):
                    loss = torch_ctr.loss_of(model, batch)
                    hook = None
                    if sess.rank == 0 and i == 1:
                        loss = loss * float("nan")
                    if sess.rank == 0 and i == 2:
                        hook = model.mlp[0].weight.register_hook(lambda g: g / 0.0)
                    ok.append(trainer.step(loss))
                    if hook is not None:
                        hook.remove()
                results[sess.rank] = {"ok": ok, "nonfinite": trainer.nonfinite_steps,
                                      "clock": sess.clock}
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60 * timeout_scale())
    assert not any(t.is_alive() for t in threads), "a worker stalled"
    assert not errors, errors
    assert results[0]["ok"] == [True, False, False, True]
    assert results[1]["ok"] == [True] * steps
    assert results[0]["nonfinite"] == 2 and results[1]["nonfinite"] == 0
    assert results[0]["clock"] == results[1]["clock"] == steps


def test_nonfinite_step_sends_no_gradient(write_config, cluster_factory):
    config, cluster = start(write_config, cluster_factory)
    data = ps.data.SyntheticCtr(config)
    with ps.Session(config, cluster.scheduler) as sess:
        model = torch_ctr.ps_net()
        trainer = ps.torch.Trainer(sess, model, "dense")
        dense = sess.table("dense")
        trainer.wait()
        before_rows = sess.table("emb").scan()
        before_dense = dense.pull().result()
        loss = torch_ctr.loss_of(model, data.fill(0, 0, B)) * float("inf")
        assert not trainer.step(loss)
        trainer.wait()
        assert sess.clock == 1 and trainer.nonfinite_steps == 1
        assert sess.table("emb").scan()[0].size == before_rows[0].size == 0
        np.testing.assert_array_equal(dense.pull().result(), before_dense)
        assert [m.pending_records for _, m in ps.torch.table_modules(model)] == [0]
        assert all(p.grad is None for p in model.parameters())
        # The next finite step trains.
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, B, B)))
        trainer.wait()
        assert sess.table("emb").scan()[0].size > 0
        assert np.abs(dense.pull().result() - before_dense).max() > 0


def run_with_prefetch(sess: ps.Session, config: str, steps: int, **trainer_kwargs):
    data = ps.data.SyntheticCtr(config)
    batches = [data.fill(0, i * B, B) for i in range(steps)]
    model = torch_ctr.ps_net()
    trainer = ps.torch.Trainer(sess, model, "dense", **trainer_kwargs)
    clocks = []
    losses = []
    for i, batch in enumerate(batches):
        def prefetch(i=i):
            clocks.append(sess.clock)
            if i + 1 < steps:
                model.emb.prefetch(torch_ctr.batch_tensors(batches[i + 1])[0])
        loss = torch_ctr.loss_of(model, batch)
        losses.append(loss.item())
        trainer.step(loss, prefetch=prefetch)
    trainer.wait()
    return model, clocks, losses


def test_prefetch_runs_before_the_pushes_in_async_mode_only(write_config, cluster_factory):
    steps = 10
    config, cluster = start(write_config, cluster_factory, mode="ASYNC",
                            extra="prefetch: true")
    with ps.Session(config, cluster.scheduler) as sess:
        assert sess.prefetch
        model, clocks, losses = run_with_prefetch(sess, config, steps)
        # Called before end_step: the clock is still the step's own.
        assert clocks == list(range(steps))
        assert model.emb.prefetch_hits == steps - 1
        assert model.emb.pulls == steps
        assert losses[-1] < losses[0]

    config, cluster = start(write_config, cluster_factory, mode="BSP")
    with ps.Session(config, cluster.scheduler) as sess:
        with pytest.raises(ValueError, match="only in ASYNC mode; this job is BSP"):
            ps.torch.Trainer(sess, torch_ctr.ps_net(), "dense", prefetch=True)
        model, clocks, _ = run_with_prefetch(sess, config, steps)
        # Called right after end_step.
        assert clocks == list(range(1, steps + 1))
        assert model.emb.prefetch_hits == steps - 1


def test_parameters_split_over_dense_tables_by_prefix(write_config, cluster_factory):
    first = (torch_ctr.DIM + torch_ctr.NUM_NUMERIC) * torch_ctr.HIDDEN + torch_ctr.HIDDEN
    text = torch_ctr.ctr_config(dense_size=first).replace(
        'tables { id: 1 name: "dense"',
        f'tables {{ id: 2 name: "head" dense {{ size: {torch_ctr.HIDDEN + 1} }}\n'
        '         optimizer { sgd { learning_rate: 0.1 } } init { kind: CONSTANT value: 7 } }\n'
        'tables { id: 1 name: "dense"')
    config = write_config(text)
    cluster = cluster_factory(config)
    data = ps.data.SyntheticCtr(config)
    with ps.Session(config, cluster.scheduler) as sess:
        model = torch_ctr.ps_net()
        initial = {n: p.detach().clone() for n, p in model.named_parameters()}
        with pytest.raises(ValueError, match="pass dense_table="):
            ps.torch.Trainer(sess, model)  # two dense tables: which?
        trainer = ps.torch.Trainer(sess, model, {"": "dense", "mlp.2.": "head"})
        # Rank 0 wrote the model's own initial values (not the tables' init).
        head = sess.table("head").pull().result()
        np.testing.assert_array_equal(
            head, torch.cat([initial["mlp.2.weight"].reshape(-1),
                             initial["mlp.2.bias"]]).numpy())
        body = sess.table("dense").pull().result()
        np.testing.assert_array_equal(
            body, torch.cat([initial["mlp.0.weight"].reshape(-1),
                             initial["mlp.0.bias"]]).numpy())
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, 0, B)))
        trainer.wait()
        assert np.abs(sess.table("head").pull().result() - head).max() > 0
        assert np.abs(sess.table("dense").pull().result() - body).max() > 0
        # The next forward reads the servers' values into the parameters.
        torch_ctr.loss_of(model, data.fill(0, B, B))
        trainer.discard()
        np.testing.assert_array_equal(model.mlp[2].bias.detach().numpy(),
                                      sess.table("head").pull().result()[-1:])
