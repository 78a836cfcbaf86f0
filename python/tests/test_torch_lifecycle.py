"""ps.torch.Trainer around the job's lifecycle: after finish() the live
model scores with the servers' final dense values (those the export
writes), and a step's failure reported after the next step started is
still raised."""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

from conftest import timeout_scale  # noqa: E402
from helpers import torch_ctr  # noqa: E402

B = 32
STEPS = 6


def flat_dense(model: torch.nn.Module) -> np.ndarray:
    """float32: the model's dense parameters, flattened in registration order."""
    return torch.cat([p.detach().reshape(-1) for n, p in model.named_parameters()
                      if not n.startswith("emb.")]).numpy()


@pytest.mark.parametrize("flow", ["forward_hook", "pull_dense_after_close"])
def test_live_model_after_finish_scores_with_the_servers_final_dense_values(
        write_config, cluster_factory, tmp_path, flow):
    """ASYNC, two workers: rank 1's last step is pushed after rank 0 (the
    evaluator) pulled the dense values of its own last step. After finish()
    rank 0 must score with the servers' final values, which are also the
    export's: through the trainer's forward hook, or, once close() removed
    it, by calling pull_dense()."""
    config = write_config(torch_ctr.ctr_config("ASYNC", 2, num_train=2 * STEPS * B))
    cluster = cluster_factory(config)
    data = ps.data.SyntheticCtr(config)
    rank0_trained = threading.Event()
    found: Dict[str, Any] = {}
    errors: List[BaseException] = []
    path = str(tmp_path / "model.pt")
    test_keys, test_numeric, _ = torch_ctr.batch_tensors(data.fill(1, 0, 64))

    def worker() -> None:
        try:
            with ps.Session(config, cluster.scheduler) as sess:
                model = torch_ctr.ps_net()
                trainer = ps.torch.Trainer(sess, model, "dense", barrier_timeout=30)
                for i, batch in enumerate(data.shard_batches(sess.rank, 2, B)):
                    if sess.rank == 1 and i == STEPS - 1:
                        assert rank0_trained.wait(30 * timeout_scale())
                    trainer.step(torch_ctr.loss_of(model, batch))
                trainer.wait()
                if sess.rank == 0:
                    trainer.sync()  # this worker's last pull is in the parameters
                    found["own_last_pull"] = flat_dense(model)
                    rank0_trained.set()
                if flow == "pull_dense_after_close":
                    trainer.close()
                if sess.finish():
                    if flow == "pull_dense_after_close":
                        trainer.pull_dense()
                    model.eval()
                    with torch.no_grad():
                        model(test_keys, test_numeric)
                    found["live"] = flat_dense(model)
                    found["servers"] = sess.table("dense").pull().result()
                    trainer.export(path)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90 * timeout_scale())
    assert not any(t.is_alive() for t in threads), "a worker stalled"
    assert not errors, errors
    # Rank 1's last step changed the servers' values after rank 0's last pull.
    assert np.abs(found["servers"] - found["own_last_pull"]).max() > 0
    np.testing.assert_array_equal(found["live"], found["servers"])
    state = torch.load(path)
    exported = torch.cat([state[n].reshape(-1) for n in
                          ("mlp.0.weight", "mlp.0.bias", "mlp.2.weight", "mlp.2.bias")])
    np.testing.assert_array_equal(found["live"], exported.numpy())


class _LateFailure:
    """Stands for an end_step future that is still pending when the next
    step starts and then fails."""

    def __init__(self, inner: ps.Future) -> None:
        self._inner = inner
        self.failed = False

    def done(self) -> bool:
        return self.failed

    def result(self, timeout: Optional[float] = None) -> None:
        self._inner.result(timeout)
        if self.failed:
            raise ps.Unavailable("end_step of the first step failed on a server")


def test_a_step_failure_reported_after_the_next_step_started_is_raised(
        write_config, cluster_factory):
    config = write_config(torch_ctr.ctr_config("ASYNC", 1))
    cluster = cluster_factory(config)
    data = ps.data.SyntheticCtr(config)
    with ps.Session(config, cluster.scheduler) as sess:
        model = torch_ctr.ps_net()
        trainer = ps.torch.Trainer(sess, model, "dense")
        real_end_step = sess.end_step
        late: List[_LateFailure] = []

        def end_step(position: Optional[ps.DataPosition] = None,
                     **report: Any) -> Any:
            f = real_end_step(position, **report)
            if not late:
                late.append(_LateFailure(f))
                return late[0]
            return f

        sess.end_step = end_step  # type: ignore[method-assign]
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, 0, B)))
        # Still pending: the next step goes on.
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, B, B)))
        late[0].failed = True
        with pytest.raises(ps.Unavailable, match="end_step of the first step failed"):
            trainer.step(torch_ctr.loss_of(model, data.fill(0, 2 * B, B)))
        # Raised once: the trainer goes on after it.
        trainer.wait()
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, 3 * B, B)))
        trainer.wait()

        late.clear()
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, 4 * B, B)))
        assert trainer.step(torch_ctr.loss_of(model, data.fill(0, 5 * B, B)))
        late[0].failed = True
        with pytest.raises(ps.Unavailable, match="end_step of the first step failed"):
            trainer.wait()
