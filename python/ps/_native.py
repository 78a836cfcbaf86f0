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
from ctypes import (POINTER, c_char_p, c_double, c_int32, c_int64, c_size_t,
                    c_uint32, c_uint64, c_void_p)
from typing import Optional

ABI_VERSION = 1
PENDING = -1

_lib: Optional[ctypes.CDLL] = None


def _candidates() -> list:
    here = pathlib.Path(__file__).resolve().parent
    found = []
    env = os.environ.get("PS_NATIVE_LIB")
    if env:
        found.append(pathlib.Path(env))
    found.append(here / "libps_native.so")
    found.append(here.parent.parent / "bazel-bin" / "python" / "libps_native.so")
    return found


def _declare(lib: ctypes.CDLL) -> None:
    f = POINTER(c_void_p)  # ps_future** / generic out pointer
    u64p = POINTER(c_uint64)
    f32p = POINTER(ctypes.c_float)
    sigs = {
        "ps_abi_version": (c_int32, []),
        "ps_last_error": (c_char_p, []),
        "ps_set_log_level": (c_int32, [c_char_p]),
        "ps_hash_keys": (None, [c_uint32, u64p, c_size_t, u64p]),
        "ps_describe_config": (c_int32, [c_char_p, c_int64, c_int64, POINTER(c_void_p)]),
        "ps_free_string": (None, [c_void_p]),
        "ps_initial_values": (c_int32, [c_char_p, c_char_p, u64p, c_size_t, c_uint64,
                                        f32p, c_size_t]),
        "ps_synthetic_ctr": (c_int32, [c_char_p, c_int32, c_uint64, c_uint64, f32p,
                                       c_size_t, u64p, c_size_t, f32p, f32p]),
        "ps_session_start": (c_int32, [c_char_p, c_char_p, c_int64, c_int64, c_int32,
                                       c_double, c_double, f]),
        "ps_session_free": (None, [c_void_p]),
        "ps_session_info": (c_int32, [c_void_p, POINTER(c_void_p)]),
        "ps_session_clock": (c_uint64, [c_void_p]),
        "ps_session_last_checkpoint": (c_uint64, [c_void_p]),
        "ps_session_slow_workers": (c_void_p, [c_void_p]),
        "ps_session_stop_requested": (c_int32, [c_void_p]),
        "ps_session_ended": (c_int32, [c_void_p]),
        "ps_session_request_stop": (None, [c_void_p]),
        "ps_session_end_step": (c_int32, [c_void_p, c_int32, c_uint32, c_uint64,
                                          c_uint64, c_int32, f]),
        "ps_session_barrier": (c_int32, [c_void_p, c_char_p, c_double, f]),
        "ps_session_claim": (c_int32, [c_void_p, c_int32, c_uint32, c_uint64, c_uint64,
                                       f]),
        "ps_session_restart": (c_int32, [c_void_p, c_uint64]),
        "ps_session_next_shard": (c_int32, [c_void_p, c_int32, c_uint32, c_uint64, c_uint64,
                                            c_int32, f]),
        "ps_session_finish": (c_int32, [c_void_p, c_double, f]),
        "ps_session_evaluation_done": (c_int32, [c_void_p]),
        "ps_session_checkpoint": (c_int32, [c_void_p, f]),
        "ps_session_leave": (c_int32, [c_void_p, c_int32, c_int32, c_uint32, c_uint64,
                                       c_uint64, c_int32]),
        "ps_pull": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t,
                              f]),
        "ps_push": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p, c_size_t,
                              f]),
        "ps_push_pull": (c_int32, [c_void_p, c_uint32, c_void_p, c_size_t, c_void_p,
                                   c_size_t, c_void_p, c_size_t, f]),
        "ps_pull_dense": (c_int32, [c_void_p, c_uint32, c_uint64, c_size_t, c_void_p, f]),
        "ps_push_dense": (c_int32, [c_void_p, c_uint32, c_uint64, c_void_p, c_size_t, f]),
        "ps_assign_dense": (c_int32, [c_void_p, c_uint32, c_uint64, c_void_p, c_size_t,
                                      f]),
        "ps_scan": (c_int32, [c_void_p, c_uint32, f]),
        "ps_stats": (c_int32, [c_void_p, f]),
        "ps_future_wait": (c_int32, [c_void_p, c_double]),
        "ps_future_done": (c_int32, [c_void_p]),
        "ps_future_min_clock": (c_uint64, [c_void_p]),
        "ps_future_value": (c_int64, [c_void_p]),
        "ps_future_text": (c_void_p, [c_void_p]),
        "ps_future_take_session": (c_void_p, [c_void_p]),
        "ps_future_scan_size": (c_int32, [c_void_p, POINTER(c_uint64), POINTER(c_uint32)]),
        "ps_future_scan_copy": (c_int32, [c_void_p, c_void_p, c_void_p]),
        "ps_future_free": (None, [c_void_p]),
    }
    for name, (res, args) in sigs.items():
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


def take_string(ptr: Optional[int]) -> Optional[str]:
    """Copies a malloc'ed C string from the library and frees it."""
    if not ptr:
        return None
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        lib().ps_free_string(ptr)
