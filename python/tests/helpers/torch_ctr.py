"""Shared pieces of the ps.torch tests: a small CTR job config, a model of
one multi-hot EmbeddingBag over the categorical keys plus an MLP, and the
same model in plain PyTorch (rows in an nn.EmbeddingBag) for reference.

Used by python/tests/test_torch_*.py and by helpers/torch_bsp_worker.py
(a worker process).
"""

from __future__ import annotations

from typing import Dict, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ps.data
import ps.torch

NUM_CATEGORICAL = 4
NUM_NUMERIC = 3
DIM = 4
HIDDEN = 8
#: Dense parameters of CtrNet: Linear(DIM + NUM_NUMERIC, HIDDEN), Linear(HIDDEN, 1).
DENSE_SIZE = (DIM + NUM_NUMERIC) * HIDDEN + HIDDEN + HIDDEN + 1

OPTIMIZERS = {
    "sgd": "sgd { learning_rate: 0.1 }",
    "adagrad": "adagrad { learning_rate: 0.05 initial_accumulator: 0.1 epsilon: 1e-8 }",
}


def ctr_config(mode: str = "BSP", workers: int = 1, optimizer: str = "sgd",
               num_train: int = 6400, extra: str = "", init_scale: float = 0.1,
               dense_size: int = DENSE_SIZE) -> str:
    """A job config: table "emb" (sparse, dim DIM) and "dense" (dense_size
    floats), both with `optimizer` (a key of OPTIMIZERS), 2 servers."""
    opt = OPTIMIZERS[optimizer]
    return f"""
name: "torch-ctr"
cluster {{ num_servers: 2 num_workers: {workers} num_slots: 64
          heartbeat_interval_ms: 200 heartbeat_timeout_ms: 5000 }}
consistency {{ mode: {mode} }}
tables {{ id: 0 name: "emb" sparse {{ dim: {DIM} }} optimizer {{ {opt} }}
         init {{ kind: NORMAL scale: {init_scale} seed: 11 }} }}
tables {{ id: 1 name: "dense" dense {{ size: {dense_size} }} optimizer {{ {opt} }} }}
data {{ synthetic_ctr {{ num_train: {num_train} num_test: 512 seed: 7
                        num_categorical: {NUM_CATEGORICAL} num_numeric: {NUM_NUMERIC} }} }}
training {{ batch_size: 32 {extra} }}
"""


class CtrNet(nn.Module):
    """logit = MLP([sum of the example's NUM_CATEGORICAL rows, numeric])."""

    def __init__(self, emb: nn.Module) -> None:
        super().__init__()
        self.emb = emb
        self.mlp = nn.Sequential(nn.Linear(DIM + NUM_NUMERIC, HIDDEN), nn.Tanh(),
                                 nn.Linear(HIDDEN, 1))

    def forward(self, keys: torch.Tensor, numeric: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.emb(keys), numeric], dim=1)).squeeze(1)


def ps_net(seed: int = 0) -> CtrNet:
    """The PS-backed model (table "emb" by name), dense init from `seed`."""
    torch.manual_seed(seed)
    return CtrNet(ps.torch.EmbeddingBag("emb", embedding_dim=DIM, mode="sum"))


def batch_tensors(batch: ps.data.CtrBatch) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys int64 (n, F) with the uint64 bits, numeric float32, labels float32)."""
    return (torch.from_numpy(batch.keys.view(np.int64)), torch.from_numpy(batch.numeric),
            torch.from_numpy(batch.labels))


def loss_of(model: nn.Module, batch: ps.data.CtrBatch) -> torch.Tensor:
    keys, numeric, labels = batch_tensors(batch)
    return F.binary_cross_entropy_with_logits(model(keys, numeric), labels)


class KeyIndex(nn.Module):
    """Maps uint64 keys (int64 bits) to rows of a plain nn.EmbeddingBag
    whose weight starts at the servers' initial values of `keys`."""

    def __init__(self, config: str, table: str, keys: np.ndarray, mode: str = "sum") -> None:
        super().__init__()
        self.keys = np.unique(keys.astype(np.uint64))
        init = ps.data.initial_values(config, table, self.keys)
        self.bag = nn.EmbeddingBag(len(self.keys), init.shape[1], mode=mode)
        with torch.no_grad():
            self.bag.weight.copy_(torch.from_numpy(init))

    def index(self, keys: torch.Tensor) -> torch.Tensor:
        k = keys.numpy().view(np.uint64)
        pos = np.searchsorted(self.keys, k)
        assert (self.keys[pos] == k).all()
        return torch.from_numpy(pos.astype(np.int64))

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self.bag(self.index(keys))

    def rows_of(self, keys: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.keys, keys.astype(np.uint64))
        return self.bag.weight.detach().numpy()[pos]


def reference_net(config: str, keys: np.ndarray, seed: int = 0) -> CtrNet:
    """The same model in plain PyTorch, over every key in `keys`: the MLP
    from the same seed, the rows from the servers' initial values."""
    torch.manual_seed(seed)
    mlp_init = CtrNet(nn.Identity()).mlp.state_dict()
    net = CtrNet(KeyIndex(config, "emb", keys))
    net.mlp.load_state_dict(mlp_init)
    return net


def dense_state(model: nn.Module) -> Dict[str, np.ndarray]:
    return {n: p.detach().numpy().copy() for n, p in model.named_parameters()
            if not n.startswith("emb.")}
