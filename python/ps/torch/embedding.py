"""Embedding modules whose rows live in a sparse table on the servers.

A forward pass pulls the rows of the batch's distinct keys only
(torch.unique with return_inverse), builds a leaf tensor of them and looks
the batch up through the inverse indices: keys are uint64 hashes and are
never used as torch indices. In training (module.training and grad enabled)
the leaf requires grad and is recorded; ps.torch.Trainer takes the records
after backward, sums the gradients of each key over every module of the
same table, and pushes one row per distinct key. Under model.eval() or
torch.no_grad() nothing is recorded, so nothing is pushed.

The rows are not the module's: state_dict() and load_state_dict() of a
model holding these modules are refused (a state dict without the rows
would lose them silently). Trainer.export writes the dense parameters and
every table's rows; ps.torch.load_for_inference builds a plain model from
that file, whose own state dict then round-trips as usual.

Keys: int64 tensors (bit-cast to uint64, so negative values are the upper
half of the hash space), NumPy uint64/int64 arrays, or lists of ints.
Rows: float32, (n, embedding_dim), on the device of the input keys
(pulled to and pushed from the CPU).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..session import Future, Session, SparseTable

#: Prefetched pulls kept per module; older unmatched ones are dropped.
_MAX_PREFETCHED = 4


def _embedding_dim(embedding_dim: Optional[int], dim: Optional[int]) -> Optional[int]:
    """The row width given as embedding_dim= or its other name dim=."""
    if embedding_dim is not None and dim is not None and int(embedding_dim) != int(dim):
        raise TypeError(f"embedding_dim={embedding_dim} and dim={dim} differ (dim is "
                        "another name for embedding_dim: give one)")
    width = embedding_dim if embedding_dim is not None else dim
    return None if width is None else int(width)


def as_id_tensor(ids: Any) -> torch.Tensor:
    """`ids` as a CPU int64 tensor holding the uint64 keys' bits.

    Accepts torch integer tensors (int64 kept as is; narrower types must
    not be negative), NumPy uint64/int64/integer arrays and Python lists.
    """
    if isinstance(ids, torch.Tensor):
        t = ids.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.int64:
            return t
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"ids must be an integer tensor; got {t.dtype}")
        if t.numel() and int(t.min()) < 0:
            raise ValueError(f"ids of dtype {t.dtype} must not be negative "
                             "(use int64 to pass 64-bit hashes)")
        return t.long()
    a = np.asarray(ids)
    if a.dtype == np.uint64:
        a = a.view(np.int64)
    elif a.dtype != np.int64:
        if a.size == 0:
            a = a.astype(np.int64)
        elif not np.issubdtype(a.dtype, np.integer):
            raise TypeError(f"ids must be integers; got {a.dtype}")
        elif np.issubdtype(a.dtype, np.signedinteger) and a.min() < 0:
            raise ValueError(f"ids of dtype {a.dtype} must not be negative "
                             "(use int64 or uint64 to pass 64-bit hashes)")
        else:
            a = a.astype(np.uint64).view(np.int64)
    return torch.from_numpy(np.ascontiguousarray(a))


class TableModule(nn.Module):
    """Base of the modules backed by a sparse table (no parameters of its own).

    Args:
      table: a SparseTable; or a Session (then `table_name` names the
        table); or the table's name alone (then `embedding_dim` is
        required and the module is bound to a session later, by
        ps.torch.Trainer or bind()). The name-only form lets the same model
        factory build a PS-backed model and, with
        ps.torch.load_for_inference, a local one.
      table_name: the table's name when `table` is a Session.
      embedding_dim: the row width (floats per row), as torch.nn.Embedding
        names it; checked against the table when both are known. `dim` is
        another name for it.
    """

    def __init__(self, table: Union[SparseTable, Session, str],
                 table_name: Optional[str] = None, *, embedding_dim: Optional[int] = None,
                 dim: Optional[int] = None) -> None:
        super().__init__()
        dim = _embedding_dim(embedding_dim, dim)
        self._table: Optional[SparseTable] = None
        if isinstance(table, Session):
            if table_name is None:
                raise TypeError("table_name is required when a Session is given")
            t = table.table(table_name)
            self.table_name = table_name
            self.embedding_dim = int(dim) if dim is not None else getattr(t, "dim", 0)
            self.bind(t)
        elif isinstance(table, SparseTable):
            if table_name is not None and table_name != table.name:
                raise ValueError(f"table_name {table_name!r} differs from the table's "
                                 f"name {table.name!r}")
            self.table_name = table.name
            self.embedding_dim = int(dim) if dim is not None else table.dim
            self.bind(table)
        elif isinstance(table, str):
            if dim is None:
                raise TypeError(f"embedding_dim is required for table {table!r} given "
                                "by name")
            self.table_name = table
            self.embedding_dim = int(dim)
        else:
            raise TypeError("table must be a ps.SparseTable, a ps.Session (with "
                            f"table_name) or a table name; got {type(table).__name__}")
        if self.embedding_dim < 1:
            raise ValueError(f"embedding_dim must be >= 1; got {self.embedding_dim}")
        # (distinct keys int64 (n,), rows leaf float32 (n, dim)) per recorded
        # forward since the trainer last took them.
        self._records: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self._prefetched: List[Tuple[torch.Tensor, Future[np.ndarray]]] = []
        #: Pulls this module issued (prefetches included), and forwards
        #: that found their rows prefetched.
        self.pulls = 0
        self.prefetch_hits = 0

    # ---- binding

    def bind(self, table: Any) -> None:
        """Binds the module to `table` (a SparseTable of the same name and dim)."""
        if not isinstance(table, SparseTable):
            raise TypeError(f"table {getattr(table, 'name', table)!r} is not a sparse table")
        if table.name != self.table_name:
            raise ValueError(f"module of table {self.table_name!r} cannot bind table "
                             f"{table.name!r}")
        if table.dim != self.embedding_dim:
            raise ValueError(f"table {table.name!r} has dim {table.dim}; the module was "
                             f"built with embedding_dim {self.embedding_dim}")
        self._table = table

    @property
    def table(self) -> SparseTable:
        if self._table is None:
            raise RuntimeError(
                f"{type(self).__name__} of table {self.table_name!r} is not bound to a "
                "session: build it from a Session or SparseTable, call bind(), or create "
                "ps.torch.Trainer(sess, model), which binds the model's modules")
        return self._table

    @property
    def bound(self) -> bool:
        return self._table is not None

    # ---- pulls

    def prefetch(self, ids: Any) -> None:
        """Starts pulling the rows of `ids` for a later forward of the same
        distinct keys (which then uses them instead of pulling). The rows
        are the servers' values when the pull is served: pulled before this
        step's pushes they miss them (one step of staleness). Use through
        Trainer.step(prefetch=...), which calls it at the allowed time."""
        uniq = torch.unique(as_id_tensor(ids).reshape(-1), sorted=True)
        if uniq.numel() == 0:
            return
        self.pulls += 1
        self._prefetched.append((uniq, self.table.pull(uniq.numpy())))
        del self._prefetched[:-_MAX_PREFETCHED]

    def _take_prefetched(self, uniq: torch.Tensor) -> Optional[Future[np.ndarray]]:
        for i, (keys, fut) in enumerate(self._prefetched):
            if keys.shape == uniq.shape and torch.equal(keys, uniq):
                del self._prefetched[:i + 1]  # older ones are of skipped batches
                return fut
        return None

    def _lookup(self, ids: torch.Tensor,
                device: torch.device) -> Tuple[torch.Tensor, torch.Tensor]:
        """(inverse int64 like ids.reshape(-1), rows float32 (n, dim)), both
        on `device` (the input's: rows travel as float32 through the CPU)."""
        flat = ids.reshape(-1)
        uniq, inverse = torch.unique(flat, sorted=True, return_inverse=True)
        if uniq.numel() == 0:
            rows = torch.zeros(0, self.embedding_dim, dtype=torch.float32)
        else:
            fut = self._take_prefetched(uniq)
            if fut is None:
                self.pulls += 1
                fut = self.table.pull(uniq.numpy())
            else:
                self.prefetch_hits += 1
            rows = torch.from_numpy(fut.result())
        if device.type != "cpu":
            rows, inverse = rows.to(device), inverse.to(device)  # still a leaf
        if self.training and torch.is_grad_enabled():
            rows.requires_grad_(True)
            self._records.append((uniq, rows))
        return inverse, rows

    # ---- state dicts: the rows are the servers'

    def _save_to_state_dict(self, destination: Dict[str, Any], prefix: str,
                            keep_vars: bool) -> None:
        where = f" (module {prefix[:-1]!r})" if prefix else ""
        raise RuntimeError(
            f"the rows of table {self.table_name!r}{where} live on the servers, not in "
            "the model: its state_dict() would leave them out. Save a trained model with "
            "ps.torch.Trainer.export(path) (dense parameters and every table's rows) and "
            "load it with ps.torch.load_for_inference(path, model_factory); the state_dict() "
            "of a submodule without tables holds its dense parameters alone")

    def _load_from_state_dict(self, state_dict: Dict[str, Any], prefix: str,
                              local_metadata: Any, strict: bool, missing_keys: List[str],
                              unexpected_keys: List[str], error_msgs: List[str]) -> None:
        where = f" (module {prefix[:-1]!r})" if prefix else ""
        raise RuntimeError(
            f"the rows of table {self.table_name!r}{where} live on the servers: a state "
            "dict cannot be loaded into a model that holds them. Score an exported model "
            "with ps.torch.load_for_inference(path, model_factory); load dense "
            "parameters alone into the submodules without tables")

    # ---- what the trainer takes

    def take_records(self) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """The (distinct keys int64, gradient float32 (n, dim)) of every
        recorded forward whose rows received a gradient; clears the records."""
        out = []
        for keys, rows in self._records:
            if rows.grad is not None:
                out.append((keys, rows.grad.detach().cpu()))
        self._records = []
        return out

    def clear_records(self) -> None:
        """Drops the recorded forwards (their gradients are never pushed)."""
        self._records = []

    @property
    def pending_records(self) -> int:
        """Recorded forwards not yet taken by a trainer."""
        return len(self._records)

    def extra_repr(self) -> str:
        return f"table={self.table_name!r}, embedding_dim={self.embedding_dim}"


class EmbeddingBag(TableModule):
    """Like torch.nn.EmbeddingBag, with its rows in a sparse table.

    forward(input, offsets=None, per_sample_weights=None):
      input: 2-D (B, L) keys (B bags of L keys), or 1-D keys with `offsets`
        (int64 (B,) start of each bag; bags may be empty or of any length).
      per_sample_weights: float32 like input, only with mode "sum".
    Returns float32 (B, embedding_dim): the sum, mean or max of each bag's rows
    (an empty bag gives zeros).
    """

    def __init__(self, table: Union[SparseTable, Session, str],
                 table_name: Optional[str] = None, *, mode: str = "sum",
                 embedding_dim: Optional[int] = None, dim: Optional[int] = None,
                 include_last_offset: bool = False) -> None:
        super().__init__(table, table_name, embedding_dim=embedding_dim, dim=dim)
        if mode not in ("sum", "mean", "max"):
            raise ValueError(f"mode must be 'sum', 'mean' or 'max'; got {mode!r}")
        self.mode = mode
        self.include_last_offset = include_last_offset

    def forward(self, input: Any, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        device = input.device if isinstance(input, torch.Tensor) else torch.device("cpu")
        ids = as_id_tensor(input)
        if ids.dim() == 2 and offsets is not None:
            raise ValueError("offsets must be None for 2-D input")
        if ids.dim() == 1 and offsets is None:
            raise ValueError("1-D input needs offsets")
        if ids.dim() not in (1, 2):
            raise ValueError(f"input must be 1-D or 2-D; got shape {tuple(ids.shape)}")
        inverse, rows = self._lookup(ids, device)
        return F.embedding_bag(inverse.view(ids.shape), rows, offsets, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", mode={self.mode!r}"


class Embedding(TableModule):
    """Like torch.nn.Embedding, with its rows in a sparse table.

    forward(input): keys of any shape S; returns float32 S + (embedding_dim,).
    """

    def forward(self, input: Any) -> torch.Tensor:
        device = input.device if isinstance(input, torch.Tensor) else torch.device("cpu")
        ids = as_id_tensor(input)
        inverse, rows = self._lookup(ids, device)
        return F.embedding(inverse.view(ids.shape), rows)


def table_modules(model: nn.Module) -> List[Tuple[str, TableModule]]:
    """The model's PS-backed modules with their qualified names."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, TableModule)]
