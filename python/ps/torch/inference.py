"""Scoring without servers: a model rebuilt from Trainer.export's file.

    model = ps.torch.load_for_inference("model.pt", Net)   # Net() builds the
    scores = model(batch)                                  # model by table names

Every ps.torch.EmbeddingBag/Embedding of the factory's model is replaced by
a local module over the exported key -> row map. A key with no exported row
(never pushed) gets zeros by default; pass the job config as `config` to
give it the row the servers would have served instead (the table's
initializer, computed by the native library: no servers needed).

The file is read with torch.load(..., weights_only=True): tensors only, so
a crafted file cannot run code. The returned model is plain PyTorch: its
state_dict() (dense parameters, and each local table's "keys" and "rows"
buffers) loads strictly into another model from load_for_inference.
"""

from __future__ import annotations

import os
import pickle
from typing import Any, Callable, Dict, Optional, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .embedding import TableModule, as_id_tensor, table_modules
from .trainer import TABLE_PREFIX


class LocalTable(nn.Module):
    """Base of the local lookups: sorted keys (int64 bits of uint64) and
    their rows (float32 (n, dim)) as buffers."""

    def __init__(self, table_name: str, keys: torch.Tensor, rows: torch.Tensor,
                 config: Optional[str] = None) -> None:
        super().__init__()
        self.table_name = table_name
        self.embedding_dim = int(rows.shape[1])
        order = torch.argsort(keys)
        self.register_buffer("keys", keys[order].contiguous())
        self.register_buffer("rows", rows[order].contiguous().float())
        self.config = config

    def _initial(self, keys: torch.Tensor) -> torch.Tensor:
        if self.config is None:
            return torch.zeros(keys.numel(), self.embedding_dim)
        from ..data import initial_values
        return torch.from_numpy(initial_values(self.config, self.table_name,
                                               keys.numpy().view(np.uint64)))

    def _lookup(self, ids: torch.Tensor) -> tuple:
        ids = ids.to(self.keys.device)  # the buffers' device (model.to() moves them)
        uniq, inverse = torch.unique(ids.reshape(-1), sorted=True, return_inverse=True)
        n = self.keys.numel()
        if n == 0:
            found = torch.zeros(uniq.numel(), dtype=torch.bool, device=uniq.device)
            rows = torch.zeros(uniq.numel(), self.embedding_dim, device=uniq.device)
        else:
            pos = torch.searchsorted(self.keys, uniq).clamp_(max=n - 1)
            found = self.keys[pos] == uniq
            rows = self.rows[pos]
        if not bool(found.all()):
            rows = rows.clone()
            missing = ~found
            rows[missing] = self._initial(uniq[missing].cpu()).to(rows.device)
        return inverse, rows

    def extra_repr(self) -> str:
        init = "initializer" if self.config else "zeros"
        return (f"table={self.table_name!r}, rows={self.keys.numel()}, "
                f"embedding_dim={self.embedding_dim}, unknown keys={init}")


class LocalEmbeddingBag(LocalTable):
    """ps.torch.EmbeddingBag's forward over an exported table."""

    def __init__(self, table_name: str, keys: torch.Tensor, rows: torch.Tensor,
                 mode: str = "sum", include_last_offset: bool = False,
                 config: Optional[str] = None) -> None:
        super().__init__(table_name, keys, rows, config)
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input: Any, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        ids = as_id_tensor(input)
        inverse, rows = self._lookup(ids)
        return F.embedding_bag(inverse.view(ids.shape), rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset)


class LocalEmbedding(LocalTable):
    """ps.torch.Embedding's forward over an exported table."""

    def forward(self, input: Any) -> torch.Tensor:
        ids = as_id_tensor(input)
        inverse, rows = self._lookup(ids)
        return F.embedding(inverse.view(ids.shape), rows)


def _local(module: TableModule, keys: torch.Tensor, rows: torch.Tensor,
           config: Optional[str]) -> LocalTable:
    from .embedding import EmbeddingBag
    if isinstance(module, EmbeddingBag):
        return LocalEmbeddingBag(module.table_name, keys, rows, module.mode,
                                 module.include_last_offset, config)
    return LocalEmbedding(module.table_name, keys, rows, config)


def load_for_inference(path: Union[str, os.PathLike], model_factory: Callable[[], nn.Module],
                       config: Optional[Union[str, os.PathLike]] = None) -> nn.Module:
    """A plain module that scores like the exported PS-backed model.

    path: a file written by Trainer.export (read with weights_only=True:
    a file holding anything but tensors is refused with ValueError).
    model_factory(): builds the same model without a session (its ps.torch
    modules given by table name and embedding_dim). config: the job
    config; given, keys without an exported row get the table's initial
    values (as the servers answer); None: zeros. Returns the model in eval
    mode, its table modules replaced by local ones, its dense parameters
    and buffers loaded (strictly: names must match).
    """
    try:
        state: Dict[str, torch.Tensor] = torch.load(path, map_location="cpu",
                                                    weights_only=True)
    except pickle.UnpicklingError as e:
        raise ValueError(f"{os.fspath(path)}: not a file of tensors only, as Trainer.export "
                         f"writes (read with weights_only=True): {e}") from e
    tables: Dict[str, Dict[str, torch.Tensor]] = {}
    dense: Dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if k.startswith(TABLE_PREFIX):
            name, _, what = k[len(TABLE_PREFIX):].rpartition(".")
            tables.setdefault(name, {})[what] = v
        else:
            dense[k] = v
    model = model_factory()
    cfg = os.fspath(config) if config is not None else None
    for qualified, module in table_modules(model):
        t = tables.get(module.table_name)
        if t is None:
            raise KeyError(f"{path}: no exported table {module.table_name!r} (tables: "
                           f"{', '.join(tables) or 'none'})")
        if t["rows"].shape[1] != module.embedding_dim and t["rows"].numel():
            raise ValueError(f"table {module.table_name!r}: exported rows of dim "
                             f"{t['rows'].shape[1]}, module of dim {module.embedding_dim}")
        rows = t["rows"].reshape(-1, module.embedding_dim)
        local = _local(module, t["keys"], rows, cfg)
        # The local module's buffers join the strict load below.
        dense.update(local.state_dict(prefix=f"{qualified}." if qualified else ""))
        if not qualified:
            model = local
            break
        parent_name, _, child = qualified.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, local)
    model.load_state_dict(dense, strict=True)
    return model.eval()
