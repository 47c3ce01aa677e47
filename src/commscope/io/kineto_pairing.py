"""The pairing of a Kineto trace's ``record_param_comms`` events with the NCCL kernels that ran them, in the order of
trust :mod:`commscope.io.kineto`'s docstring gives (``External id``, then ``correlation`` through the kernel's
launch, then time order), and the nesting of one such event inside another on the same thread (a barrier's
all_reduce), whose inner event launches the kernel.

:func:`commscope.io.kineto.import_kineto` reads the events into :class:`_Rpc` and :class:`_Kernel` and pairs them
with these; a paired op's ``t_end_ns`` is its last kernel's end.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from commscope.commop import OpName

# The two kinds of event paired: a record_param_comms (the op as the framework issued it) and a GPU kernel.


@dataclass(slots=True)
class _Rpc:
    index: int
    ts_us: float
    dur_us: float | None
    thread: tuple[Any, Any]
    coll: str
    op: OpName
    args: dict[str, Any]
    ext_id: int | None
    kernels: list[_Kernel] = field(default_factory=list)
    pairing: str | None = None
    inside: _Rpc | None = None
    """The record_param_comms this one lies within, on the same thread (a barrier's all_reduce)."""
    container: bool = False
    """True when another record_param_comms lies within this one: the inner one launches the kernel."""


@dataclass(slots=True)
class _Kernel:
    index: int
    ts_us: float
    dur_us: float
    name: str
    func: str | None
    coll: str | None
    ext_id: int | None
    correlation: int | None
    stream: Any
    used: bool = False


#: NCCL kernel function (from the kernel name) -> the CommOp ops it can carry out.
_KERNEL_FUNCS: dict[str, frozenset[str]] = {
    "AllReduce": frozenset({"all_reduce", "barrier"}),
    "Broadcast": frozenset({"broadcast"}),
    "Reduce": frozenset({"reduce"}),
    "AllGather": frozenset({"all_gather"}),
    "ReduceScatter": frozenset({"reduce_scatter"}),
    "SendRecv": frozenset({"send", "recv", "all_to_all", "gather", "scatter"}),
    "Send": frozenset({"send", "all_to_all", "gather", "scatter"}),
    "Recv": frozenset({"recv", "all_to_all", "gather", "scatter"}),
    "AllToAll": frozenset({"all_to_all"}),
}


def _mark_nesting(rpcs: list[_Rpc]) -> None:
    """Set ``inside`` of an event that lies within another on the same thread (a barrier's all_reduce)."""
    by_thread: dict[tuple[Any, Any], list[_Rpc]] = defaultdict(list)
    for r in rpcs:
        by_thread[r.thread].append(r)
    for items in by_thread.values():
        items.sort(key=lambda r: (r.ts_us, -(r.dur_us or 0.0)))
        stack: list[_Rpc] = []
        for r in items:
            while stack and (stack[-1].dur_us is None or stack[-1].ts_us + stack[-1].dur_us < r.ts_us):
                stack.pop()
            if stack:
                r.inside = stack[-1]
                stack[-1].container = True
            if r.dur_us is not None:
                stack.append(r)


def _kernel_fits(k: _Kernel, r: _Rpc) -> bool:
    if k.coll is not None:
        return k.coll == r.op or (r.op == "barrier" and k.coll == "all_reduce")
    return k.func not in _KERNEL_FUNCS or r.op in _KERNEL_FUNCS[k.func]


def _pair(rpcs: list[_Rpc], kernels: list[_Kernel],
          launches: dict[int, tuple[tuple[Any, Any], float]]) -> dict[str, int]:
    counts = {"external_id": 0, "correlation": 0, "order": 0, "none": 0}
    by_ext: dict[int, list[_Rpc]] = defaultdict(list)
    for r in rpcs:
        if r.ext_id is not None:
            by_ext[r.ext_id].append(r)
    # 1. External id
    for k in kernels:
        if k.ext_id is None:
            continue
        cands = [r for r in by_ext.get(k.ext_id, ()) if _kernel_fits(k, r)]
        if len(cands) == 1:
            _attach(cands[0], k, "external_id")
    # 2. correlation -> the launch -> the innermost record_param_comms around it on its thread
    by_thread: dict[tuple[Any, Any], list[_Rpc]] = defaultdict(list)
    for r in rpcs:
        if r.dur_us is not None:
            by_thread[r.thread].append(r)
    starts: dict[tuple[Any, Any], list[float]] = {}
    for t, items in by_thread.items():
        items.sort(key=lambda r: r.ts_us)
        starts[t] = [r.ts_us for r in items]
    for k in kernels:
        if k.used or k.correlation is None or k.correlation not in launches:
            continue
        thread, ts = launches[k.correlation]
        items = by_thread.get(thread, [])
        if not items:
            continue
        j = bisect.bisect_right(starts[thread], ts)
        for r in reversed(items[:j]):
            if r.ts_us <= ts <= r.ts_us + (r.dur_us or 0.0) and _kernel_fits(k, r) and r.pairing in (None,
                                                                                                   "correlation"):
                _attach(r, k, "correlation")
                break
    # 3. order, for what is left
    free_rpcs = sorted((r for r in rpcs if not r.kernels and not r.container), key=lambda r: (r.ts_us, r.index))
    free_kernels = sorted((k for k in kernels if not k.used), key=lambda k: (k.ts_us, k.index))
    for r in free_rpcs:
        for k in free_kernels:
            if not k.used and k.ts_us >= r.ts_us and _kernel_fits(k, r):
                _attach(r, k, "order")
                break
    for r in rpcs:
        if r.pairing is not None:
            counts[r.pairing] += 1
        else:
            counts["none"] += 1
    return counts


def _attach(r: _Rpc, k: _Kernel, how: str) -> None:
    r.kernels.append(k)
    k.used = True
    if r.pairing is None:
        r.pairing = how
