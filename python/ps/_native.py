"""Loads libps_native.so (python/native/ps_c.h) with ctypes.

The library is a plain C ABI: it links neither Python nor libtorch, so one
build serves every CPython 3 and every PyTorch version. ctypes releases the
GIL for the duration of every call into it.

Where it is looked for, first match wins:
  1. $PS_NATIVE_LIB (a path to the .so);
  2. beside this package (ps/libps_native.so, as deploy/bundle.sh lays it out);
  3. bazel-bin/python/libps_native.so of the checkout holding this package.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
from ctypes import (POINTER, Structure, c_char_p, c_double, c_int32, c_int64, c_size_t,
                    c_uint32, c_uint64, c_void_p)
from typing import Dict, List, Optional, Tuple

# The constants of ps_c.h (python/tests/test_abi.py checks them against it).
ABI_VERSION = 7
PENDING = -1
NO_TIMEOUT = -1.0
TRAINS_SHARDS = 1
OBSERVER = 2
REASON_NONE = 0
REASON_DROPPED = 1
REASON_SCHEDULER_UNREACHABLE = 2
REASON_JOB_FINISHED = 3
REASON_JOB_FAILED = 4
CLAIM_WAIT = 1
CLAIM_ASSIGNED = 2
CLAIM_ALL_DONE = 3
SHARD_TRAIN = 1
SHARD_ALL_DONE = 2
SHARD_STOPPED = 3

_lib: Optional[ctypes.CDLL] = None


class Position(Structure):
    """ps_position: where a data shard stands."""
    _fields_ = [("shard", c_uint32), ("epoch", c_uint64), ("batch", c_uint64),
                ("done", c_int32)]


class JobInfo(Structure):
    """ps_job_info (strings owned by the ps_config they came from)."""
    _fields_ = [("name", c_char_p), ("mode", c_char_p), ("staleness", c_uint32),
                ("num_workers", c_uint32), ("num_servers", c_uint32), ("prefetch", c_int32),
                ("clips_nonfinite", c_int32), ("num_tables", c_uint32),
                ("batch_size", c_uint64), ("epochs", c_uint64), ("shard_by_batch", c_int32),
                ("max_steps", c_uint64), ("export_path", c_char_p),
                ("checkpoint_dir", c_char_p)]


class SyntheticInfo(Structure):
    """ps_synthetic_info."""
    _fields_ = [("num_train", c_uint64), ("num_test", c_uint64),
                ("num_numeric", c_uint32), ("num_categorical", c_uint32)]


class TableInfo(Structure):
    """ps_table_info (strings owned by the ps_config they came from)."""
    _fields_ = [("name", c_char_p), ("id", c_uint32), ("sparse", c_int32), ("dim", c_uint32),
                ("size", c_uint64), ("optimizer", c_char_p), ("optimizer_json", c_char_p),
                ("allreduce", c_int32), ("allreduce_state_of", c_int32)]


class RingInfo(Structure):
    """ps_ring_info: where a replica of all-reduced dense tables stands
    (sizes in float32 elements)."""
    _fields_ = [("size", c_uint64), ("state_size", c_uint32), ("step", c_uint64),
                ("ring_size", c_uint32), ("generation", c_uint64), ("reforms", c_uint64),
                ("peer_clock", c_uint64), ("connected", c_int32)]


class SessionDetails(Structure):
    """ps_session_details."""
    _fields_ = [("rank", c_uint32), ("node_id", c_uint64), ("observer", c_int32),
                ("restored_start", c_int32), ("start_clock", c_uint64),
                ("has_position", c_int32), ("position", Position)]


class Claim(Structure):
    """ps_claim."""
    _fields_ = [("result", c_int32), ("position", Position), ("start_clock", c_uint64)]


class NextShard(Structure):
    """ps_next_shard: what the shard protocol answered."""
    _fields_ = [("result", c_int32), ("has_position", c_int32), ("position", Position)]


class TableStats(Structure):
    """ps_table_stats: one table on one server (proto TableStats)."""
    _fields_ = [("server", c_uint32), ("table_id", c_uint32), ("sparse", c_int32)] + [
        (name, c_uint64) for name in (
            "rows", "bytes", "memory_budget_bytes", "keys_pushed", "keys_pulled",
            "admissions", "pushes_filtered", "evictions_ttl", "evictions_budget",
            "pushes_refused", "keys_dropped", "backup_rows",
            # A sparse table's disk tier; 0 without one.
            "cold_rows", "disk_bytes", "demotions", "promotions", "cold_reads",
            "cold_misses", "bloom_useful", "disk_reads", "cold_read_micros",
            "disk_bytes_written", "cold_rows_dropped", "tier_errors", "tier_memory_bytes",
            "rows_read_ahead", "staged_rows")]


class JobProgress(Structure):
    """ps_job_progress: the job's progress as the scheduler computes it."""
    _fields_ = [("progress", c_double), ("has_eta", c_int32), ("eta_s", c_double),
                ("steps_done", c_uint64), ("steps_total", c_uint64),
                ("total_known", c_int32), ("steps_per_second", c_double),
                ("examples_per_second", c_double), ("examples", c_uint64),
                ("elapsed_s", c_double)]


def _candidates() -> list:
    here = pathlib.Path(__file__).resolve().parent
    found = []
    env = os.environ.get("PS_NATIVE_LIB")
    if env:
        found.append(pathlib.Path(env))
    found.append(here / "libps_native.so")
    found.append(here.parent.parent / "bazel-bin" / "python" / "libps_native.so")
    return found


_OUT = POINTER(c_void_p)  # ps_future** / ps_config** (opaque handles)
_U64P = POINTER(c_uint64)
_F32P = POINTER(ctypes.c_float)
_POS = POINTER(Position)

#: name: (result type, argument types) of every function of ps_c.h. Opaque
#: handles and buffers are c_void_p; python/tests/test_abi.py checks this
#: table against the header.
SIGNATURES: Dict[str, Tuple[Optional[type], List[type]]] = {
    "ps_abi_version": (c_int32, []),
    "ps_last_error": (c_char_p, []),
    "ps_last_error_reason": (c_int32, []),
    "ps_set_log_level": (c_int32, [c_char_p]),
    "ps_hash_keys": (None, [c_uint32, _U64P, c_size_t, _U64P]),
    "ps_config_load": (c_int32, [c_char_p, c_int64, c_int64, _OUT]),
    "ps_config_free": (None, [c_void_p]),
    "ps_config_job": (c_int32, [c_void_p, POINTER(JobInfo)]),
    "ps_config_table": (c_int32, [c_void_p, c_uint32, POINTER(TableInfo)]),
    "ps_config_synthetic_ctr": (c_int32, [c_void_p, POINTER(SyntheticInfo)]),
    "ps_initial_values": (c_int32, [c_void_p, c_char_p, _U64P, c_size_t, c_uint64, _F32P,
                                    c_size_t]),
    "ps_synthetic_ctr": (c_int32, [c_void_p, c_int32, c_uint64, c_uint64, _F32P, c_size_t,
                                   _U64P, c_size_t, _F32P, _F32P]),
    "ps_session_start": (c_int32, [c_void_p, c_char_p, c_int32, c_double, c_double, _OUT]),
    "ps_session_free": (None, [c_void_p]),
    "ps_session_info": (c_int32, [c_void_p, POINTER(SessionDetails)]),
    "ps_session_config": (c_void_p, [c_void_p]),
    "ps_session_clock": (c_uint64, [c_void_p]),
    "ps_session_slow_workers": (c_void_p, [c_void_p]),
    "ps_free_string": (None, [c_void_p]),
    "ps_session_last_checkpoint": (c_uint64, [c_void_p]),
    "ps_session_stop_requested": (c_int32, [c_void_p]),
    "ps_session_ended": (c_int32, [c_void_p]),
    "ps_session_request_stop": (None, [c_void_p]),
    "ps_session_end_step": (c_int32, [c_void_p, _POS, _OUT]),
    "ps_session_barrier": (c_int32, [c_void_p, c_char_p, c_double, _OUT]),
    "ps_session_claim": (c_int32, [c_void_p, _POS, _OUT]),
    "ps_session_restart": (c_int32, [c_void_p, c_uint64]),
    "ps_session_job_progress": (c_int32, [c_void_p, POINTER(JobProgress)]),
    "ps_session_report_metric": (c_int32, [c_void_p, c_char_p, c_double]),
    "ps_session_report_trained": (c_int32, [c_void_p, c_uint64, c_double, c_uint64]),
    "ps_session_set_shard_batches": (c_int32, [c_void_p, c_uint64]),
    "ps_session_next_shard": (c_int32, [c_void_p, _POS, _OUT]),
    "ps_session_finish": (c_int32, [c_void_p, c_double, _OUT]),
    "ps_session_evaluation_done": (c_int32, [c_void_p]),
    "ps_session_checkpoint": (c_int32, [c_void_p, _OUT]),
    "ps_session_leave": (c_int32, [c_void_p, c_int32, _POS]),
    "ps_pull": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t, _OUT]),
    "ps_prefetch": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, _OUT]),
    "ps_push": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t, _OUT]),
    "ps_push_pull": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t,
                               c_void_p, c_size_t, _OUT]),
    "ps_pull_dense": (c_int32, [c_void_p, c_uint32, c_uint64, c_size_t, c_void_p, _OUT]),
    "ps_push_dense": (c_int32, [c_void_p, c_uint32, c_uint64, c_void_p, c_size_t, _OUT]),
    "ps_assign_dense": (c_int32, [c_void_p, c_uint32, c_uint64, c_void_p, c_size_t, _OUT]),
    "ps_scan": (c_int32, [c_void_p, c_uint32, _OUT]),
    "ps_stats": (c_int32, [c_void_p, _OUT]),
    "ps_allreduce_create": (c_int32, [c_void_p, POINTER(c_uint32), c_size_t, _F32P, c_size_t,
                                      c_uint64, c_char_p, _OUT]),
    "ps_allreduce_free": (None, [c_void_p]),
    "ps_allreduce_join": (c_int32, [c_void_p, c_uint32]),
    "ps_allreduce_step": (c_int32, [c_void_p, c_void_p, c_size_t]),
    "ps_allreduce_end_step": (c_int32, [c_void_p, c_void_p, c_size_t, _POS, _OUT]),
    "ps_allreduce_write": (c_int32, [c_void_p]),
    "ps_allreduce_read": (c_int32, [c_void_p, c_int32]),
    "ps_allreduce_leave": (c_int32, [c_void_p]),
    "ps_allreduce_values": (c_int32, [c_void_p, c_uint64, c_void_p, c_size_t]),
    "ps_allreduce_state": (c_int32, [c_void_p, c_void_p, c_size_t]),
    "ps_allreduce_reset": (c_int32, [c_void_p, c_void_p, c_size_t, c_void_p, c_size_t,
                                     c_uint64]),
    "ps_allreduce_info": (c_int32, [c_void_p, POINTER(RingInfo)]),
    "ps_future_wait": (c_int32, [c_void_p, c_double]),
    "ps_future_done": (c_int32, [c_void_p]),
    "ps_future_min_clock": (c_uint64, [c_void_p]),
    "ps_future_claim": (c_int32, [c_void_p, POINTER(Claim)]),
    "ps_future_next_shard": (c_int32, [c_void_p, POINTER(NextShard)]),
    "ps_future_ranks": (c_int32, [c_void_p, POINTER(c_uint32), c_size_t, POINTER(c_size_t)]),
    "ps_future_finish": (c_int32, [c_void_p, POINTER(c_int32)]),
    "ps_future_checkpoint": (c_int32, [c_void_p, _U64P]),
    "ps_future_stats": (c_int32, [c_void_p, POINTER(TableStats), c_size_t,
                                  POINTER(c_size_t)]),
    "ps_future_take_session": (c_void_p, [c_void_p]),
    "ps_future_scan_size": (c_int32, [c_void_p, _U64P, POINTER(c_uint32)]),
    "ps_future_scan_copy": (c_int32, [c_void_p, c_void_p, c_void_p]),
    "ps_future_free": (None, [c_void_p]),
}


def _declare(lib: ctypes.CDLL) -> None:
    for name, (res, args) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def lib() -> ctypes.CDLL:
    """The loaded native library (loaded on first use)."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if not path.is_file():
            tried.append(f"{path} (missing)")
            continue
        loaded = ctypes.CDLL(str(path))
        _declare(loaded)
        version = loaded.ps_abi_version()
        if version != ABI_VERSION:
            raise ImportError(
                f"{path} has C ABI version {version}; this package needs {ABI_VERSION}")
        _lib = loaded
        return _lib
    raise ImportError(
        "libps_native.so not found; build it with `bazel build --config=opt "
        "//python:libps_native.so` or set PS_NATIVE_LIB. Tried: " + "; ".join(tried))


def last_error() -> str:
    msg = lib().ps_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def last_error_reason() -> int:
    """REASON_* of this thread's last failed call."""
    return int(lib().ps_last_error_reason())


def position(p) -> Optional["ctypes._Pointer"]:
    """A ps.DataPosition (or None) as a ps_position* argument."""
    if p is None:
        return None
    return ctypes.pointer(Position(p.shard, p.epoch, p.batch, 1 if p.done else 0))


def take_string(ptr: Optional[int]) -> Optional[str]:
    """Copies a malloc'ed C string from the library and frees it."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().ps_free_string(ptr)
