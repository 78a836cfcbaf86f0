"""Dense tables by ring all-reduce (dense { sync: ALLREDUCE } in the job config).

Every training worker keeps a replica of the job's all-reduced dense
tables. A step's gradients are averaged over the workers by a ring
all-reduce (gloo over TCP, rendezvous through the scheduler) and the
tables' optimizer is applied to the replica, with the servers' update rules
and learning-rate schedule: P workers at batch b train exactly like one
worker at batch P*b, as BSP on the servers does. The job's consistency mode
then applies to its sparse tables alone (e.g. "sparse ASYNC, dense
all-reduced").

Nothing changes in user code: a Session's DenseTable of such a table pulls
from the replica and buffers its pushes, and `Session.end_step()` ends the
step on the servers, then runs the step's all-reduce (blocking until every
worker in the ring has ended the step). `ps.torch.Trainer` therefore trains
such a table without a DistributedDataParallel wrapper. The servers stay
the tables' home: each worker writes its replica there (the values to the
table, the optimizer state to its companion "<table>.allreduce_state") when
it leaves the ring (its shard ends, finish(), close()), and the ring's first
member before a checkpoint's cut, so evaluation, export, observers and
checkpoints read the trained values from the servers.

A worker has one ring, so all the job's all-reduced tables are one replica
(concatenated in config order) and must share one optimizer config.
`PS_RING_HOST` (environment) is the address the other workers reach this
worker's ring connections at; default 127.0.0.1 (a one-host job).
"""

from __future__ import annotations

import ctypes
import os
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

import numpy as np

from . import _native
from .errors import FailedPrecondition, last_failure

if TYPE_CHECKING:  # pragma: no cover
    from .session import DenseTable, Session

#: The clock of a worker that has finished training (common/protocol.h).
_FINISHED_CLOCK = 1 << 62


def _check(code: int) -> None:
    if code != 0:
        raise last_failure(code)


class AllReducedDense:
    """This worker's replica of the job's all-reduced dense tables.

    Made by the Session (Session.dense_allreduce); its DenseTables use it.
    The replica is created on the first pull or push of one of the tables
    (from the servers' values, which rank 0 may have assigned), and joins
    the ring at the first end_step. Not thread-safe: use it from the thread
    that ends the steps.

    Attributes:
      tables: the DenseTables, in the replica's order.
      offsets: table name -> its first element in the replica.
      size: elements (float32) of the replica.
      host: the address other workers connect to ($PS_RING_HOST).
    """

    def __init__(self, session: "Session", tables: List["DenseTable"]) -> None:
        self._session = session
        self.tables = tables
        self.offsets: Dict[str, int] = {}
        n = 0
        for t in tables:
            self.offsets[t.name] = n
            n += t.size
        self.size = n
        self.host = os.environ.get("PS_RING_HOST", "") or "127.0.0.1"
        self._handle: Optional[int] = None  # ps_allreduce*
        self._grads: Optional[np.ndarray] = None  # this step's pushes, summed
        self._joined = False  # joined since created or since the last leave
        self._left = False  # left the ring: the values are on the servers

    # ---- where it stands

    @property
    def created(self) -> bool:
        """Whether the replica exists (after the first pull or push)."""
        return self._handle is not None

    @property
    def active(self) -> bool:
        """Pulls read the replica (made by the first one): it has not left
        the ring and the worker has not finished (then the servers hold the
        final values)."""
        return not self._left and not self._finished()

    def info(self) -> Dict[str, int]:
        """{size, state_size, step, ring_size, generation, reforms}: sizes in
        elements; step: the steps applied to the replica; ring_size: the
        members of the ring it is in (0: none). Zeros before it exists."""
        if self._handle is None:
            return {"size": self.size, "state_size": 0, "step": 0, "ring_size": 0,
                    "generation": 0, "reforms": 0}
        out = _native.RingInfo()
        _check(_native.lib().ps_allreduce_info(self._handle, ctypes.byref(out)))
        return {name: int(getattr(out, name)) for name, _ in _native.RingInfo._fields_}

    @property
    def step(self) -> int:
        """Steps applied to the replica (the learning-rate schedule's step)."""
        return self.info()["step"]

    @property
    def ring_size(self) -> int:
        """Workers in the ring this replica is in (0: none)."""
        return self.info()["ring_size"]

    def values(self) -> np.ndarray:
        """A copy of the replica: float32 (size,), the tables concatenated."""
        self._ensure()
        out = np.empty(self.size, dtype=np.float32)
        _check(_native.lib().ps_allreduce_values(self._handle, 0, out.ctypes.data, out.size))
        return out

    def optimizer_state(self) -> np.ndarray:
        """A copy of the optimizer state: float32 (size, state_size)."""
        self._ensure()
        info = self.info()
        out = np.empty((self.size, info["state_size"]), dtype=np.float32)
        _check(_native.lib().ps_allreduce_state(self._handle, out.ctypes.data, out.size))
        return out

    # ---- what the DenseTables call

    def read(self, table: "DenseTable", begin: int, out: np.ndarray) -> None:
        """Copies elements [begin, begin + out.size) of `table` into `out`
        (float32, C-contiguous) from the replica."""
        self._ensure()
        _check(_native.lib().ps_allreduce_values(
            self._handle, self.offsets[table.name] + begin, out.ctypes.data, out.size))

    def add(self, table: "DenseTable", grads: np.ndarray, begin: int) -> None:
        """Adds `grads` (float32, 1-D) of `table`'s elements [begin, ...) to
        this step's gradient; the all-reduce runs at end_step. Two pushes of
        an element in one step add up, as under BSP on the servers."""
        if self._finished():
            raise FailedPrecondition(
                f"push to all-reduced dense table {table.name!r}: this worker has finished")
        self._ensure()
        if self._grads is None:
            self._grads = np.zeros(self.size, dtype=np.float32)
        first = self.offsets[table.name] + begin
        self._grads[first:first + grads.size] += grads

    def assign(self, table: "DenseTable", values: np.ndarray, begin: int) -> None:
        """Overwrites `table`'s elements [begin, ...) in the replica, if it is
        active (the servers are written by the caller). Only this worker's
        replica changes: assign before the replicas exist (as
        ps.torch.Trainer's rank 0 does) or on every worker."""
        if not self.created or not self.active:
            return
        lib = _native.lib()
        v = self.values()
        first = self.offsets[table.name] + begin
        v[first:first + values.size] = values
        _check(lib.ps_allreduce_reset(self._handle, v.ctypes.data, v.size, None, 0,
                                      self.step))

    def end_step(self, position: Optional["_native.Position"]) -> Optional[Tuple[int, int]]:
        """Ends the step with its all-reduce (ps_allreduce_end_step): the
        session's end_step with `position` (a ps_position* or None), then
        the average of this step's pushes (zeros where a table was not
        pushed, so every worker takes part in every step) over the ring and
        the optimizer. Joins the ring first when not in one. Blocks until
        every worker in the ring got there (at most allreduce.timeout_ms per
        collective, form_timeout_ms to form a ring).

        Returns (status code, ps_future* of the step's end or 0), the
        failure to be read at once with last_failure(); None when there is
        no replica yet (the caller ends the step itself)."""
        if self._handle is None or self._finished():
            return None
        grads = self._grads if self._grads is not None else np.zeros(self.size, np.float32)
        self._grads = None
        if not self._joined:
            self._join()
        h = ctypes.c_void_p()
        code = _native.lib().ps_allreduce_end_step(self._handle, grads.ctypes.data, grads.size,
                                                   position, ctypes.byref(h))
        return int(code), int(h.value or 0)

    def leave(self, write: bool = True) -> None:
        """Writes the replica to the servers (write=True; waits for it), then
        leaves the ring, whose other members go on without this worker. A
        later end_step joins again, starting from the servers' values and
        optimizer state (the latest any worker wrote) and taking the state
        of a more advanced member if there is one. Called at the end of a
        shard, by finish(), claim() and close(). Nothing to do before the
        replica exists."""
        if self._handle is None or self._left:
            return
        self._grads = None
        if write:
            self.write_to_servers()
        self._left = True
        self._joined = False
        _check(_native.lib().ps_allreduce_leave(self._handle))

    def write_to_servers(self) -> None:
        """Assigns the replica's values to the servers' tables, and its
        optimizer state to their companion tables "<table>.allreduce_state",
        and waits for it."""
        self._ensure()
        _check(_native.lib().ps_allreduce_write(self._handle))

    def close(self, write: bool = True) -> None:
        """Leaves the ring (writing the replica to the servers first unless
        write=False or it already left) and frees the replica."""
        h = self._handle
        if h is None:
            return
        try:
            if write and not self._left:
                self.write_to_servers()
        finally:
            self._handle = None
            _native.lib().ps_allreduce_free(h)

    # ---- internals

    def _finished(self) -> bool:
        s = self._session
        return s._closed or s.clock >= _FINISHED_CLOCK

    def _joins_running_job(self) -> bool:
        """A replacement worker (not a job's start nor a restored start)."""
        s = self._session
        return s.start_clock > 0 and not s.restored_start

    def _ensure(self) -> None:
        """Creates the replica from the servers' values at the session's
        clock (those rank 0 wrote in a fresh job; with the optimizer state
        too past clock 0: a restored job's checkpoint), as the C++ trainer.
        A worker joining a running job (a replacement) joins the ring at
        once, so its first forward already uses the ring's state (members
        that were in a ring win over a new replica: worker/dense_ring.h,
        "Joining"); workers that start together join at the first
        end_step."""
        if self._handle is not None:
            return
        s = self._session
        if s.observer:
            raise FailedPrecondition("an observer keeps no replica of all-reduced tables")
        if self._finished():
            raise FailedPrecondition("this worker has finished: no replica to make")
        lib = _native.lib()
        step = s.clock
        ids = (ctypes.c_uint32 * len(self.tables))(*[t.id for t in self.tables])
        h = ctypes.c_void_p()
        _check(lib.ps_allreduce_create(s._handle(), ids, len(self.tables), None, 0, step,
                                       self.host.encode(), ctypes.byref(h)))
        self._handle = h.value
        _check(lib.ps_allreduce_read(self._handle, 1 if step > 0 else 0))
        if self._joins_running_job():
            self._join()

    def _join(self) -> None:
        """Joins the ring. Workers that start training together (a fresh or
        restored job) ask for all of them, so the first ring holds every
        worker from the first step. A worker joining a ring that trains (a
        replacement, or one coming back after leave(), which first reloads
        the servers' values, the newest written) has its clock read finished
        while it waits, then resumes at the members' clock
        (ps_allreduce_join)."""
        lib = _native.lib()
        min_members = 0
        if self._left:
            _check(lib.ps_allreduce_read(self._handle, 1))
            self._left = False
        elif not self._joins_running_job():
            min_members = self._session.num_workers
        _check(lib.ps_allreduce_join(self._handle, min_members))
        self._joined = True


