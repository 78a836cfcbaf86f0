"""Data helpers: the synthetic CTR data of the C++ examples, and sharding.

`synthetic_ctr` produces exactly the examples the C++ trainer reads for the
same job config (worker/data/synthetic_ctr.h), so a Python model and a
built-in one can be compared on the same data and the same keys.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
from typing import Iterator, Optional, Union

import numpy as np

from . import _native
from .errors import last_failure


@dataclasses.dataclass
class CtrBatch:
    """A batch of synthetic CTR examples.

    numeric: float32 (n, num_numeric); keys: uint64 (n, num_categorical),
    one key per categorical field; labels: float32 (n,) of 0/1;
    true_logits: float32 (n,), the generating model's logits (the oracle).
    """

    numeric: np.ndarray
    keys: np.ndarray
    labels: np.ndarray
    true_logits: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])


class JobConfig:
    """A job config file, loaded and validated by the native library (the
    code every process of the job runs), never parsed here.

    num_servers, num_workers: override the file's cluster sizes (0 keeps
    them). Raises InvalidArgument (or another PsError) for a bad file.
    """

    def __init__(self, path: Union[str, os.PathLike], num_servers: int = 0,
                 num_workers: int = 0) -> None:
        self._handle: Optional[int] = None
        self.path = os.fspath(path)
        out = ctypes.c_void_p()
        code = _native.lib().ps_config_load(self.path.encode(), num_servers, num_workers,
                                            ctypes.byref(out))
        if code != 0:
            raise last_failure(code)
        self._handle = out.value

    @property
    def handle(self) -> int:
        """The ps_config* (valid while this object lives)."""
        return self._handle

    def describe(self) -> dict:
        """The job as a dict; see describe_config."""
        return describe_handle(self._handle)

    def synthetic_ctr(self) -> "_native.SyntheticInfo":
        """The sizes of data.synthetic_ctr (InvalidArgument without one)."""
        info = _native.SyntheticInfo()
        code = _native.lib().ps_config_synthetic_ctr(self._handle, ctypes.byref(info))
        if code != 0:
            raise last_failure(code)
        return info

    def __del__(self) -> None:
        h, self._handle = getattr(self, "_handle", None), None
        if h:
            try:
                _native.lib().ps_config_free(h)
            except Exception:  # noqa: BLE001  (interpreter shutdown)
                pass


def _text(b: Optional[bytes]) -> str:
    return b.decode("utf-8", "replace") if b else ""


def describe_handle(handle: int) -> dict:
    """The job of a ps_config* as a dict (see describe_config)."""
    lib = _native.lib()
    job = _native.JobInfo()
    code = lib.ps_config_job(handle, ctypes.byref(job))
    if code != 0:
        raise last_failure(code)
    tables = []
    for i in range(job.num_tables):
        t = _native.TableInfo()
        code = lib.ps_config_table(handle, i, ctypes.byref(t))
        if code != 0:
            raise last_failure(code)
        tables.append({"name": _text(t.name), "id": int(t.id), "sparse": bool(t.sparse),
                       "dim": int(t.dim), "size": int(t.size),
                       "optimizer": _text(t.optimizer),
                       "optimizer_config": json.loads(_text(t.optimizer_json) or "{}"),
                       "allreduce": bool(t.allreduce),
                       "allreduce_state_of": (int(t.allreduce_state_of)
                                              if t.allreduce_state_of >= 0 else None)})
    return {
        "name": _text(job.name), "mode": _text(job.mode), "staleness": int(job.staleness),
        "num_workers": int(job.num_workers), "num_servers": int(job.num_servers),
        "prefetch": bool(job.prefetch), "clips_nonfinite": bool(job.clips_nonfinite),
        "training": {"batch_size": int(job.batch_size), "epochs": int(job.epochs),
                     "shard_by_batch": bool(job.shard_by_batch),
                     "max_steps": int(job.max_steps),
                     "export_path": _text(job.export_path)},
        "checkpoint_dir": _text(job.checkpoint_dir),
        "tables": tables,
    }


def describe_config(path: Union[str, os.PathLike], num_servers: int = 0,
                    num_workers: int = 0) -> dict:
    """The job config at `path`, validated, as a dict: name, mode
    (ASYNC|BSP|SSP), staleness, cluster sizes, prefetch, clips_nonfinite,
    training (batch_size, epochs, shard_by_batch, max_steps, export_path),
    checkpoint_dir, tables (name, id, sparse, dim, size, optimizer,
    optimizer_config, allreduce: a dense table with sync ALLREDUCE,
    allreduce_state_of: for the companion table holding such a table's
    optimizer state on the servers, that table's id, else None)."""
    return JobConfig(path, num_servers, num_workers).describe()


class SyntheticCtr:
    """The job's data.synthetic_ctr examples (train split 0, test split 1)."""

    def __init__(self, config: Union[str, os.PathLike, JobConfig]) -> None:
        self._config = config if isinstance(config, JobConfig) else JobConfig(config)
        self.config = self._config.path
        info = self._config.synthetic_ctr()
        self.num_train = int(info.num_train)
        self.num_test = int(info.num_test)
        self.num_categorical = int(info.num_categorical)
        self.num_numeric = int(info.num_numeric)

    def size(self, split: int) -> int:
        return self.num_train if split == 0 else self.num_test

    def fill(self, split: int, begin: int, count: int) -> CtrBatch:
        """Examples [begin, begin + count) of `split` (0 train, 1 test)."""
        numeric = np.empty((count, self.num_numeric), dtype=np.float32)
        keys = np.empty((count, self.num_categorical), dtype=np.uint64)
        labels = np.empty(count, dtype=np.float32)
        logits = np.empty(count, dtype=np.float32)
        f32 = ctypes.POINTER(ctypes.c_float)
        code = _native.lib().ps_synthetic_ctr(
            self._config.handle, split, begin, count, numeric.ctypes.data_as(f32),
            numeric.size, keys.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), keys.size,
            labels.ctypes.data_as(f32), logits.ctypes.data_as(f32))
        if code != 0:
            raise last_failure(code)
        return CtrBatch(numeric, keys, labels, logits)

    def shard_batches(self, shard: int, num_shards: int, batch_size: int,
                      interleave: bool = True, split: int = 0) -> "ShardBatches":
        """The batches of data shard `shard` of `num_shards` (see ShardBatches)."""
        return ShardBatches(self, shard, num_shards, batch_size, interleave, split)


class ShardBatches:
    """Batches of one data shard, with skip(n) for resuming.

    interleave=True: batch i of shard s is the global batch i*k + s of size
    batch_size (k = num_shards), as training.shard_by_batch does in C++, so
    k workers of batch b see together what one worker of batch k*b sees
    (under BSP they then train alike). interleave=False: shard s is a
    contiguous 1/k of the examples. A last partial batch is kept.
    """

    def __init__(self, data: SyntheticCtr, shard: int, num_shards: int, batch_size: int,
                 interleave: bool = True, split: int = 0) -> None:
        self.data, self.shard, self.k, self.b = data, shard, num_shards, batch_size
        self.interleave, self.split = interleave, split
        n = data.size(split)
        if interleave:
            self.ranges = []
            i = shard
            while i * batch_size < n:
                lo = i * batch_size
                self.ranges.append((lo, min(n, lo + batch_size)))
                i += num_shards
        else:
            lo, hi = n * shard // num_shards, n * (shard + 1) // num_shards
            self.ranges = [(a, min(hi, a + batch_size)) for a in range(lo, hi, batch_size)]
        self.next = 0

    def __len__(self) -> int:
        return len(self.ranges)

    def skip(self, n: int) -> None:
        """Skips the next n batches without generating them."""
        self.next = min(len(self.ranges), self.next + n)

    def __iter__(self) -> Iterator[CtrBatch]:
        return self

    def __next__(self) -> CtrBatch:
        if self.next >= len(self.ranges):
            raise StopIteration
        lo, hi = self.ranges[self.next]
        self.next += 1
        return self.data.fill(self.split, lo, hi - lo)


def initial_values(config: Union[str, os.PathLike, JobConfig], table: str,
                   keys: Optional[np.ndarray] = None, first: int = 0,
                   count: int = 0) -> np.ndarray:
    """The values the servers give new rows of `table` (sparse: keys, float32
    (n, dim)) or new elements of a dense table ([first, first + count))."""
    cfg = config if isinstance(config, JobConfig) else JobConfig(config)
    info = next((t for t in cfg.describe()["tables"] if t["name"] == table), None)
    if info is None:
        from .errors import InvalidArgument
        raise InvalidArgument(f"no table {table!r} in {cfg.path}")
    f32 = ctypes.POINTER(ctypes.c_float)
    u64 = ctypes.POINTER(ctypes.c_uint64)
    if info["sparse"]:
        from .session import as_keys
        k = as_keys(keys if keys is not None else np.empty(0, np.uint64))
        out = np.empty((k.size, int(info["dim"])), dtype=np.float32)
        code = _native.lib().ps_initial_values(cfg.handle, table.encode(),
                                               k.ctypes.data_as(u64), k.size, 0,
                                               out.ctypes.data_as(f32), out.size)
    else:
        out = np.empty(count, dtype=np.float32)
        code = _native.lib().ps_initial_values(cfg.handle, table.encode(), None, count,
                                               first, out.ctypes.data_as(f32), out.size)
    if code != 0:
        raise last_failure(code)
    return out
