"""ps.torch with several tables: dims 1 and 8 with different optimizers,
variable-length bags (sum with per-sample weights, mean, empty bags), an
Embedding and an EmbeddingBag sharing one table, against the same model in
plain PyTorch; and an evaluation pass (eval() or no_grad) pushes nothing."""

from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import ps  # noqa: E402
import ps.data  # noqa: E402
import ps.torch  # noqa: E402

JOB = """
name: "torch-tables"
cluster { num_servers: 2 num_workers: 1 num_slots: 64
          heartbeat_interval_ms: 200 heartbeat_timeout_ms: 5000 }
consistency { mode: %s }
tables { id: 0 name: "wide" sparse { dim: 1 }
         optimizer { sgd { learning_rate: 0.5 } }
         init { kind: NORMAL scale: 0.1 seed: 1 } }
tables { id: 1 name: "deep" sparse { dim: 8 }
         optimizer { adagrad { learning_rate: 0.1 initial_accumulator: 0.01 epsilon: 1e-8 } }
         init { kind: UNIFORM scale: 0.5 seed: 2 } }
tables { id: 2 name: "tower" dense { size: 17 block_size: 8 }
         optimizer { sgd { learning_rate: 0.5 } } }
"""

B = 16
STEPS = 4


class MultiNet(nn.Module):
    """logit = head([mean bag of deep rows, product of two deep rows]) + wide bag."""

    def __init__(self, wide: nn.Module, deep_bag: nn.Module, deep_pair: nn.Module) -> None:
        super().__init__()
        self.wide = wide
        self.deep_bag = deep_bag
        self.deep_pair = deep_pair
        self.head = nn.Linear(16, 1)

    def forward(self, b: Dict[str, torch.Tensor]) -> torch.Tensor:
        w = self.wide(b["wide"], b["wide_offsets"], b["wide_weights"])      # (B, 1)
        a = self.deep_bag(b["deep"], b["deep_offsets"])                     # (B, 8)
        p = self.deep_pair(b["pair"])                                       # (B, 2, 8)
        return (self.head(torch.cat([a, p[:, 0] * p[:, 1]], 1)) + w).squeeze(1)


def ps_model() -> MultiNet:
    torch.manual_seed(3)
    return MultiNet(ps.torch.EmbeddingBag("wide", dim=1, mode="sum"),
                    ps.torch.EmbeddingBag("deep", dim=8, mode="mean"),
                    ps.torch.Embedding("deep", dim=8))


class KeyedBag(nn.Module):
    """nn.functional.embedding_bag over a weight indexed through `index`."""

    def __init__(self, weight: nn.Parameter, index: Callable, mode: str) -> None:
        super().__init__()
        self.weight, self.index, self.mode = weight, index, mode

    def forward(self, ids, offsets, per_sample_weights=None):
        return nn.functional.embedding_bag(self.index(ids), self.weight, offsets,
                                           mode=self.mode,
                                           per_sample_weights=per_sample_weights)


class KeyedEmbedding(nn.Module):
    def __init__(self, weight: nn.Parameter, index: Callable) -> None:
        super().__init__()
        self.weight, self.index = weight, index

    def forward(self, ids):
        return nn.functional.embedding(self.index(ids), self.weight)


def make_batches(seed: int = 0) -> List[Dict[str, torch.Tensor]]:
    """Random batches over small vocabularies of 64-bit keys (half of them
    with the top bit set, i.e. negative as int64), so keys repeat within and
    across bags, modules and steps."""
    rng = np.random.default_rng(seed)
    wide_vocab = rng.integers(0, 2**64, 12, dtype=np.uint64).view(np.int64)
    deep_vocab = rng.integers(0, 2**64, 20, dtype=np.uint64).view(np.int64)
    out = []
    for _ in range(STEPS):
        b: Dict[str, torch.Tensor] = {}
        for name, vocab, top in (("wide", wide_vocab, 5), ("deep", deep_vocab, 6)):
            lengths = rng.integers(0, top, B)
            lengths[0] = 0  # an empty bag
            ids = rng.choice(vocab, int(lengths.sum()))
            b[name] = torch.from_numpy(ids)
            b[name + "_offsets"] = torch.from_numpy(
                np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
        b["wide_weights"] = torch.from_numpy(
            rng.uniform(0.5, 2.0, b["wide"].numel()).astype(np.float32))
        b["pair"] = torch.from_numpy(rng.choice(deep_vocab, (B, 2)))
        b["labels"] = torch.from_numpy(rng.integers(0, 2, B).astype(np.float32))
        out.append(b)
    return out


def loss_of(model: nn.Module, b: Dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.binary_cross_entropy_with_logits(model(b), b["labels"])


def distinct(*tensors: torch.Tensor) -> np.ndarray:
    return np.unique(np.concatenate([t.reshape(-1).numpy().view(np.uint64) for t in tensors]))


def pushed(sess: ps.Session, table: str) -> int:
    return sum(s["keys_pushed"] for s in sess.table(table).stats())


@pytest.fixture(params=["ASYNC", "BSP"])
def job(request, write_config, cluster_factory):
    config = write_config(JOB % request.param)
    cluster = cluster_factory(config)
    sess = ps.Session(config, cluster.scheduler)
    yield config, sess
    sess.close()


def test_tables_of_dims_1_and_8_and_a_shared_table_match_plain_pytorch(job):
    config, sess = job
    batches = make_batches()

    # Plain PyTorch: rows from the servers' initial values, one shared
    # weight for the two deep modules, torch optimizers set to each table's
    # rule (server/optimizer.cc).
    wide_keys = distinct(*[b["wide"] for b in batches])
    deep_keys = distinct(*[b["deep"] for b in batches], *[b["pair"] for b in batches])

    def indexer(keys: np.ndarray) -> Callable:
        def index(ids: torch.Tensor) -> torch.Tensor:
            k = ids.numpy().view(np.uint64)
            pos = np.searchsorted(keys, k)
            assert (keys[pos] == k).all()
            return torch.from_numpy(pos.astype(np.int64)).view(ids.shape)
        return index

    wide_w = nn.Parameter(torch.from_numpy(ps.data.initial_values(config, "wide", wide_keys)))
    deep_w = nn.Parameter(torch.from_numpy(ps.data.initial_values(config, "deep", deep_keys)))
    torch.manual_seed(3)
    ref = MultiNet(KeyedBag(wide_w, indexer(wide_keys), "sum"),
                   KeyedBag(deep_w, indexer(deep_keys), "mean"),
                   KeyedEmbedding(deep_w, indexer(deep_keys)))
    sgd = torch.optim.SGD([wide_w, *ref.head.parameters()], lr=0.5)
    adagrad = torch.optim.Adagrad([deep_w], lr=0.1, initial_accumulator_value=0.01, eps=1e-8)
    ref_losses = []
    for b in batches:
        sgd.zero_grad()
        adagrad.zero_grad()
        loss = loss_of(ref, b)
        loss.backward()
        sgd.step()
        adagrad.step()
        ref_losses.append(loss.item())

    model = ps_model()
    trainer = ps.torch.Trainer(sess, model, {"head.": "tower"})
    losses = []
    for b in batches:
        before = {t: pushed(sess, t) for t in ("wide", "deep")}
        loss = loss_of(model, b)
        losses.append(loss.item())
        assert trainer.step(loss)
        trainer.wait()
        # One row per distinct key per table: the deep keys of both modules
        # are summed into one push (in ASYNC mode a key pushed twice would be
        # applied twice, and Adagrad's result differ; BSP sums a step's pushes).
        assert pushed(sess, "wide") - before["wide"] == distinct(b["wide"]).size
        assert pushed(sess, "deep") - before["deep"] == distinct(b["deep"], b["pair"]).size
    trainer.sync()

    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for name in ("head.weight", "head.bias"):
        np.testing.assert_allclose(dict(model.named_parameters())[name].detach().numpy(),
                                   dict(ref.named_parameters())[name].detach().numpy(),
                                   rtol=1e-5, atol=1e-6, err_msg=name)
    for table, keys, weight in (("wide", wide_keys, wide_w), ("deep", deep_keys, deep_w)):
        rows = sess.table(table).pull(keys).result()
        initial = ps.data.initial_values(config, table, keys)
        assert np.abs(rows - initial).max() > 1e-3, table
        np.testing.assert_allclose(rows, weight.detach().numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=table)


def test_evaluation_pushes_nothing(job):
    config, sess = job
    batches = make_batches(1)
    model = ps_model()
    trainer = ps.torch.Trainer(sess, model, "tower")
    for b in batches[:2]:
        assert trainer.step(loss_of(model, b))

    def snapshot():
        return sorted((s["server"], s["table_id"], s["keys_pushed"], s["rows"])
                      for s in sess.stats())

    def pulled():
        return sum(s["keys_pulled"] for s in sess.stats())

    trainer.wait()
    before, pulled_before = snapshot(), pulled()
    model.eval()
    out_eval = model(batches[2])
    model.train()
    with torch.no_grad():
        out_nograd = model(batches[2])
    torch.testing.assert_close(out_eval, out_nograd)
    modules = [m for _, m in ps.torch.table_modules(model)]
    assert [m.pending_records for m in modules] == [0, 0, 0]
    # A step after evaluation only: nothing recorded, no gradient, no push.
    trainer.step()
    trainer.wait()
    assert pulled() > pulled_before  # the passes did reach the servers
    assert snapshot() == before
    # A training forward is recorded (the check above could fail).
    loss_of(model, batches[3])
    assert [m.pending_records for m in modules] == [1, 1, 1]
    trainer.discard()
    assert [m.pending_records for m in modules] == [0, 0, 0]
