"""Sessions, table handles and futures over the native library.

A Session is one worker of a job (or a tool that reads and writes tables):
it registers with the scheduler, waits for the servers, and then pushes and
pulls through the data plane. Every data-plane call returns a Future at
once; the request runs on the library's I/O thread. Every wait releases the
GIL and wakes every 50 ms, so Ctrl-C (KeyboardInterrupt) and other Python
signal handlers run within that time.

Arrays: keys are 1-D uint64 (int64 and torch.int64 are bit-cast, no copy;
other integer types are converted). Values are float32, row-major
(n, dim) for sparse tables; float16, bfloat16 (torch) and float64 are
converted to float32 first. Nothing is copied element by element in
Python: buffers cross to the library as pointers.

Units: timeouts in seconds (float); clocks count steps.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import operator
import os
import signal
import threading
import time
import weakref
from typing import (Any, Callable, Dict, Generic, Iterable, Iterator, List, Optional, Tuple,
                    TypeVar, Union)

import numpy as np

from . import _native
from .allreduce import AllReducedDense
from .data import JobConfig, describe_handle
from .errors import (Cancelled, FailedPrecondition, ForkError, InvalidArgument, PsError,
                     from_code, last_failure)
from .progress import JobProgress, Monitor, ProgressArg

#: The clock of a worker that has finished training (common/protocol.h).
FINISHED_CLOCK = 1 << 62

_SLICE = 0.05  # seconds per wait slice: the worst delay before Ctrl-C is seen


@dataclasses.dataclass(frozen=True)
class DataPosition:
    """Where a data shard stands: shard index, 0-based epoch, next batch."""

    shard: int
    epoch: int = 0
    batch: int = 0
    done: bool = False


def _check(code: int) -> None:
    if code != 0:
        raise last_failure(code)


def _position(p: "_native.Position") -> DataPosition:
    return DataPosition(int(p.shard), int(p.epoch), int(p.batch), bool(p.done))


def _out_ptr() -> ctypes.c_void_p:
    return ctypes.c_void_p()


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def as_keys(keys: Any) -> np.ndarray:
    """`keys` as a contiguous 1-D uint64 array (bit-cast from int64)."""
    if hasattr(keys, "detach") and hasattr(keys, "dtype"):  # a torch tensor
        import torch  # noqa: F401  (present when a tensor is)
        keys = keys.detach()
        if keys.device.type != "cpu":
            keys = keys.cpu()
        if not keys.dtype.is_floating_point and keys.dtype.itemsize == 8:
            keys = keys.contiguous().numpy()
        else:
            keys = keys.numpy()
    a = np.asarray(keys)
    if a.ndim != 1:
        if a.ndim == 0:
            a = a.reshape(1)
        else:
            raise InvalidArgument(f"keys must be 1-D; got shape {a.shape}")
    if a.dtype == np.uint64:
        pass
    elif a.dtype == np.int64:
        a = a.view(np.uint64)
    elif np.issubdtype(a.dtype, np.integer):
        if np.issubdtype(a.dtype, np.signedinteger) and a.size and a.min() < 0:
            raise InvalidArgument(
                f"keys of dtype {a.dtype} must not be negative (use int64 or uint64 "
                "to pass 64-bit hashes)")
        a = a.astype(np.uint64)
    else:
        raise InvalidArgument(f"keys must be integers (uint64 or int64); got {a.dtype}")
    return np.ascontiguousarray(a)


def as_values(values: Any, what: str = "values") -> np.ndarray:
    """`values` as a contiguous float32 array (any shape)."""
    if hasattr(values, "detach") and hasattr(values, "dtype"):  # a torch tensor
        import torch
        t = values.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype != torch.float32:
            if t.dtype == torch.bool or t.dtype.is_complex:
                raise InvalidArgument(f"{what} must be real numbers; got {t.dtype}")
            t = t.float()
        values = t.contiguous().numpy()
    a = np.asarray(values)
    if a.dtype != np.float32:
        if a.dtype == np.bool_ or not (np.issubdtype(a.dtype, np.floating)
                                       or np.issubdtype(a.dtype, np.integer)):
            raise InvalidArgument(f"{what} must be real numbers; got {a.dtype}")
        a = a.astype(np.float32)
    return np.ascontiguousarray(a)


def _first_nonfinite(a: np.ndarray) -> Optional[int]:
    if np.isfinite(a).all():
        return None
    return int(np.flatnonzero(~np.isfinite(a.reshape(-1)))[0])


#: What a Future's result() returns.
_T = TypeVar("_T")


class Future(Generic[_T]):
    """The result of an asynchronous call. `result()` waits for it and
    returns a _T (Future[np.ndarray] for pulls, Future[None] for writes).

    The buffers the request reads or writes are held by the future until
    it completes; a future dropped before completion is kept by its session
    until then, so the library never writes into freed memory.
    """

    def __init__(self, session: "Session", handle: int, keep: Tuple = (),
                 convert: Optional[Callable[["Future"], Any]] = None,
                 lifecycle: bool = False) -> None:
        self._session = session
        self._handle = handle
        self._keep = keep
        self._convert = convert
        self._lifecycle = lifecycle
        self._status: Optional[Tuple[int, str, int]] = None  # code, message, reason
        self._value: Any = None
        self._converted = False
        self._pid = os.getpid()

    @classmethod
    def _completed(cls, session: "Session", value: Any) -> "Future":
        """A future already done with `value` (no native request)."""
        f = cls(session, 0)
        f._status = (0, "", _native.REASON_NONE)
        f._value = value
        f._converted = True
        return f

    def done(self) -> bool:
        """True once the request completed (successfully or not)."""
        if self._status is not None:
            return True
        return self._poll(0.0)

    def _poll(self, timeout: float) -> bool:
        if self._status is not None:
            return True
        if os.getpid() != self._pid:
            raise ForkError("a future of a session started in another process "
                            "(before fork) cannot be used here")
        lib = _native.lib()
        code = lib.ps_future_wait(self._handle, timeout)
        if code == _native.PENDING:
            return False
        self._status = ((code, _native.last_error(), _native.last_error_reason()) if code != 0
                        else (0, "", _native.REASON_NONE))
        return True

    def result(self, timeout: Optional[float] = None) -> _T:
        """Waits for the result (at most `timeout` seconds; None: no limit).

        Raises the PsError subclass of the failure, or ps.Timeout when
        `timeout` passed (the request goes on; call again to keep waiting).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._poll(_SLICE if deadline is None
                                 else max(0.0, min(_SLICE, deadline - time.monotonic()))):
                if deadline is not None and time.monotonic() >= deadline:
                    from .errors import Timeout
                    waiting = self._session._slow_workers() if self._session else ""
                    raise Timeout(f"no answer within {timeout} s (the request goes on)"
                                  + (f"; waiting for {waiting}" if waiting else ""))
        except KeyboardInterrupt:
            if self._lifecycle:
                # Stop the session's wait, let the operation end, then
                # propagate the interrupt.
                self._session._request_stop_native()
                while not self._poll(_SLICE):
                    pass
            raise
        code, message, reason = self._status
        if code != 0:
            raise from_code(code, message, reason)
        if not self._converted:
            self._value = self._convert(self) if self._convert else None
            self._converted = True
        return self._value

    def exception(self, timeout: Optional[float] = None) -> Optional[PsError]:
        """The failure as an exception (None on success), after waiting."""
        try:
            self.result(timeout)
        except PsError as e:
            return e
        return None

    @property
    def min_clock(self) -> int:
        """Pulls: the slowest live worker's clock when the servers answered."""
        self.result()
        return int(_native.lib().ps_future_min_clock(self._handle))

    def _free(self) -> None:
        h, self._handle = self._handle, None
        if h and os.getpid() == self._pid:
            _native.lib().ps_future_free(h)

    def __del__(self) -> None:
        try:
            if not self._handle:
                return
            if os.getpid() != self._pid:
                return  # a forked child's copy: the parent owns the handle
            if self._status is None and not self._lifecycle and not self._poll(0.0):
                s = self._session
                if s is not None and not s._closed:
                    s._orphans.append((self._handle, self._keep))
                    self._handle = None
                    return
            self._free()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


class _Table:
    def __init__(self, session: "Session", info: Dict[str, Any]) -> None:
        self._session = session
        self.name: str = info["name"]
        self.id: int = int(info["id"])
        self.optimizer: str = info["optimizer"]
        self.optimizer_config: Dict[str, Any] = info.get("optimizer_config", {})

    def stats(self) -> List[Dict[str, Any]]:
        """This table's statistics on every live server (list of dicts)."""
        return [s for s in self._session.stats() if int(s.get("table_id", -1)) == self.id]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} id={self.id}>"


class SparseTable(_Table):
    """Rows of `dim` float32 values addressed by uint64 keys.

    A pull of a key that has no row yet answers its initial values and
    creates nothing. A key listed twice in one push is applied twice: push
    one summed gradient per distinct key (ps.torch does this for you).
    """

    def __init__(self, session: "Session", info: Dict[str, Any]) -> None:
        super().__init__(session, info)
        self.dim: int = int(info["dim"])

    def _grads(self, keys: np.ndarray, grads: Any) -> np.ndarray:
        g = as_values(grads, "gradients")
        if g.size != keys.size * self.dim or (g.ndim == 2 and g.shape != (keys.size, self.dim)):
            raise InvalidArgument(
                f"table {self.name!r} (dim {self.dim}): {keys.size} keys need gradients "
                f"of shape ({keys.size}, {self.dim}); got {tuple(g.shape)}")
        bad = _first_nonfinite(g)
        if bad is not None and not self._session._clips_nonfinite:
            row, col = divmod(bad, self.dim)
            raise InvalidArgument(
                f"non-finite gradient at element {bad} (key {int(keys[row])}, column {col}) "
                f"of the push to table {self.name!r}: {g.reshape(-1)[bad]}; nothing was sent")
        return g

    def _out(self, keys: np.ndarray, out: Optional[np.ndarray]) -> np.ndarray:
        if out is None:
            return np.empty((keys.size, self.dim), dtype=np.float32)
        if (not isinstance(out, np.ndarray) or out.dtype != np.float32
                or not out.flags.c_contiguous or out.size != keys.size * self.dim):
            raise InvalidArgument(
                f"out must be a C-contiguous float32 array of {keys.size}x{self.dim}")
        return out

    def pull(self, keys: Any, out: Optional[np.ndarray] = None) -> Future[np.ndarray]:
        """Future of the rows of `keys`: float32 array of shape (n, dim)."""
        k = as_keys(keys)
        o = self._out(k, out)
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_pull(s._handle(), self.id, _ptr(k), k.size, _ptr(o),
                                     o.size, ctypes.byref(h)))
        return s._future(h, (k, o), lambda f: o)

    def prefetch(self, keys: Any) -> Future[None]:
        """Tells the servers that `keys` will be pulled or pushed soon.

        A hint for tables with a disk tier: the servers start reading the
        keys' cold rows into RAM, so the later pull or push does not wait
        for the disk. Changes no value; on other tables it does nothing.
        Call it with the next batch's keys (uint64) before training on the
        current one. The Future completes once every server answered (their
        reads go on); errors are harmless to ignore.
        """
        k = as_keys(keys)
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_prefetch(s._handle(), self.id, _ptr(k), k.size,
                                         ctypes.byref(h)))
        return s._future(h, (k,))

    def push(self, keys: Any, grads: Any) -> Future[None]:
        """Sends gradients (n, dim) of `keys`; Future of None once applied."""
        k = as_keys(keys)
        g = self._grads(k, grads)
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_push(s._handle(), self.id, _ptr(k), k.size, _ptr(g), g.size,
                                     ctypes.byref(h)))
        return s._future(h, ())

    def push_pull(self, keys: Any, grads: Any,
                  out: Optional[np.ndarray] = None) -> Future[np.ndarray]:
        """Pushes gradients and pulls the updated rows in one round trip."""
        k = as_keys(keys)
        g = self._grads(k, grads)
        o = self._out(k, out)
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_push_pull(s._handle(), self.id, _ptr(k), k.size, _ptr(g),
                                          g.size, _ptr(o), o.size, ctypes.byref(h)))
        return s._future(h, (k, o), lambda f: o)

    def scan(self) -> Tuple[np.ndarray, np.ndarray]:
        """Every row the servers hold: (keys uint64 (n,), rows float32 (n, dim)).

        Call when no rows are being created (after training, or from an
        observer between steps): rows created or dropped meanwhile may be
        missed or listed twice.
        """
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_scan(s._handle(), self.id, ctypes.byref(h)))
        f = s._future(h, ())
        f.result()
        rows = ctypes.c_uint64()
        dim = ctypes.c_uint32()
        _check(_native.lib().ps_future_scan_size(f._handle, ctypes.byref(rows),
                                                  ctypes.byref(dim)))
        keys = np.empty(rows.value, dtype=np.uint64)
        values = np.empty((rows.value, dim.value), dtype=np.float32)
        _check(_native.lib().ps_future_scan_copy(f._handle, _ptr(keys), _ptr(values)))
        return keys, values


class DenseTable(_Table):
    """A float32 vector of `size` elements, split in blocks across servers.

    A table with dense { sync: ALLREDUCE } in the job config (`allreduce`
    True) is kept by every training worker instead (ps.allreduce): pull
    reads this worker's replica, push adds to the step's gradient, and
    Session.end_step() all-reduces it over the workers and applies the
    optimizer; the same user code trains either kind. Once this worker has
    finished (or left the ring at the end of its shard), pulls read the
    servers, where every worker writes its replica when it leaves.
    """

    def __init__(self, session: "Session", info: Dict[str, Any]) -> None:
        super().__init__(session, info)
        self.size: int = int(info["size"])
        #: dense.sync ALLREDUCE: updated by the workers' ring all-reduce.
        self.allreduce: bool = bool(info.get("allreduce", False))
        #: The id of the all-reduced table whose optimizer state this table
        #: holds on the servers ("<table>.allreduce_state", which the config
        #: loader adds; not a model parameter), or None.
        self.allreduce_state_of: Optional[int] = info.get("allreduce_state_of")

    def _range(self, begin: int, count: int) -> None:
        if begin < 0 or count < 0 or begin + count > self.size:
            raise InvalidArgument(
                f"dense table {self.name!r} has {self.size} elements: [{begin}, "
                f"{begin + count}) is out of range")

    def _ring(self) -> "Optional[AllReducedDense]":
        """The session's replica when this table is all-reduced by it."""
        return self._session._ring if self.allreduce else None

    def pull(self, begin: int = 0, count: Optional[int] = None,
             out: Optional[np.ndarray] = None) -> Future[np.ndarray]:
        """Future of elements [begin, begin + count) (float32, 1-D). An
        all-reduced table's (while this worker trains) is this worker's
        replica, done at once."""
        if count is None:
            count = self.size - begin if out is None else out.size
        self._range(begin, count)
        if out is None:
            out = np.empty(count, dtype=np.float32)
        elif (not isinstance(out, np.ndarray) or out.dtype != np.float32
              or not out.flags.c_contiguous or out.size != count):
            raise InvalidArgument(f"out must be a C-contiguous float32 array of {count}")
        ring = self._ring()
        if ring is not None and ring.active:
            ring.read(self, begin, out)
            return Future._completed(self._session, out)
        return self._pull_servers(begin, count, out)

    def _pull_servers(self, begin: int, count: int,
                      out: Optional[np.ndarray]) -> Future[np.ndarray]:
        """pull() from the servers, whatever the table's sync."""
        if out is None:
            out = np.empty(count, dtype=np.float32)
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_pull_dense(s._handle(), self.id, begin, count, _ptr(out),
                                           ctypes.byref(h)))
        o = out
        return s._future(h, (o,), lambda f: o)

    def _values(self, values: Any, begin: int, what: str) -> np.ndarray:
        v = as_values(values, what).reshape(-1)
        self._range(begin, v.size)
        bad = _first_nonfinite(v)
        if bad is not None and (what != "gradients" or not self._session._clips_nonfinite):
            raise InvalidArgument(
                f"non-finite {what[:-1]} at element {bad} (table element {begin + bad}) "
                f"of dense table {self.name!r}: {v[bad]}; nothing was sent")
        return v

    def push(self, grads: Any, begin: int = 0) -> Future[None]:
        """Sends gradients of elements [begin, begin + len(grads)). An
        all-reduced table's are added to this step's gradient (done at once;
        end_step all-reduces them); under the CLIP gradient policy its
        non-finite elements count as 0 (no server clips them), on every
        worker alike."""
        g = self._values(grads, begin, "gradients")
        s = self._session
        ring = self._ring()
        if ring is not None:
            if not np.isfinite(g).all():  # CLIP: _values let them through
                g = np.where(np.isfinite(g), g, np.float32(0)).astype(np.float32)
            ring.add(self, g, begin)
            return Future._completed(s, None)
        h = _out_ptr()
        _check(_native.lib().ps_push_dense(s._handle(), self.id, begin, _ptr(g), g.size,
                                           ctypes.byref(h)))
        return s._future(h, ())

    def assign(self, values: Any, begin: int = 0) -> Future[None]:
        """Overwrites elements [begin, begin + len(values)) (optimizer state
        kept) on the servers, and in this worker's replica of an all-reduced
        table if it exists (the others' replicas are not changed: assign
        before the replicas are made, as ps.torch.Trainer's rank 0 does)."""
        v = self._values(values, begin, "values")
        ring = self._ring()
        if ring is not None:
            ring.assign(self, v, begin)
        return self._assign_servers(v, begin)

    def _assign_servers(self, v: np.ndarray, begin: int) -> Future[None]:
        """assign() of checked float32 values on the servers only."""
        s = self._session
        h = _out_ptr()
        _check(_native.lib().ps_assign_dense(s._handle(), self.id, begin, _ptr(v), v.size,
                                             ctypes.byref(h)))
        return s._future(h, ())


class Session:
    """One worker of a job.

    Args:
      config: path of the job config file (textproto); every process of the
        job loads the same file.
      scheduler: "host:port"; default $PS_SCHEDULER.
      num_servers, num_workers: override the config's cluster sizes (0
        keeps them); default $PS_NUM_SERVERS / $PS_NUM_WORKERS, as the
        launchers set them.
      trains_shards: a training worker (its data shard is resumed by another
        worker if it dies or leaves early). False for tools.
      observer: join as an observer: no worker rank and no clock, so it never
        holds BSP/SSP back and never ends the job; it only reads (pull, scan,
        stats), answered at once with what the servers hold (under BSP, the
        steps applied so far). For inspection, sidecar evaluation and export
        while training runs. Writes and the lifecycle calls raise
        FailedPrecondition.
      stop_check: seconds; the longest a scheduler wait (barrier, claim,
        finish, startup) blocks before noticing a stop request.
      startup_timeout: seconds to wait for the servers; None: the config's.
      handle_sigterm: install a SIGTERM handler (main thread only) that asks
        the session to stop after the current step, as psctl drain does.
      log_level: the native library's log level (trace..error, off); None
        leaves it (info).

    Raises the PsError of a failed join (InvalidArgument for a bad config,
    Unavailable when the scheduler is unreachable, Timeout when the servers
    do not come, Cancelled on Ctrl-C or SIGTERM while joining).
    """

    def __init__(self, config: Union[str, os.PathLike], scheduler: Optional[str] = None, *,
                 num_servers: Optional[int] = None, num_workers: Optional[int] = None,
                 trains_shards: bool = True, observer: bool = False,
                 stop_check: float = 0.25,
                 startup_timeout: Optional[float] = None, handle_sigterm: bool = False,
                 log_level: Optional[str] = "warn") -> None:
        self._closed = True
        self._ptr: Optional[int] = None
        self._ring = None
        # Held by calls that may come from other threads (job_progress) while
        # they use the native session, and by close() before it frees it.
        self._native_lock = threading.Lock()
        # The progress displays of running batches() loops (close() stops
        # their polls before the native session goes).
        self._monitors: List[Monitor] = []
        # The shard size last told to the scheduler (0: unknown).
        self._shard_batches_sent = 0
        self._orphans: List[Tuple[int, Tuple]] = []
        self._pid = os.getpid()
        # The futures of ended steps not yet seen to succeed, oldest first.
        self._pending_ends: List[Future] = []
        self._tables: Dict[str, _Table] = {}
        self._sigterm_installed = None
        lib = _native.lib()
        if log_level is not None:
            _check(lib.ps_set_log_level(log_level.encode()))
        scheduler = scheduler or os.environ.get("PS_SCHEDULER", "")
        if num_servers is None:
            num_servers = int(os.environ.get("PS_NUM_SERVERS", "0") or 0)
        if num_workers is None:
            num_workers = int(os.environ.get("PS_NUM_WORKERS", "0") or 0)
        self.config_path = os.fspath(config)
        job_config = JobConfig(self.config_path, num_servers, num_workers)
        h = _out_ptr()
        flags = (_native.OBSERVER if observer
                 else _native.TRAINS_SHARDS if trains_shards else 0)
        _check(lib.ps_session_start(job_config.handle, scheduler.encode(), flags,
                                    stop_check, startup_timeout or 0.0, ctypes.byref(h)))
        start = Future(self, h.value, lifecycle=True)
        start._session = None  # no session to stop yet: the future's stop flag does
        try:
            while not start._poll(_SLICE):
                pass
        except KeyboardInterrupt:
            # Freeing a running start stops it (it leaves if it registered).
            start._free()
            raise
        code, message, reason = start._status
        if code != 0:
            start._free()
            raise from_code(code, message, reason)
        self._ptr = lib.ps_future_take_session(start._handle)
        start._free()
        self._closed = False
        info = _native.SessionDetails()
        _check(lib.ps_session_info(self._ptr, ctypes.byref(info)))
        job = describe_handle(lib.ps_session_config(self._ptr))
        self.rank: int = int(info.rank)
        self.observer: bool = bool(info.observer)
        self.node_id: int = int(info.node_id)
        self.num_workers: int = int(job["num_workers"])
        self.num_servers: int = int(job["num_servers"])
        self.mode: str = job["mode"]
        self.staleness: int = int(job["staleness"])
        self.prefetch: bool = bool(job["prefetch"])
        #: The config's training block: batch_size, epochs, shard_by_batch,
        #: max_steps, export_path (a Python loop may use them or not).
        self.training: Dict[str, Any] = dict(job["training"])
        self.job_name: str = job["name"]
        self.start_clock: int = int(info.start_clock)
        #: This worker starts a job restored from a checkpoint (at its clock).
        self.restored_start: bool = bool(info.restored_start)
        self.position: Optional[DataPosition] = (
            _position(info.position) if info.has_position else None)
        # data_plane.gradients.nonfinite CLIP: non-finite gradients go to the
        # servers, which clip them (worker/kv_client.h), instead of being refused.
        self._clips_nonfinite: bool = bool(job["clips_nonfinite"])
        self._table_info = {t["name"]: t for t in job["tables"]}
        # The replica of the dense tables with sync ALLREDUCE (ps.allreduce),
        # made on first use. Observers and tools (no shards to train) never
        # join the workers' ring: they read and write such tables on the
        # servers.
        self._ring: Optional[AllReducedDense] = None
        ring_tables = [n for n, t in self._table_info.items() if t.get("allreduce")]
        if ring_tables and trains_shards and not self.observer:
            self._ring = AllReducedDense(self, [self.table(n) for n in ring_tables])
        self._step_position: Optional[DataPosition] = None
        self._stop_position: Optional[DataPosition] = None
        if handle_sigterm and threading.current_thread() is threading.main_thread():
            self._install_sigterm()

    # ---- plumbing

    def _handle(self) -> int:
        ptr = self._usable_ptr()
        self._sweep()
        return ptr

    def _usable_ptr(self) -> int:
        """The native session, checked usable here (no bookkeeping: any thread)."""
        if os.getpid() != self._pid:
            raise ForkError(
                f"this session was started in process {self._pid} and cannot be used in "
                f"a forked child ({os.getpid()}): its network threads do not exist here. "
                "Start a new session in the child, or use forked workers (DataLoader "
                "num_workers) for data loading only")
        if self._closed or not self._ptr:
            raise FailedPrecondition("the session is closed")
        return self._ptr

    def _sweep(self) -> None:
        if not self._orphans:
            return
        lib = _native.lib()
        keep = []
        for h, bufs in self._orphans:
            if lib.ps_future_done(h):
                lib.ps_future_free(h)
            else:
                keep.append((h, bufs))
        self._orphans = keep

    def _future(self, h: ctypes.c_void_p, keep: Tuple,
                convert: Optional[Callable[[Future], Any]] = None,
                lifecycle: bool = False) -> Future:
        return Future(self, h.value, keep, convert, lifecycle)

    def _slow_workers(self) -> str:
        """The workers a BSP/SSP wait is waiting for ("" if none or unknown)."""
        if self._closed or not self._ptr or os.getpid() != self._pid:
            return ""
        return _native.take_string(_native.lib().ps_session_slow_workers(self._ptr)) or ""

    def _request_stop_native(self) -> None:
        if self._ptr and not self._closed and os.getpid() == self._pid:
            _native.lib().ps_session_request_stop(self._ptr)

    def _install_sigterm(self) -> None:
        ref = weakref.ref(self)
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum, frame):  # noqa: ARG001
            s = ref()
            if s is not None:
                s.request_stop()

        signal.signal(signal.SIGTERM, on_sigterm)
        self._sigterm_installed = previous

    # ---- what the session knows

    @property
    def clock(self) -> int:
        """Steps this worker completed (FINISHED_CLOCK once finished)."""
        return int(_native.lib().ps_session_clock(self._handle()))

    @property
    def last_checkpoint_clock(self) -> int:
        """The clock of the job's newest committed checkpoint (0: none)."""
        return int(_native.lib().ps_session_last_checkpoint(self._handle()))

    @property
    def resumed(self) -> bool:
        """True when the job was under way when this worker joined (a
        replacement, or a job restored from a checkpoint)."""
        return self.start_clock > 0

    @property
    def stop_requested(self) -> bool:
        """SIGTERM (with handle_sigterm), request_stop() or psctl drain:
        finish the step, then close()."""
        if self._closed:
            return True
        return bool(_native.lib().ps_session_stop_requested(self._handle()))

    def request_stop(self) -> None:
        """Asks the session to stop: waits end with Cancelled, and
        stop_requested turns true. Safe from a signal handler."""
        self._request_stop_native()

    @property
    def dense_allreduce(self) -> Optional[AllReducedDense]:
        """This worker's replica of the job's dense tables with sync
        ALLREDUCE (ps.allreduce.AllReducedDense: step, ring_size, values()),
        or None when the job has none (or for an observer or a session
        with trains_shards=False, which use the servers' copy). Its tables'
        DenseTable pull and push use it; end_step() runs its all-reduce."""
        return self._ring

    def _leave_ring(self) -> None:
        """Writes the all-reduced tables' replica to the servers and leaves
        the ring (no training work for now: the others go on without this
        worker). Called when a shard ends and by claim() and finish()."""
        if self._ring is not None:
            self._ring.leave()

    @property
    def table_names(self) -> List[str]:
        return list(self._table_info)

    def table(self, name: str) -> Union[SparseTable, DenseTable]:
        """The table called `name`; InvalidArgument naming the job's tables if none."""
        t = self._tables.get(name)
        if t is not None:
            return t
        info = self._table_info.get(name)
        if info is None:
            raise InvalidArgument(
                f"no table {name!r} in this job (its tables: {', '.join(self._table_info)})")
        t = SparseTable(self, info) if info["sparse"] else DenseTable(self, info)
        self._tables[name] = t
        return t

    # ---- the job's progress and curves (the scheduler's /status)

    def job_progress(self) -> JobProgress:
        """Where the whole job stands, as the scheduler computes it from every
        shard's position: a JobProgress with `progress` in [0, 1] (steps
        trained over steps to train; it does not go back while the scheduler
        runs), `eta_s` (seconds left, None while unknown), `steps_done`,
        `steps_total` (an estimate until `total_known`), `steps_per_second`,
        `examples_per_second`, `examples` and `elapsed_s` (seconds since the
        job started). One status call to the scheduler, which waits up to
        5 s while it is away (then Unavailable or Timeout). Observers too;
        safe from any thread. A scheduler that predates progress answers
        zeros."""
        out = _native.JobProgress()
        self._usable_ptr()  # ForkError in a forked child, before the lock (held at fork?)
        with self._native_lock:
            code = _native.lib().ps_session_job_progress(self._usable_ptr(),
                                                         ctypes.byref(out))
            _check(code)  # this thread's last error, read before anything else runs here
        return JobProgress._from_native(out)

    def report_metric(self, name: str, value: float) -> None:
        """Reports a new value of metric `name` (e.g. "val_auc") at this
        worker's current step (its clock; after finish(), the last step it
        trained). The scheduler shows it as the curve `metric/<name>` on its
        /status page and in /status.json (series "metric/<name>"). Sent with
        the next heartbeats (and with close()); a newer value of a name
        replaces one not sent yet.

        `name`: 1 to 64 characters of [A-Za-z0-9_./-]; `value`: a finite
        number. InvalidArgument otherwise; ResourceExhausted for a 33rd
        distinct name of this worker; FailedPrecondition from an observer
        (it sends the scheduler no heartbeats)."""
        if not isinstance(name, str):
            raise InvalidArgument(f"a metric's name must be a str; got {type(name).__name__}")
        if "\0" in name:
            raise InvalidArgument(f"metric name {name!r} must be 1 to 64 characters of "
                                  "[A-Za-z0-9_./-]")
        try:
            v = float(value)
        except (TypeError, ValueError) as e:
            raise InvalidArgument(f"metric {name}: value {value!r} is not a number") from e
        _check(_native.lib().ps_session_report_metric(
            self._handle(), name.encode("utf-8", "replace"), v))

    def _report_trained(self, examples: Optional[int], loss: Optional[float]) -> None:
        """end_step's examples= and loss=, for the loss and examples/s curves."""
        n = 0
        if examples is not None:
            try:
                n = operator.index(examples)
            except TypeError as e:
                raise InvalidArgument(
                    f"examples must be an int; got {type(examples).__name__}") from e
            if n < 0:
                raise InvalidArgument(f"examples must not be negative; got {n}")
        loss_sum, loss_examples = 0.0, 0
        if loss is not None:
            try:
                mean = float(loss)  # a torch scalar too
            except (TypeError, ValueError) as e:
                raise InvalidArgument(f"loss must be a number; got {loss!r}") from e
            # The mean over the batch's examples; without their number it
            # weighs as one example. A non-finite loss is left out.
            loss_examples = n if examples is not None else 1
            loss_sum = mean * loss_examples if math.isfinite(mean) else math.nan
        _check(_native.lib().ps_session_report_trained(self._handle(), n, loss_sum,
                                                       loss_examples))

    def _report_shard_batches(self, batches: Optional[int]) -> None:
        """Tells the scheduler the batches per epoch of the shard being
        trained (None: unknown), when it changed."""
        n = batches or 0
        if n == self._shard_batches_sent:
            return
        _check(_native.lib().ps_session_set_shard_batches(self._handle(), n))
        self._shard_batches_sent = n

    def stats(self) -> List[Dict[str, Any]]:
        """Every table's statistics on every live server: a list of dicts with
        "server" and the fields of proto TableStats (rows, bytes, ...)."""
        h = _out_ptr()
        _check(_native.lib().ps_stats(self._handle(), ctypes.byref(h)))
        f = self._future(h, ())
        f.result()
        n = ctypes.c_size_t()
        _check(_native.lib().ps_future_stats(f._handle, None, 0, ctypes.byref(n)))
        entries = (_native.TableStats * n.value)()
        _check(_native.lib().ps_future_stats(f._handle, entries, n.value, ctypes.byref(n)))
        names = {int(t["id"]): name for name, t in self._table_info.items()}
        out = []
        for e in entries:
            d = {name: (bool(getattr(e, name)) if name == "sparse" else int(getattr(e, name)))
                 for name, _ in _native.TableStats._fields_}
            d["name"] = names.get(d["table_id"], "")
            out.append(d)
        return out

    # ---- steps and the job's lifecycle

    def end_step(self, position: Optional[DataPosition] = None, *,
                 examples: Optional[int] = None,
                 loss: Optional[float] = None) -> Future[None]:
        """Ends a step: exactly once per step, in every mode (under BSP/SSP
        the others' pulls wait for it). `position` is the next untrained
        batch; inside `batches()` it defaults to the loop's. Once the servers
        acknowledge the step it is reported to the scheduler, so a
        replacement resumes from there. Returns a Future; the
        failure of an earlier step that has completed meanwhile, if any, is
        raised here (the others at finish() or the end of `batches()`).

        `examples` (the batch's number of examples) and `loss` (the mean
        training loss over them; a float or a scalar tensor) feed the job's
        curves on the scheduler's /status: loss per worker and examples per
        second (also JobProgress.examples_per_second). Without `examples`
        the loss weighs as one example; a non-finite loss is left out of
        the curve. InvalidArgument for a negative or non-integer `examples`
        or a `loss` that is not a number; FailedPrecondition from an
        observer. Neither given: nothing is reported.

        With dense tables of sync ALLREDUCE (dense_allreduce), it then runs
        the step's all-reduce of their pushes, blocking until every worker
        in the ring has ended the step, and raises its failure (Timeout when
        no ring formed within allreduce.form_timeout_ms). The clock moves on
        first, so that under BSP and SSP a worker waiting for a ring never
        holds back the pulls of the others."""
        self._check_ends()
        if examples is not None or loss is not None:
            self._report_trained(examples, loss)
        if position is None:
            position = self._step_position
            self._step_position = None
        ended = (self._ring.end_step(_native.position(position)) if self._ring is not None
                 else None)
        if ended is not None:
            code, handle = ended
            failure = last_failure(code) if code != 0 else None
            if handle:
                f = self._future(ctypes.c_void_p(handle), ())
                self._pending_ends.append(f)
            if failure is not None:
                raise failure
            return f
        h = _out_ptr()
        _check(_native.lib().ps_session_end_step(self._handle(), _native.position(position),
                                                 ctypes.byref(h)))
        f = self._future(h, ())
        self._pending_ends.append(f)
        return f

    def _check_ends(self, wait: bool = False, timeout: Optional[float] = None) -> None:
        """Raises the first failure, in step order, among the ended steps
        that completed (wait=True: among all, waiting at most `timeout`
        seconds for each); the steps looked at are forgotten."""
        pending: List[Future] = []
        failure: Optional[PsError] = None
        for f in self._pending_ends:
            if not wait and not f.done():
                pending.append(f)
                continue
            try:
                f.result(timeout)
            except PsError as e:
                failure = failure or e
        self._pending_ends = pending
        if failure is not None:
            raise failure

    def _wait_lifecycle(self, h: ctypes.c_void_p) -> Future:
        f = self._future(h, (), lifecycle=True)
        f.result()
        return f

    def barrier(self, name: str, timeout: Optional[float] = None) -> List[int]:
        """Waits until every live worker reaches barrier `name`; returns the
        ranks that arrived. Timeout (naming the missing ranks) after
        `timeout` seconds; Cancelled on a stop."""
        h = _out_ptr()
        _check(_native.lib().ps_session_barrier(self._handle(), name.encode(),
                                                _timeout(timeout), ctypes.byref(h)))
        return _ranks(self._wait_lifecycle(h))

    def claim(self, finished: Optional[DataPosition] = None) -> Dict[str, Any]:
        """Reports `finished` (a shard this worker completed) and asks for
        work: {"result": "WAIT"|"ASSIGNED"|"ALL_DONE", "position":
        DataPosition, "start_clock": int}. The clock is set to finished
        first, so this worker never holds BSP/SSP back while idle. On
        ASSIGNED call restart(start_clock) before training the shard. Leaves
        the all-reduce ring first (the next end_step joins it again)."""
        self._leave_ring()
        h = _out_ptr()
        _check(_native.lib().ps_session_claim(self._handle(), _native.position(finished),
                                              ctypes.byref(h)))
        f = self._wait_lifecycle(h)
        r = _native.Claim()
        _check(_native.lib().ps_future_claim(f._handle, ctypes.byref(r)))
        return {"result": _CLAIM_RESULTS[r.result], "position": _position(r.position),
                "start_clock": int(r.start_clock)}

    def restart(self, clock: int) -> None:
        """Resumes training at `clock` after claim() answered ASSIGNED."""
        _check(_native.lib().ps_session_restart(self._handle(), clock))

    def finish(self, timeout: Optional[float] = None) -> bool:
        """Ends this worker's training (BSP/SSP never wait on it again) and
        meets the others at barrier "train_done". True on the one worker that
        evaluates and exports for the job (then call evaluation_done() or
        close()); the others return False once it is done. With all-reduced
        dense tables this worker first writes its replica to the servers and
        leaves the ring, so the evaluator reads the trained values there (the
        last worker to finish wrote the most advanced replica)."""
        self._check_ends(wait=True)
        self._leave_ring()
        h = _out_ptr()
        _check(_native.lib().ps_session_finish(self._handle(), _timeout(timeout),
                                               ctypes.byref(h)))
        f = self._wait_lifecycle(h)
        evaluator = ctypes.c_int32()
        _check(_native.lib().ps_future_finish(f._handle, ctypes.byref(evaluator)))
        return bool(evaluator.value)

    def evaluation_done(self) -> None:
        """The evaluator tells the others it is done (close() does it too)."""
        _check(_native.lib().ps_session_evaluation_done(self._handle()))

    def checkpoint(self) -> int:
        """Asks for a consistent checkpoint of the whole job (every server's
        parameters and optimizer state, every worker's data position);
        returns the clock it is taken at, after this worker's clock (keep
        training: it is taken when the workers get there). If a worker passes
        that clock before the view reaches it, the scheduler takes it at a
        later clock: last_checkpoint_clock says which checkpoint committed.
        FailedPrecondition when the job's config has no checkpoint.dir."""
        h = _out_ptr()
        _check(_native.lib().ps_session_checkpoint(self._handle(), ctypes.byref(h)))
        f = self._wait_lifecycle(h)
        clock = ctypes.c_uint64()
        _check(_native.lib().ps_future_checkpoint(f._handle, ctypes.byref(clock)))
        return int(clock.value)

    def batches(self, batches_of: Callable[[int, int], Iterable[Any]], epochs: int = 1,
                progress: ProgressArg = False,
                batches_per_epoch: Optional[int] = None) -> Iterator[Any]:
        """The training loop's batches, with the job's shard protocol.

        `batches_of(shard, epoch)` returns the batches of data shard `shard`
        (0..num_workers-1) in epoch `epoch`, the same sequence in every
        process. This generator trains this worker's shard from its position
        (a replacement resumes where the dead worker's last acknowledged step
        ended), then takes over shards orphaned by other workers until every
        shard is done. Call end_step() once per batch (the position is
        filled in); a step left without one is ended when the next batch is
        asked for. In a fresh job (and at the start of a restored one) it
        first waits until every worker has joined (barrier "ps-start"), so
        the first steps count them all (a loop of one's own should do the
        same). On a stop request (SIGTERM, drain) it ends after the step in
        progress, with its pushes acknowledged, and close() hands the
        exact next position to the scheduler. If the scheduler dropped
        this worker it raises Dropped (SchedulerUnreachable when the
        scheduler is gone) instead of yielding another batch.

        The shard's size: when `batches_of` returns a Sized object (len()
        works: a list, ps.data.ShardBatches, a DataLoader) or
        `batches_per_epoch` is given, the batches in an epoch of the shard
        are told to the scheduler at each shard start, so the job's progress
        and ETA are exact (the scheduler counts the config's
        training.epochs; pass `epochs=self.training["epochs"]`).

        `progress`: True shows the JOB's progress as the scheduler computes
        it (job_progress(); every worker shows the same), on stderr: a tqdm
        bar (percent, with the ETA and steps/s) when tqdm is installed and
        stderr is a terminal or a notebook; else a plain line, `progress
        42.0% eta 31s 12.5 steps/s`, rewritten in place on a terminal and
        printed at most every 10 s to a log file; a last line when the loop
        ends. A callable instead receives each new JobProgress (between
        batches, on this thread) and the last one at the end. The scheduler
        is asked at most once a second, on a thread of its own, so the loop
        never waits for it; a failed poll is skipped (the last values stay)
        and never stops training. Each poll is one status call to the
        scheduler: in a job of many workers, show it on one
        (`progress=sess.rank == 0`).
        """
        if batches_per_epoch is not None:
            try:
                batches_per_epoch = operator.index(batches_per_epoch)
            except TypeError as e:
                raise InvalidArgument("batches_per_epoch must be an int; got "
                                      f"{type(batches_per_epoch).__name__}") from e
            if batches_per_epoch < 0:
                raise InvalidArgument(
                    f"batches_per_epoch must not be negative; got {batches_per_epoch}")
        loop = self._shard_loop(batches_of, epochs, batches_per_epoch)
        if not progress:
            return loop
        return self._shown(loop, progress)

    def _shown(self, loop: Iterator[Any], progress: ProgressArg) -> Iterator[Any]:
        """`loop`'s batches, with the job's progress shown between them."""
        monitor = Monitor(progress, self.job_progress)
        self._monitors.append(monitor)
        completed = False
        try:
            for batch in loop:
                monitor.tick()
                yield batch
            completed = True
        finally:
            close = getattr(loop, "close", None)
            if close is not None:
                close()
            if monitor in self._monitors:
                self._monitors.remove(monitor)
            # A loop that ended (every shard done, or a stop) shows where
            # the job stands now; one left early (break, an exception) its
            # last values.
            monitor.close(final_poll=completed)

    def _shard_loop(self, batches_of: Callable[[int, int], Iterable[Any]], epochs: int,
                    batches_per_epoch: Optional[int]) -> Iterator[Any]:
        """batches() without the progress display."""
        lib = _native.lib()
        # Where the shard being trained ended: done, or stopped before its
        # end at the next untrained batch; None before the first shard.
        ended: Optional[DataPosition] = None

        def next_shard() -> Optional[DataPosition]:
            # The job's shard protocol, run by the library (one
            # implementation with the C++ trainer: worker/shard_cursor.h):
            # the start barrier of a fresh or restored job, this worker's own
            # shard, then claims (WAIT paced, shard numbers checked, the
            # clock restarted at the scheduler's). None once there is nothing
            # more: every shard is done, or a stop (close() then hands the
            # position over).
            if ended is not None:
                # No work until the next shard: the ring's other members
                # must not wait for this worker's all-reduce.
                self._leave_ring()
            h = _out_ptr()
            _check(lib.ps_session_next_shard(self._handle(), _native.position(ended),
                                             ctypes.byref(h)))
            f = self._wait_lifecycle(h)
            r = _native.NextShard()
            _check(lib.ps_future_next_shard(f._handle, ctypes.byref(r)))
            at = _position(r.position) if r.has_position else None
            if r.result == _native.SHARD_TRAIN:
                return at
            self._stop_position = at if r.result == _native.SHARD_STOPPED else None
            return None

        while True:
            try:
                pos = next_shard()
            except Cancelled:
                return
            if pos is None:
                return
            ended = None
            for epoch in range(pos.epoch, epochs):
                first = pos.batch if epoch == pos.epoch else 0
                source = batches_of(pos.shard, epoch)
                self._report_shard_batches(batches_per_epoch if batches_per_epoch is not None
                                           else _batch_count(source))
                it = iter(source)
                skip = getattr(it, "skip", None)
                if first and callable(skip):
                    skip(first)
                else:
                    for _ in range(first):
                        if next(it, _END) is _END:
                            break
                b = first
                for batch in it:
                    # Dropped by the scheduler (or it is gone): raise
                    # Dropped / SchedulerUnreachable rather than train on.
                    _check(lib.ps_session_ended(self._handle()))
                    if self.stop_requested:
                        self._settle()
                        ended = DataPosition(pos.shard, epoch, b)
                        break
                    before = self.clock
                    self._step_position = DataPosition(pos.shard, epoch, b + 1)
                    yield batch
                    if self.clock == before:
                        self.end_step()
                    b += 1
                if ended is not None:
                    break
            if ended is None:
                self._settle()
                ended = DataPosition(pos.shard, epochs, 0, True)

    def _settle(self) -> None:
        """Waits for every ended step; raises the first that failed."""
        self._check_ends(wait=True)

    def close(self, finished: Optional[bool] = None,
              position: Optional[DataPosition] = None) -> None:
        """Leaves the job. finished=None: True unless the loop was stopped
        with work left (then the exact position is handed over). Pending
        requests are waited for (pull buffers stay valid), then the data
        plane is closed. Closing twice does nothing."""
        if self._closed:
            return
        if os.getpid() != self._pid:
            raise ForkError("close() of a session started in another process")
        for m in self._monitors:  # their polls use the native session
            m.stop()
        self._monitors = []
        lib = _native.lib()
        try:
            try:
                self._check_ends(wait=True, timeout=30)
            except PsError:
                pass
            if position is None:
                position = self._stop_position
            if finished is None:
                finished = position is None and not self.stop_requested
            self._close_ring()
            code = lib.ps_session_leave(self._ptr, 1 if finished else 0,
                                        _native.position(position))
            failure = last_failure(code) if code != 0 else None
        finally:
            with self._native_lock:  # waits for a job_progress() in flight elsewhere
                self._closed = True
                ptr, self._ptr = self._ptr, None
            lib.ps_session_free(ptr)  # pending requests end; buffers can go now
            for h, _ in self._orphans:
                lib.ps_future_free(h)
            self._orphans = []
            if self._sigterm_installed is not None:
                try:
                    signal.signal(signal.SIGTERM, self._sigterm_installed)
                except ValueError:
                    pass
        if failure is not None:
            raise failure

    def _close_ring(self) -> None:
        """Frees the replica, leaving the ring; writes it to the servers
        first unless it left already or the session can do nothing more."""
        ring, self._ring = self._ring, None
        if ring is None:
            return
        try:
            ring.close(write=_native.lib().ps_session_ended(self._ptr) == 0)
        except PsError:
            ring.close(write=False)

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is not None:
            try:
                self.close(finished=False)
            except PsError:
                pass
        else:
            self.close()

    def __del__(self) -> None:
        try:
            if not self._closed and os.getpid() == self._pid:
                self.close(finished=False)
        except Exception:  # noqa: BLE001
            pass

    def __repr__(self) -> str:
        state = ("closed" if self._closed else "observer" if self.observer
                 else f"rank {self.rank} of {self.num_workers}")
        return f"<ps.Session {state}>"


_END = object()


def _batch_count(source: Any) -> Optional[int]:
    """len(source) when it has one (a Sized batches_of result), else None."""
    try:
        n = len(source)
    except (TypeError, NotImplementedError):  # no len(), or an IterableDataset's loader
        return None
    return n if isinstance(n, int) and n >= 0 else None

_CLAIM_RESULTS = {_native.CLAIM_WAIT: "WAIT", _native.CLAIM_ASSIGNED: "ASSIGNED",
                  _native.CLAIM_ALL_DONE: "ALL_DONE"}


def _timeout(seconds: Optional[float]) -> float:
    """A timeout in seconds for the library; None: none."""
    return _native.NO_TIMEOUT if seconds is None else max(0.0, float(seconds))


def _ranks(f: Future) -> List[int]:
    """The ranks a barrier or finish future answers."""
    lib = _native.lib()
    n = ctypes.c_size_t()
    _check(lib.ps_future_ranks(f._handle, None, 0, ctypes.byref(n)))
    ranks = (ctypes.c_uint32 * n.value)()
    _check(lib.ps_future_ranks(f._handle, ranks, n.value, ctypes.byref(n)))
    return [int(r) for r in ranks]


def init(config: Union[str, os.PathLike], scheduler: Optional[str] = None,
         **kwargs: Any) -> Session:
    """Joins the job as a worker: Session(config, scheduler, **kwargs), with
    handle_sigterm=True by default (SIGTERM ends the loop after the step)."""
    kwargs.setdefault("handle_sigterm", True)
    return Session(config, scheduler, **kwargs)


def observe(config: Union[str, os.PathLike], scheduler: Optional[str] = None,
            **kwargs: Any) -> Session:
    """Joins the job as an observer (Session(..., observer=True)): reads
    tables while the job trains, never holding it back."""
    return Session(config, scheduler, observer=True, **kwargs)


def hash_key(field: int, value: Any) -> Any:
    """The key the C++ readers give categorical field `field` with `value`
    (worker/data/keys.h CriteoKey): an int for a scalar value, a uint64
    array for an array of values."""
    scalar = np.isscalar(value)
    v = np.ascontiguousarray(np.asarray(value).reshape(-1).astype(np.uint64))
    out = np.empty_like(v)
    lib = _native.lib()
    lib.ps_hash_keys(int(field), v.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)), v.size,
                     out.ctypes.data_as(ctypes.POINTER(ctypes.c_uint64)))
    return int(out[0]) if scalar else out
