"""The mixed runtime: one process group whose ops each go to the backend a tuning table chose for them.

    import commscope.measure.tune
    commscope.measure.tune.init(tuning="tuning.json")      # = init_process_group("commscope-mixed", ...)
    model = DistributedDataParallel(model)          # DDP, FSDP2, DTensor, pipelining: unchanged

or, in a torchrun job, ``COMMSCOPE_TUNING=tuning.json`` and ``init_process_group("commscope-mixed")`` after
:func:`register`. Every group made afterwards with the default backend (``new_group``, DeviceMesh
dimensions) is mixed too and routes by the same table.

``MixedProcessGroup`` subclasses ``torch.distributed.ProcessGroup`` the way the capture backend does
(:mod:`commscope.measure.capture.pg`): c10d hands it every op of every PyTorch parallelism. Each group holds

- one native backend per device, each on its own prefix of the group's store: gloo for CPU tensors, NCCL
  for CUDA tensors where NCCL and a GPU exist;
- where the table can route any op of this group to one of commscope's point-to-point algorithms
  (:mod:`commscope.measure.tune.algorithms`), a dedicated gloo backend (the transport) and one worker thread that
  runs those algorithms on it, one op after another in the order they were issued.

**Ordering rule** (why mixing cannot deadlock):

1. Every rank issues the collectives of a group in the same program order (torch.distributed's own rule).
2. The backend of an op is a pure function of the table, the op, its size in bytes, the group's size, the
   tensor's device, dtype and reduce op (:mod:`commscope.measure.tune.select`), all equal on every rank of a
   correct program; so every rank sends the k-th op of a group to the same backend. Ops whose size may
   differ between ranks carry no size all ranks agree on and always go to the native backend:
   ``all_to_all_single`` with split sizes, list-form all_gather, all_to_all, reduce_scatter; so do ops the
   algorithms do not implement (send/recv, reduce, gather, scatter, coalesced all_reduce) and reduce ops
   they lack (AVG, PREMUL_SUM...). Ranks check at group creation that they hold the same table (digest).
3. Each backend of a group has its own connections, so each sees its own ops in program order: the native
   backend because the caller issues them in order; the transport because one FIFO worker runs them. The
   k-th algorithm op on one rank thus meets the k-th on every peer.
4. Issuing never blocks: native ops are asynchronous, algorithm ops are queued. An op waiting in one backend
   cannot stop a later op from being issued to another, so each backend's sequence progresses on its own
   and no cycle of waits forms across backends. Only ``Work.wait()`` blocks, on an op that every peer
   issues by rule 1.
5. ``barrier`` waits for the group's earlier algorithm ops and then for gloo's barrier (which waits for
   gloo's earlier ops).

One caveat: a Work's completion callback (``get_future().then(...)``) of an algorithm op runs on the worker
thread; a callback that waits for another algorithm op of the same group would wait for itself. DDP's,
FSDP2's and DTensor's callbacks do no such thing.

Results: ops routed to the native backend are bit-identical to a single-backend run; ops routed to an
algorithm are bit-identical for integer (exact) data and equal to rounding for float sums, which the
algorithms reduce in another order (every rank still gets the same bits).
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from commscope.errors import ConfigError
from commscope.measure.tune.algorithms import ALGORITHMS, Algorithm, BackendPeers, reduce_op_name
from commscope.measure.tune.files import load_table
from commscope.measure.tune.select import OpSelection, selection_for
from commscope.measure.tune.table import (
    TUNABLE_OPS,
    TuningTable,
    ensure_compatible,
    machine_here,
    uncovered_group_size,
)

__all__ = ["ALLOW_MISMATCH_ENV", "MIXED_BACKEND", "TUNING_ENV", "MixedOptions", "MixedProcessGroup", "Router", "init",
           "register"]

MIXED_BACKEND = "commscope-mixed"
#: Path of the tuning table the ``commscope-mixed`` default group loads when not given one.
TUNING_ENV = "COMMSCOPE_TUNING"
#: ``1``: apply a table measured on another machine (the ``allow_mismatch`` of :func:`init`).
ALLOW_MISMATCH_ENV = "COMMSCOPE_TUNING_ALLOW_MISMATCH"
_TRANSPORT = "gloo"  # the native backend the point-to-point algorithms run on


@dataclass(frozen=True, slots=True, kw_only=True)
class MixedOptions:
    """What a mixed group routes by: a tuning table, or (for measuring one algorithm) a forced choice.

    Pass as ``pg_options`` to ``init_process_group``/``new_group``; groups made without it inherit the
    default group's.
    """

    table: TuningTable | None = None
    force: Mapping[str, str] | None = None
    """op -> algorithm name: every such op goes to that algorithm where it can run (``commscope tune``)."""
    allow_mismatch: bool = False
    """Apply a table measured on another machine, or on other group sizes or hosts."""
    source: str = "(in memory)"
    """Where the table came from, for messages."""

    def __post_init__(self) -> None:
        if (self.table is None) == (self.force is None):
            raise ConfigError("MixedOptions", "table/force", "give exactly one of table= or force=")
        for op, name in (self.force or {}).items():
            if name not in ALGORITHMS.get(op, {}):
                known = {o: sorted(a) for o, a in ALGORITHMS.items()}
                raise ConfigError("force", f"{op}={name}", f"expected an algorithm of {known}")


class Router:
    """The backend of each op of one group (rule 2 of the module docstring): the table's choice, or the forced one."""

    def __init__(self, options: MixedOptions, group_size: int, devices: tuple[str, ...]) -> None:
        self.options = options
        self.group_size = group_size
        usable = {_TRANSPORT, *(name for algs in ALGORITHMS.values() for name in algs)}
        if "cuda" in devices:
            usable.add("nccl")
        self._selections: dict[tuple[str, str], OpSelection] = {}
        if options.table is not None:
            for op in TUNABLE_OPS:
                for device in devices:
                    self._selections[op, device] = selection_for(options.table, op, group_size, device, usable)

    def backend_for(self, op: str, size_bytes: int, device: str) -> str | None:
        """A candidate name, or None for the device's native backend."""
        if self.options.force is not None:
            return self.options.force.get(op) if device == "cpu" else None
        sel = self._selections.get((op, device))
        return None if sel is None else sel.backend_for(size_bytes)

    @property
    def uses_algorithms(self) -> bool:
        """Whether any op of this group can go to a point-to-point algorithm (then the group needs a transport)."""
        if self.options.force is not None:
            return any(ALGORITHMS[op][name].applies_to(self.group_size) for op, name in self.options.force.items())
        return any(s.backend in ALGORITHMS.get(op, {}) for (op, _), sel in self._selections.items()
                   for s in sel.segments)


class _FutureWork(dist.Work):
    """The Work of an algorithm op: done when its future is; ``wait`` raises what the op raised.

    (``_create_work_from_future`` would do, but its ``wait`` swallows the future's error.)
    """

    def __init__(self, fut: torch.futures.Future) -> None:
        super().__init__()
        self._fut = fut

    def wait(self, timeout: Any = None) -> bool:
        self._fut.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self._fut

    def is_completed(self) -> bool:
        return self._fut.done()

    def result(self) -> list[torch.Tensor]:
        return self._fut.wait()


class _Worker:
    """One thread that runs a group's algorithm ops in the order they were submitted (rule 3)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any], result: list[torch.Tensor]):
        """Queue ``fn``; the returned Work completes with ``result`` (or fails with what ``fn`` raised)."""
        fut: torch.futures.Future = torch.futures.Future()
        self._queue.put((fn, result, fut))
        return _FutureWork(fut)

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            fn, result, fut = item
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - the op's waiter gets it
                fut.set_exception(exc)
                continue
            fut.set_result(result)

    def stop(self, timeout_s: float = 5.0) -> None:
        self._queue.put(None)
        self._thread.join(timeout_s)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class MixedProcessGroup(dist.ProcessGroup):
    """Routes each op to a native backend or to a point-to-point algorithm (see the module docstring)."""

    def __init__(self, *, rank: int, size: int, natives: dict[str, Any], transport: Any, router: Router,
                 global_ranks: list[int], name: str) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch's stub lists only (store, rank, size)
        self._natives = natives
        self._transport = transport
        self._peers = BackendPeers(transport) if transport is not None else None
        self._worker = _Worker(f"commscope-mixed-{name}") if transport is not None else None
        self.router = router
        self._ranks = list(global_ranks)
        self._name = name

    def getBackendName(self) -> str:  # c10d's name
        return MIXED_BACKEND

    @property
    def group_name(self) -> GroupName:  # c10d's name for the group (the C++ one is never set on a Python group)
        return GroupName(self._name)

    def __repr__(self) -> str:
        return f"MixedProcessGroup(ranks={self._ranks}, natives={sorted(self._natives)})"

    # ----- routing -----
    def _native(self, device: torch.device) -> Any:
        try:
            return self._natives[device.type]
        except KeyError:
            raise ValueError(f"{MIXED_BACKEND}: no backend for {device.type} tensors here "
                             f"(has {', '.join(sorted(self._natives))})") from None

    def _call(self, tensor: torch.Tensor, name: str, *args, opts=None):
        """The native backend's op ``name`` for ``tensor``'s device; its options only when c10d passed some."""
        return getattr(self._native(tensor.device), name)(*args, *(() if opts is None else (opts,)))

    def _algorithm(self, op: str, tensors: list[torch.Tensor], size_bytes: int, redop: Any = None) -> Algorithm | None:
        """The algorithm for this op, or None for the native backend (rule 2)."""
        if self._worker is None:
            return None
        if redop is not None and reduce_op_name(redop) is None:
            return None
        first = tensors[0]
        if any(t.dtype != first.dtype or t.device != first.device or not t.is_contiguous() for t in tensors):
            return None  # c10d rejects these on the native backend, as without the mixed backend
        if first.dtype == torch.bool or first.is_complex():
            return None
        alg = ALGORITHMS.get(op, {}).get(self.router.backend_for(op, size_bytes, first.device.type) or "")
        return alg if alg is not None and alg.applies_to(self.size()) else None

    def _run(self, fn: Callable[[], Any], result: list[torch.Tensor]):
        assert self._worker is not None
        return self._worker.submit(fn, result)

    def _native_batch(self, tensor: torch.Tensor, issue: Callable[[Any, torch.Tensor, torch.Tensor], Any],
                      pairs: list[tuple[torch.Tensor, torch.Tensor]]):
        """Several ops on the native backend as one Work: coalesced where it can, else all issued, then
        all but the last waited for."""
        native = self._native(tensor.device)
        if getattr(native, "supports_coalescing", False):
            native._start_coalescing(tensor.device)
            for out, inp in pairs:
                issue(native, out, inp)
            return native._end_coalescing(tensor.device)
        works = [issue(native, out, inp) for out, inp in pairs]
        for work in works[:-1]:
            work.wait()
        return works[-1]

    # ----- collectives (the names c10d's Python process-group trampoline calls) -----
    def _in_place(self, op: str, native_name: str, tensors, opts, redop: Any, arg: Any):
        """all_reduce and broadcast: one tensor to its algorithm (called with ``arg``), else the native op."""
        if len(tensors) == 1:
            t = tensors[0]
            alg = self._algorithm(op, tensors, _nbytes(t), redop)
            if alg is not None:
                return self._run(lambda: alg.run(t, self._peers, arg), tensors)
        return self._call(tensors[0], native_name, tensors, opts=opts)

    def allreduce(self, tensors, opts=None):
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        return self._in_place("all_reduce", "allreduce", tensors, opts, redop, redop)

    def allreduce_coalesced(self, tensors, opts=None):
        return self._call(tensors[0], "allreduce_coalesced", tensors, opts=opts)

    def allgather(self, output_lists, input_tensors, opts=None):
        return self._call(input_tensors[0], "allgather", output_lists, input_tensors, opts=opts)

    def all_gather_single(self, output, input, opts=None):  # C++ _allgather_base
        alg = self._algorithm("all_gather", [output, input], _nbytes(output))
        if alg is not None:
            return self._run(lambda: alg.run(output, input, self._peers), [output])
        return self._call(input, "_allgather_base", output, input, opts=opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        pairs = list(zip(outputs, inputs))
        alg = self._algorithm("all_gather", [*outputs, *inputs], sum(_nbytes(o) for o in outputs))
        if alg is not None:
            return self._run(lambda: [alg.run(o, i, self._peers) for o, i in pairs], list(outputs))
        return self._native_batch(inputs[0], lambda pg, o, i: pg._allgather_base(o, i), pairs)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        return self._call(outputs[0], "reduce_scatter", outputs, input_lists, opts=opts)

    def reduce_scatter_single(self, output, input, opts=None):  # C++ _reduce_scatter_base
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        alg = self._algorithm("reduce_scatter", [output, input], _nbytes(input), redop)
        if alg is not None:
            return self._run(lambda: alg.run(output, input, self._peers, redop), [output])
        return self._call(input, "_reduce_scatter_base", output, input, opts=opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        redop = opts.reduceOp if opts is not None else dist.ReduceOp.SUM
        pairs = list(zip(outputs, inputs))
        alg = self._algorithm("reduce_scatter", [*outputs, *inputs], sum(_nbytes(i) for i in inputs), redop)
        if alg is not None:
            return self._run(lambda: [alg.run(o, i, self._peers, redop) for o, i in pairs], list(outputs))
        issue = (lambda pg, o, i: pg._reduce_scatter_base(o, i)) if opts is None else \
            (lambda pg, o, i: pg._reduce_scatter_base(o, i, opts))
        return self._native_batch(inputs[0], issue, pairs)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # alltoall_base
        out_splits, in_splits = list(output_split_sizes or []), list(input_split_sizes or [])
        if not out_splits and not in_splits:  # even: every rank's input has the same size
            alg = self._algorithm("all_to_all", [output, input], _nbytes(input))
            if alg is not None:
                return self._run(lambda: alg.run(output, input, self._peers), [output])
        return self._call(input, "alltoall_base", output, input, out_splits, in_splits, opts=opts)

    def alltoall(self, outputs, inputs, opts=None):
        return self._call(inputs[0], "alltoall", outputs, inputs, opts=opts)

    def broadcast(self, tensors, opts=None):
        root = opts.rootRank if opts is not None else 0
        return self._in_place("broadcast", "broadcast", tensors, opts, None, root)

    def reduce(self, tensors, opts=None):
        return self._call(tensors[0], "reduce", tensors, opts=opts)

    def gather(self, output_lists, inputs, opts=None):
        return self._call(inputs[0], "gather", output_lists, inputs, opts=opts)

    def scatter(self, outputs, input_lists, opts=None):
        return self._call(outputs[0], "scatter", outputs, input_lists, opts=opts)

    def barrier(self, opts=None):
        native = self._natives["cpu"]
        work = native.barrier(*(() if opts is None else (opts,)))
        if self._worker is None:
            return work
        return self._run(work.wait, [])  # after the earlier algorithm ops (rule 5)

    def send(self, tensors, dst, tag=0):
        return self._native(tensors[0].device).send(tensors, dst, tag)

    def recv(self, tensors, src, tag=0):
        return self._native(tensors[0].device).recv(tensors, src, tag)

    def recv_anysource(self, tensors, tag=0):
        return self._native(tensors[0].device).recv_anysource(tensors, tag)

    def shutdown(self) -> None:
        """Stop the worker and the backends (``destroy_process_group`` calls it)."""
        if self._worker is not None:
            self._worker.stop()
        for backend in [*self._natives.values(), self._transport]:
            if backend is not None and hasattr(backend, "shutdown"):
                backend.shutdown()


# ----- creation -----

def _default_options() -> MixedOptions:
    """Options of a group made without any: the default group's, else the table named by ``COMMSCOPE_TUNING``."""
    world = dist.group.WORLD if dist.is_initialized() else None
    if isinstance(world, MixedProcessGroup):
        return world.router.options
    path = os.environ.get(TUNING_ENV)
    if not path:
        raise ConfigError(TUNING_ENV, None, f"the {MIXED_BACKEND} backend needs a tuning table: "
                                            "commscope.measure.tune.init(tuning='tuning.json'), or set "
                                            f"{TUNING_ENV}=tuning.json (write one with `commscope tune`)")
    allow = os.environ.get(ALLOW_MISMATCH_ENV, "") == "1"
    return MixedOptions(table=load_table(path, allow_mismatch=allow), allow_mismatch=allow, source=path)


def _agree(store: Any, rank: int, size: int, options: MixedOptions, is_world: bool) -> None:
    """Every rank of the group holds the same table (rule 2); the world spans as many hosts as the table's."""
    table = options.table
    mine = {"digest": table.digest if table is not None else json.dumps(dict(options.force or {}), sort_keys=True),
            "host": socket.gethostname()}
    store.set(f"commscope-mixed/{rank}", json.dumps(mine))
    everyone = [json.loads(store.get(f"commscope-mixed/{r}")) for r in range(size)]
    differ = [r for r, e in enumerate(everyone) if e["digest"] != mine["digest"]]
    if differ:
        raise ConfigError("tuning table", options.source, f"ranks {differ} of this group route by another table than "
                                                          f"rank {rank}: every rank needs the same file")
    if table is None or options.allow_mismatch:
        return
    why = uncovered_group_size(table, size)
    if why:
        raise ConfigError("tuning table", options.source, f"does not cover this job: {why}; re-run `commscope tune` "
                                                          "with these group sizes (--groups), or pass "
                                                          "allow_mismatch=True (--force) to use the nearest")
    hosts = len({e["host"] for e in everyone})
    if is_world and hosts != table.num_hosts:
        raise ConfigError("tuning table", options.source, f"was measured on {table.num_hosts} host(s); this job runs "
                                                          f"on {hosts}: the network differs. Re-run `commscope tune` "
                                                          "in this job's shape, or pass allow_mismatch=True (--force)")


def _create(opts: Any, pg_options: Any = None) -> MixedProcessGroup:
    """Creator registered with c10d (extended API: it gets the group's global ranks)."""
    options = pg_options if isinstance(pg_options, MixedOptions) else _default_options()
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=1800)
    ranks = list(opts.global_ranks_in_group) or list(range(size))
    _agree(store, rank, size, options, is_world=not opts.global_ranks_in_group)
    natives: dict[str, Any] = {"cpu": dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)}
    if torch.cuda.is_available() and dist.is_nccl_available():
        from torch.distributed import ProcessGroupNCCL

        nccl_opts = ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        natives["cuda"] = ProcessGroupNCCL(dist.PrefixStore("nccl/", store), rank, size, nccl_opts)
    router = Router(options, size, tuple(natives))
    transport = None
    if router.uses_algorithms:
        transport = dist.ProcessGroupGloo(dist.PrefixStore("p2p/", store), rank, size, timeout)
    return MixedProcessGroup(rank=rank, size=size, natives=natives, transport=transport, router=router,
                             global_ranks=ranks, name=str(opts.group_id))


def register() -> None:
    """Make ``commscope-mixed`` a torch.distributed backend (idempotent)."""
    if MIXED_BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(MIXED_BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])


def init(tuning: str | Path | TuningTable, *, allow_mismatch: bool = False, **init_kwargs: Any) -> None:
    """``init_process_group`` with the mixed backend routing by ``tuning`` (a table file or a loaded table).

    The table is refused (ConfigError) when it was measured on another machine, does not cover this job's
    group sizes, or another number of hosts, unless ``allow_mismatch``. ``init_kwargs`` go to
    ``init_process_group`` (``rank``, ``world_size``, ``store``, ``init_method``, ``timeout``...).
    """
    register()
    if isinstance(tuning, TuningTable):
        table, source = tuning, "(in memory)"
        ensure_compatible(table, machine_here(), allow_mismatch=allow_mismatch)
    else:
        table, source = load_table(tuning, allow_mismatch=allow_mismatch), str(tuning)
    options = MixedOptions(table=table, allow_mismatch=allow_mismatch, source=source)
    dist.init_process_group(MIXED_BACKEND, pg_options=options, **init_kwargs)
