"""Trainer: runs a PyTorch model's steps against the parameter servers.

    model = Net()                       # ps.torch.EmbeddingBag("emb", embedding_dim=8) inside
    trainer = ps.torch.Trainer(sess, model)        # binds tables, dense init, barrier
    for batch in sess.batches(batches_of):
        loss = loss_fn(model(batch), batch.labels)  # mean loss over the batch
        trainer.step(loss)                          # backward, pushes, end_step
    if sess.finish():                               # True on the evaluator
        evaluate(model)                             # the servers' final dense values

The servers own the optimizer: the trainer pushes gradients (of the mean
loss over this worker's batch) and reads the updated values back; there is
no torch.optim optimizer. Under BSP the servers average a step's gradients
over the live workers, so k workers at batch b train like one at batch k*b.

A dense table with `sync: ALLREDUCE` in the job config is trained the same
way with no DistributedDataParallel wrapper: its DenseTable pulls from this
worker's replica and end_step averages the step's gradients over the
workers by a ring all-reduce and applies the table's optimizer there (the
servers' rules), so k workers at batch b again train like one at batch k*b,
whatever the consistency mode of the sparse tables (ps.allreduce).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn

from ..errors import PsError
from ..session import FINISHED_CLOCK, DenseTable, Future, Session
from .embedding import table_modules

_log = logging.getLogger("ps.torch")

#: The key prefix of exported tables: TABLE_PREFIX + name + ".keys" / ".rows".
TABLE_PREFIX = "_ps_tables."


class _DenseGroup:
    """Parameters stored, flattened in registration order, in one dense table."""

    def __init__(self, table: DenseTable, prefix: str,
                 params: List[Tuple[str, nn.Parameter]]) -> None:
        self.table = table
        self.prefix = prefix
        self.params = params
        self.offsets: List[int] = []
        n = 0
        for _, p in params:
            self.offsets.append(n)
            n += p.numel()
        self.size = n

    def flat_values(self) -> np.ndarray:
        """float32 (size,): the parameters' current values."""
        if not self.params:
            return np.zeros(0, np.float32)
        return torch.cat([p.detach().reshape(-1).float().cpu()
                          for _, p in self.params]).numpy()

    def pull(self) -> "Future[np.ndarray]":
        """Future of the table's values: float32 (size,)."""
        return self.table.pull()

    def flat_grads(self) -> torch.Tensor:
        """float32 (size,): the parameters' gradients (zeros where None)."""
        return torch.cat([
            (p.grad.detach().reshape(-1).float().cpu() if p.grad is not None
             else torch.zeros(p.numel(), dtype=torch.float32))
            for _, p in self.params])

    def load(self, flat: np.ndarray) -> None:
        """Copies float32 (size,) values into the parameters."""
        t = torch.from_numpy(flat)
        with torch.no_grad():
            for (_, p), off in zip(self.params, self.offsets):
                p.copy_(t[off:off + p.numel()].view_as(p))


class Trainer:
    """Steps of `model` on the servers of `sess`'s job.

    Args:
      sess: the worker's ps.Session.
      model: an nn.Module. Its ps.torch.EmbeddingBag/Embedding modules are
        bound to `sess`'s tables (by name); every other parameter is dense.
      dense_table: where the dense parameters live: a table name or
        DenseTable (all parameters, flattened in registration order, must
        fill it exactly); or a dict {parameter name prefix: table}, each
        parameter going to its longest matching prefix ("" matches all);
        or None: the job's only dense table (none needed for a model
        without dense parameters).
      optimizer: refused. The servers run the update rule configured per
        table in the job config; a local optimizer would be overwritten
        by the next pull.
      prefetch: start the next batch's row pulls (Trainer.step's
        `prefetch` callback) before this step's pushes. Default: the
        job's training.prefetch. Allowed only in ASYNC mode: the rows then
        miss this step's updates (one step of staleness). Otherwise the
        callback runs right after end_step, and under BSP/SSP its pulls
        wait for the step as every pull does.
      barrier_timeout: seconds for barrier "dense_init" (None: no limit).

    The dense parameters are written by rank 0 with the model's own initial
    values when sess.start_clock == 0 (the job starts), then every worker
    meets at barrier "dense_init"; a worker that joins late (start_clock >
    0: a replacement, or a restored job) only pulls. A table with sync
    ALLREDUCE starts every worker's replica from those values (its first
    pull), and a replacement's replica takes the ring's state when it joins. Each step's dense
    values are pulled after end_step and copied into the parameters just
    before the model's next forward (a forward pre-hook; call sync() to do
    it by hand). The first forward after sess.finish() reads the servers'
    final values instead (every worker's last pushes are in by then), so
    evaluation scores what export() writes; pull_dense() does the same at
    any time, e.g. after close() removed the hook. (All-reduced tables:
    every worker writes its replica to the servers when it finishes, so
    these are the trained values there too.)

    Counters: steps (steps ended through the trainer), nonfinite_steps
    (steps whose loss or gradients were not finite: nothing was pushed).
    """

    def __init__(self, sess: Session, model: nn.Module,
                 dense_table: Union[None, str, DenseTable,
                                    Mapping[str, Union[str, DenseTable]]] = None,
                 *, optimizer: Any = None, prefetch: Optional[bool] = None,
                 barrier_timeout: Optional[float] = None) -> None:
        if optimizer is not None or isinstance(model, torch.optim.Optimizer):
            raise TypeError(
                "ps.torch.Trainer takes no torch.optim optimizer: the servers own the "
                "update. Each table's rule (sgd, adagrad, momentum, adam, ftrl) and its "
                "learning rate are set in the job config (tables { optimizer { ... } }); "
                "the trainer pushes gradients and pulls the updated values, which would "
                "overwrite any local update")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module; got {type(model).__name__}")
        self.sess = sess
        self.model = model
        self.steps = 0
        self.nonfinite_steps = 0
        self._push_futures: List[Future[None]] = []
        # end_step futures not yet seen answered, oldest first: a step's
        # failure is raised by a later step(), wait() or close().
        self._end_steps: List[Future[None]] = []
        self._dense_pulls: List[Tuple[_DenseGroup, Future[np.ndarray]]] = []
        # The dense values were read after this worker finished (final).
        self._pulled_final = False

        self._modules = [m for _, m in table_modules(model)]
        for m in self._modules:
            if not m.bound:
                m.bind(sess.table(m.table_name))
            elif m.table._session is not sess:
                raise ValueError(f"module of table {m.table_name!r} is bound to another "
                                 "session")
        self._sparse_tables = {}
        for m in self._modules:
            self._sparse_tables.setdefault(m.table_name, m.table)

        self._groups = self._dense_groups(dense_table)

        want = sess.prefetch if prefetch is None else bool(prefetch)
        if want and sess.mode != "ASYNC":
            raise ValueError(f"prefetch before the pushes is allowed only in ASYNC mode; "
                             f"this job is {sess.mode} (a step must read the previous "
                             "step's updates)")
        self.prefetch_early = want

        if sess.start_clock == 0:
            if sess.rank == 0:
                futures = [g.table.assign(g.flat_values()) for g in self._groups]
                for f in futures:
                    f.result()
            sess.barrier("dense_init", timeout=barrier_timeout)
        self._pull_dense()
        self._hook = model.register_forward_pre_hook(lambda module, args: self.sync())

    def _dense_groups(self, spec: Any) -> List[_DenseGroup]:
        params = list(self.model.named_parameters())
        sess = self.sess

        def resolve(t: Union[str, DenseTable]) -> DenseTable:
            table = sess.table(t) if isinstance(t, str) else t
            if not isinstance(table, DenseTable):
                raise TypeError(f"table {table.name!r} is not a dense table")
            return table

        if spec is None:
            if not params:
                return []
            # (Not the companion tables of all-reduced tables' optimizer
            # state: they hold no parameters.)
            dense = [n for n in sess.table_names if isinstance(sess.table(n), DenseTable)
                     and sess.table(n).allreduce_state_of is None]
            if len(dense) != 1:
                raise ValueError(
                    f"the model has {sum(p.numel() for _, p in params)} dense parameters; "
                    "pass dense_table= (this job's dense tables: "
                    f"{', '.join(dense) or 'none'})")
            spec = {"": dense[0]}
        elif not isinstance(spec, Mapping):
            spec = {"": spec}
        prefixes = {prefix: resolve(t) for prefix, t in spec.items()}
        members: Dict[str, List[Tuple[str, nn.Parameter]]] = {p: [] for p in prefixes}
        for name, p in params:
            match = [pre for pre in prefixes if name.startswith(pre)]
            if not match:
                raise ValueError(f"parameter {name!r} matches no dense_table prefix "
                                 f"({', '.join(repr(p) for p in prefixes)})")
            members[max(match, key=len)].append((name, p))
        groups = []
        seen: Dict[str, str] = {}
        for prefix, table in prefixes.items():
            if table.name in seen:
                raise ValueError(f"dense table {table.name!r} is given for prefixes "
                                 f"{seen[table.name]!r} and {prefix!r}")
            seen[table.name] = prefix
            g = _DenseGroup(table, prefix, members[prefix])
            if g.size != table.size:
                where = f" under prefix {prefix!r}" if prefix else ""
                raise ValueError(f"dense table {table.name!r} has size {table.size}; this "
                                 f"model has {g.size} parameters{where}")
            groups.append(g)
        return groups

    # ---- dense values

    def _pull_dense(self) -> None:
        self._dense_pulls = [(g, g.pull()) for g in self._groups]

    def pull_dense(self) -> None:
        """Reads the servers' current dense values into the parameters now.

        Waits for this worker's pushes and ended steps first (raising their
        failure), so the values include every update of this worker. Call
        it before scoring when the forward pre-hook is gone (after close());
        after sess.finish() they are the job's final values, the ones
        export() writes.
        """
        self.wait()
        pulls = [(g, g.pull()) for g in self._groups]
        self._dense_pulls = []  # older than these
        for g, f in pulls:
            g.load(f.result())
        self._pulled_final = self._session_finished()

    def _session_finished(self) -> bool:
        try:
            return self.sess.clock == FINISHED_CLOCK
        except PsError:  # closed: nothing more to read
            return False

    def sync(self) -> None:
        """Copies the pulled dense values into the parameters (waits for
        the pulls if they are in flight). The forward pre-hook calls it.
        The first call after sess.finish() reads the servers' final values
        (pull_dense()) instead of those pulled after this worker's last
        step, which miss the other workers' later pushes."""
        if not self._pulled_final and self._groups and self._session_finished():
            self.pull_dense()
            return
        pulls, self._dense_pulls = self._dense_pulls, []
        for g, f in pulls:
            g.load(f.result())

    # ---- steps

    def _check_pushes(self) -> None:
        futures, self._push_futures = self._push_futures, []
        for f in futures:
            f.result()

    def _check_end_steps(self, wait: bool) -> None:
        """Raises the failure of an ended step: of any answered one, or,
        with `wait`, of every one (waiting for them). A raised failure is
        raised once; the steps after it stay to be checked."""
        futures, self._end_steps = self._end_steps, []
        pending: List[Future[None]] = []
        for i, f in enumerate(futures):
            if not wait and not f.done():
                pending.append(f)
                continue
            try:
                f.result()
            except BaseException:
                self._end_steps = pending + futures[i + 1:]
                raise
        self._end_steps = pending

    def wait(self) -> None:
        """Waits until the servers accepted this worker's pushes and
        acknowledged its last end_step (raises their failure, if any).

        ASYNC/SSP: the pushes are applied. BSP: a step is applied once every
        live worker has ended it, before a server answers anything after the
        last of those end_steps; so with one worker, or on the worker whose
        end_step completed the step, the step is applied on return."""
        self._check_pushes()
        self._check_end_steps(wait=True)

    def step(self, loss: Optional[torch.Tensor] = None,
             prefetch: Optional[Callable[[], Any]] = None) -> bool:
        """One training step: backward, pushes, end_step.

        loss: the scalar mean loss over this worker's batch (None when
          backward was already run). prefetch: called to start the next
          batch's pulls (e.g. lambda: model.emb.prefetch(next_keys)):
          before the pushes when prefetch_early, else right after end_step.

        Returns True when the gradients were pushed; False when the loss or
        a gradient was not finite: then nothing is pushed, nonfinite_steps
        grows, and the step is still ended (end_step), so BSP peers do not
        stall (and an all-reduced table's ring averages zeros for this
        worker, as the BSP servers count a worker that pushed nothing).

        Raises, before anything of this step is done, the failure of the
        previous step's pushes (waiting for them) or of an earlier step's
        end_step once answered (an unanswered one is checked by a later
        step, wait() or close()).
        """
        self._check_pushes()
        self._check_end_steps(wait=False)
        finite = True
        if loss is not None:
            if not bool(torch.isfinite(loss.detach()).all()):
                finite = False
            else:
                loss.backward()
        sparse: Dict[str, List[Tuple[torch.Tensor, torch.Tensor]]] = {}
        for m in self._modules:
            for keys, grad in m.take_records():
                sparse.setdefault(m.table_name, []).append((keys, grad))
        # A group none of whose parameters got a gradient pushes nothing
        # (a zero push would still advance Adam's step count or momentum).
        dense = [(g, g.flat_grads()) for g in self._groups
                 if any(p.grad is not None for _, p in g.params)] if finite else []
        if finite:
            finite = (all(bool(torch.isfinite(flat).all()) for _, flat in dense) and
                      all(bool(torch.isfinite(gr).all())
                          for recs in sparse.values() for _, gr in recs))
        for _, p in self.model.named_parameters():
            p.grad = None
        if not finite:
            self.nonfinite_steps += 1
            _log.warning("step %d: non-finite loss or gradient; nothing pushed "
                         "(%d such steps)", self.sess.clock, self.nonfinite_steps)
        else:
            if prefetch is not None and self.prefetch_early:
                prefetch()
            for name, recs in sparse.items():
                keys, grads = self._sum_by_key(recs)
                self._push_futures.append(
                    self._sparse_tables[name].push(keys.numpy(), grads.numpy()))
            for g, flat in dense:
                self._push_futures.append(g.table.push(flat.numpy()))
        # The loss feeds the worker's loss curve on the scheduler's /status
        # (the bool() above has already waited for the device).
        mean = (float(loss.detach().float().mean())
                if loss is not None and finite else None)
        self._end_steps.append(self.sess.end_step(loss=mean))
        self.steps += 1
        if prefetch is not None and (not finite or not self.prefetch_early):
            prefetch()
        self._pull_dense()
        return finite

    @staticmethod
    def _sum_by_key(recs: List[Tuple[torch.Tensor, torch.Tensor]]
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """One summed gradient per distinct key: (keys int64 (n,), float32 (n, dim))."""
        if len(recs) == 1:
            keys, grad = recs[0]  # already distinct: autograd summed per row
            return keys, grad.detach().float().contiguous()
        keys = torch.cat([k for k, _ in recs])
        grads = torch.cat([g.detach().float() for _, g in recs])
        uniq, inverse = torch.unique(keys, sorted=True, return_inverse=True)
        out = torch.zeros(uniq.numel(), grads.shape[1], dtype=torch.float32)
        out.index_add_(0, inverse, grads)
        return uniq, out

    def discard(self) -> None:
        """Drops the recorded forwards and gradients without a step."""
        for m in self._modules:
            m.clear_records()
        for _, p in self.model.named_parameters():
            p.grad = None

    # ---- export

    def export(self, path: Any) -> None:
        """Writes a plain PyTorch state dict to `path` (torch.save; tensors
        only, so torch.load(path, weights_only=True) reads it): the
        model's parameters with the servers' dense values (read into the
        live model too, by pull_dense(), so it scores as the file does),
        its buffers as this process holds them, and per sparse table
        TABLE_PREFIX + name + ".keys" (int64, the uint64 keys' bits) and
        ".rows" (float32 (n, dim)) of every row the servers hold
        (table.scan(): call it between steps, e.g. after training). Keys
        never pushed have no row.
        """
        self.pull_dense()
        state: Dict[str, torch.Tensor] = {}
        for g in self._groups:
            for name, p in g.params:
                state[name] = p.detach().float().cpu().clone()
        for name, b in self.model.named_buffers():
            state[name] = b.detach().clone()
        for name, table in self._sparse_tables.items():
            keys, rows = table.scan()
            state[f"{TABLE_PREFIX}{name}.keys"] = torch.from_numpy(keys.view(np.int64))
            state[f"{TABLE_PREFIX}{name}.rows"] = torch.from_numpy(rows)
        torch.save(state, path)

    def close(self) -> None:
        """Removes the forward pre-hook and waits for the pushes and ended
        steps (raising their failure)."""
        self._hook.remove()
        self.wait()

    def __repr__(self) -> str:
        dense = ", ".join(f"{g.table.name}[{g.size}]" for g in self._groups)
        return (f"<ps.torch.Trainer sparse={list(self._sparse_tables)} dense=[{dense}] "
                f"steps={self.steps} nonfinite={self.nonfinite_steps}>")
