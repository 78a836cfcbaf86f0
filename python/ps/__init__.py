"""ps: train your own NumPy or PyTorch model on the parameter servers.

    import ps
    sess = ps.init("job.pbtxt")            # scheduler from $PS_SCHEDULER
    emb, dense = sess.table("emb"), sess.table("dense")
    rows = emb.pull(keys).result()          # float32 (n, dim)
    emb.push(keys, grads); dense.push(g)    # the servers run the optimizer
    sess.end_step()                         # once per step, in every mode
    if sess.finish(): ...                   # True on the evaluator
    sess.close()

The servers own the optimizer (SGD, momentum, Adagrad, Adam, FTRL, set per
table in the job config): push gradients of the mean loss, never updated
weights. A dense table with `sync: ALLREDUCE` is kept by every worker
instead and updated by a ring all-reduce at end_step (ps.allreduce); the
same code trains it. See docs/python.md.
"""

from .errors import (Aborted, AlreadyExists, Cancelled, DataLoss, Dropped,
                     FailedPrecondition, ForkError, Internal, InvalidArgument, JobFailed,
                     JobFinished,
                     NotFound, OutOfRange, PermissionDenied, PsError, ResourceExhausted,
                     SchedulerUnreachable, Timeout, Unauthenticated, Unavailable,
                     Unimplemented)
from .allreduce import AllReducedDense
from .progress import JobProgress
from .session import (FINISHED_CLOCK, DataPosition, DenseTable, Future, Session,
                      SparseTable, as_keys, hash_key, init, observe)

from . import data, metrics  # noqa: E402  (numpy only; ps.torch is imported on demand)

__version__ = "0.1.0"

__all__ = [
    "Aborted", "AllReducedDense", "AlreadyExists", "Cancelled", "DataLoss", "DataPosition",
    "DenseTable",
    "Dropped", "FINISHED_CLOCK", "FailedPrecondition", "ForkError", "Future", "Internal",
    "InvalidArgument", "JobFailed", "JobFinished", "JobProgress", "NotFound", "OutOfRange",
    "PermissionDenied", "PsError",
    "ResourceExhausted", "SchedulerUnreachable", "Session", "SparseTable", "Timeout",
    "Unauthenticated", "Unavailable", "Unimplemented", "as_keys", "hash_key", "init",
    "observe",
]
