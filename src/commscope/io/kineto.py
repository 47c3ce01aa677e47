"""PyTorch profiler (Kineto) traces of NCCL runs as CommOps.

A trace taken with ``torch.profiler`` on a job that uses ProcessGroupNCCL holds, for every collective or
point-to-point call, a CPU event ``record_param_comms`` (``cat: cpu_op``) whose ``args`` describe the call
(PyTorch >= 2.1; the field names are ``torch/csrc/profiler/util.cpp``'s ``saveNcclMeta``), and, on a GPU stream,
the NCCL kernel that ran it (``ncclKernel_AllReduce_RING_LL_Sum_float(...)``, ``ncclDevKernel_...`` from NCCL
2.19 on). This module reads both and pairs them.

Fields of ``record_param_comms`` and how they become a :class:`~commscope.commop.CommOp`
---------------------------------------------------------------------------------------

===========================  ====================================================================================
``Collective name``          the c10d call: ``allreduce``, ``_allgather_base``, ``_reduce_scatter_base``,
                             ``alltoall_base``, ``broadcast``, ``send``, ``recv``, ``barrier``, coalesced
                             variants, ...; mapped by :data:`OP_NAMES`. ``wait``, ``init`` and ``coalesced``
                             records mark work handles and communicator set-up, not data movement: skipped
                             (counted in ``meta["skipped"]``).
``In msg nelems``            elements of the input tensor(s) of this rank: the buffer of all_reduce / broadcast /
                             send / recv, the per-rank shard of all_gather, the whole input (n x output) of
                             reduce_scatter, the send buffer of all_to_all
``Out msg nelems``           elements of the output: n x input for all_gather, input / n for reduce_scatter
``dtype``                    c10 ScalarType name: ``Float``, ``BFloat16``, ``Half``, ``Long``, ``Byte``, ...
``In split size``            all_to_all: the caller's ``input_split_sizes``, in rows of dimension 0 (``[]``: even);
                             for the list form, elements per tensor. Either way bytes per unit =
                             ``In msg nelems x element size / sum(splits)``, so ``splits`` in bytes follow.
``Group size``               members of the process group
``Process Group Ranks``      the group's global ranks, a string ``"[0, 1]"`` (``"[0, 1, ..., ...]"`` when longer
                             than the profiler's limit); also ``Global rank start`` / ``stride`` for strided groups,
                             and ``distributedInfo.pg_config`` at the top of the trace
``Rank``, ``Dst Rank``,      newer PyTorch: ``Rank`` is the caller's rank in the group for a collective and the
``Src Rank``                 peer's rank in the group for send / recv; ``Dst Rank`` / ``Src Rank`` the peer's
                             global rank
``Seq``                      the process group's sequence number (newer PyTorch), kept in ``extra``
===========================  ====================================================================================

``size_bytes`` (nccl-tests' convention): ``Out msg nelems x element size`` for all_gather and gather,
``In msg nelems x element size`` for everything else; checked on the A100 fixture, where an all_reduce of
2,049,000 ``Float`` elements gives 8,196,000 bytes and ``In == Out`` for all_reduce and broadcast.

``rank`` is the trace's ``distributedInfo.rank`` (global), else derived from ``Rank`` and the group.
``t_start_ns`` is the start of ``record_param_comms`` (when the CPU issued the op); ``t_end_ns`` the end of the
last NCCL kernel paired with it (when the GPU finished it), or None when none was found. Times are Unix
nanoseconds when the trace has ``baseTimeNanoseconds`` (Kineto writes ``ts`` in microseconds relative to it),
else the trace's own clock; ``ts`` is a float with about 1 ns resolution at today's values.

Pairing CPU events with GPU kernels (:mod:`commscope.io.kineto_pairing`), in this order of trust:

1. ``External id``: Kineto gives a GPU kernel the ``External id`` of the CPU op that launched it, which for an
   NCCL kernel is the ``record_param_comms`` event itself (true for all 21 kernels of the fixture).
2. ``correlation``: the kernel's ``correlation`` equals that of the ``cudaLaunchKernel*`` runtime event (and the
   id of the ``ac2g`` flow arrows between them); the launch lies inside one ``record_param_comms`` on its thread.
3. order: what is left is paired in time order, the n-th unpaired op of a kind with the n-th unpaired kernel of
   the matching NCCL function that starts after it. Ops paired this way say so in ``extra["pairing"]`` and in
   ``problems``.

Ops are returned in order of ``t_start_ns``. What a trace cannot give: ``axis`` (attributed later from a
layout), ``phase``, ``micro_batch``, ``layer``; ``peer`` on older PyTorch (no ``Dst Rank`` / ``Rank``).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commscope.io.checks import size_problem
from commscope.io.import_base import ImportResult, Problems, freeze_extra, missing_fields, read_input
from commscope.io.kineto_pairing import _Kernel, _mark_nesting, _pair, _Rpc
from commscope.commop import CommOp, OpName

__all__ = ["DTYPES", "OP_NAMES", "import_kineto"]

#: ``Collective name`` (lower case) -> CommOp op.
OP_NAMES: dict[str, OpName] = {
    "allreduce": "all_reduce",
    "all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allreduce_sparse": "all_reduce",
    "broadcast": "broadcast",
    "_broadcast_oop": "broadcast",
    "broadcast_coalesced": "broadcast",
    "reduce": "reduce",
    "_reduce_oop": "reduce",
    "all_gather": "all_gather",
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_base": "all_gather",
    "_all_gather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather_into_tensor": "all_gather",
    "allgather_coalesced": "all_gather",
    "all_gather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_coalesced": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter",
    "all_gather_single": "all_gather",
    "all_to_all": "all_to_all",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv",
    "barrier": "barrier",
    "gather": "gather",
    "scatter": "scatter",
}
#: Records that mark work handles or communicator set-up, not data movement.
_MARKERS = frozenset({"wait", "init", "coalesced", "start_coalescing", "end_coalescing", "split", "abort",
                      "shutdown", "sync", "synchronize"})
#: c10 ScalarType names -> (commscope dtype, bytes per element).
DTYPES: dict[str, tuple[str, int]] = {
    "float": ("fp32", 4),
    "double": ("fp64", 8),
    "half": ("fp16", 2),
    "bfloat16": ("bf16", 2),
    "long": ("int64", 8),
    "int": ("int32", 4),
    "short": ("int16", 2),
    "char": ("int8", 1),
    "byte": ("uint8", 1),
    "bool": ("bool", 1),
    "uint16": ("uint16", 2),
    "uint32": ("uint32", 4),
    "uint64": ("uint64", 8),
    "complexhalf": ("complex32", 4),
    "complexfloat": ("complex64", 8),
    "complexdouble": ("complex128", 16),
    "float8_e4m3fn": ("fp8_e4m3", 1),
    "float8_e4m3fnuz": ("fp8_e4m3", 1),
    "float8_e5m2": ("fp8_e5m2", 1),
    "float8_e5m2fnuz": ("fp8_e5m2", 1),
    "float8_e8m0fnu": ("fp8_e8m0", 1),
}
#: Ops whose size is the output (gathered) buffer.
_SIZE_FROM_OUT = frozenset({"all_gather", "gather"})
_KERNEL_BACKEND_OP = {"AllReduce": "all_reduce", "Broadcast": "broadcast", "Reduce": "reduce",
                      "AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "SendRecv": "sendrecv",
                      "Send": "send", "Recv": "recv", "AllToAll": "all_to_all"}
_KERNEL_RE = re.compile(r"^(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")
_INT_RE = re.compile(r"-?\d+")
_RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "runtime", "hip_runtime"})
_MAX_TIME_US = 1e17


def _number(value: Any) -> float | None:
    """A finite time in microseconds within +-10^17 us (3,000 years), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and abs(value) < _MAX_TIME_US else None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    if isinstance(value, str) and _INT_RE.fullmatch(value.strip()):
        return int(value.strip())
    return None


def _int_list(value: Any) -> tuple[list[int] | None, bool]:
    """(integers, truncated) of ``"[0, 1, 2]"``, ``"[0, 1, ...]"`` or a JSON list; (None, False) if unreadable."""
    if isinstance(value, list):
        ints = [_int(v) for v in value]
        if any(v is None for v in ints):
            return None, False
        return [v for v in ints if v is not None], False
    if not isinstance(value, str):
        return None, False
    text = value.strip().strip('"').strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None, False
    body = text[1:-1].strip()
    if not body:
        return [], False
    out: list[int] = []
    truncated = False
    for tok in body.split(","):
        tok = tok.strip()
        if tok in ("...", "…"):
            truncated = True
            continue
        if not _INT_RE.fullmatch(tok):
            return None, False
        out.append(int(tok))
    return out, truncated


def _str(value: Any) -> str | None:
    return value.strip().strip('"') if isinstance(value, str) else None


def import_kineto(path: str | Path, *, strict: bool = False) -> ImportResult:
    """Read the communication ops of a PyTorch profiler (Kineto) trace (``.json`` or ``.json.gz``).

    One CommOp per ``record_param_comms`` event that moves data (``wait`` / ``init`` / ``coalesced`` markers
    are counted, not imported), with its NCCL kernel's completion time where one is found; see the module
    docstring for the field semantics and the pairing. Events that cannot be read are skipped and listed in
    ``problems`` as ``<file> event <index in traceEvents>: ...`` (``strict=True`` raises instead). Raises
    ValueError naming the file (and the JSON line and column) when it is not a JSON Chrome/Kineto trace.
    """
    name, data = read_input(path)
    problems = Problems(name, strict=strict)
    top, events = _trace_events(name, data)

    dist_info = info if isinstance(info := top.get("distributedInfo"), dict) else {}
    trace_rank = _int(dist_info.get("rank"))
    world_size = _int(dist_info.get("world_size"))
    base_ns = _int(top.get("baseTimeNanoseconds"))
    pg_config = dist_info.get("pg_config")
    pg_ranks = _pg_ranks(pg_config)

    found = _read_events(events, problems)
    rpcs, kernels = found.rpcs, found.kernels
    legacy = not rpcs and bool(found.annotations)
    if legacy:
        rpcs = _legacy_rpcs(found.annotations, found.parents, problems)
    _mark_nesting(rpcs)
    counts = _pair(rpcs, kernels, found.launches)

    ops: list[tuple[float, int, CommOp]] = []
    for rpc in rpcs:
        op = _to_commop(rpc, trace_rank=trace_rank, world_size=world_size, base_ns=base_ns, pg_ranks=pg_ranks,
                        problems=problems)
        if op is not None:
            ops.append((rpc.ts_us, rpc.index, op))
    ops.sort(key=lambda t: (t[0], t[1]))
    result_ops = [op for _, _, op in ops]

    _note_pairing(rpcs, kernels, counts, legacy, found.legacy_rpc, problems)
    if not result_ops:
        raise ValueError(f"{name}: nothing importable: " + _why_empty(found.num_rpc_events, found.legacy_rpc, rpcs,
                                                                      kernels, problems))

    meta = {
        "rank": trace_rank,
        "world_size": world_size,
        "backend": dist_info.get("backend"),
        "nccl_version": dist_info.get("nccl_version"),
        "pg_config": pg_config if isinstance(pg_config, list) else None,
        "base_time_ns": base_ns,
        "time_base": "unix_ns" if base_ns is not None else "trace_clock",
        "num_record_param_comms": found.num_rpc_events,
        "recovered_from": "nccl_annotations" if legacy else "record_param_comms",
        "num_nccl_kernels": len(kernels),
        "pairing": dict(counts),
        "skipped": dict(found.skipped),
    }
    always = ("axis", "phase", "micro_batch", "layer")
    return ImportResult(ops=result_ops, source=str(path), format="kineto",
                        missing_fields=missing_fields(result_ops, always), problems=problems.finish(), meta=meta)


def _trace_events(name: str, data: bytes) -> tuple[dict[str, Any], list[Any]]:
    """The top-level object of a trace (``{}`` for a bare list of events) and its ``traceEvents``; ValueError naming
    the file when it is no JSON Chrome/Kineto trace."""
    try:
        # utf-8-sig: a byte-order mark (an editor's, PowerShell's) is skipped, as format detection skips it
        top = json.loads(data.decode("utf-8-sig", errors="replace"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name} line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg}); "
                         f"expected a PyTorch profiler (Kineto) trace") from None
    except RecursionError:
        raise ValueError(f"{name}: JSON nested too deeply to be a Kineto trace") from None
    if isinstance(top, dict):
        events = top.get("traceEvents")
        if not isinstance(events, list):
            raise ValueError(f"{name}: no 'traceEvents' list at the top level; expected a PyTorch profiler "
                             f"(Kineto) trace")
    elif isinstance(top, list):
        events, top = top, {}
    else:
        raise ValueError(f"{name}: the JSON holds a {type(top).__name__}; expected a Kineto trace object")
    return top, events


def _pg_ranks(pg_config: Any) -> dict[str, list[int]]:
    """Each process group's global ranks from ``distributedInfo.pg_config``, by group name (a group whose rank list
    the profiler cut short is left out)."""
    pg_ranks: dict[str, list[int]] = {}
    if isinstance(pg_config, list):
        for pg in pg_config:
            if isinstance(pg, dict) and isinstance(pg.get("pg_name"), (str, int)):
                ranks, truncated = _int_list(pg.get("ranks"))
                if ranks is not None and not truncated:
                    pg_ranks[str(pg["pg_name"])] = ranks
    return pg_ranks


@dataclass(slots=True)
class _Events:
    """The events of a trace that :func:`import_kineto` reads, by kind (:func:`_read_events` finds them)."""

    rpcs: list[_Rpc] = field(default_factory=list)
    kernels: list[_Kernel] = field(default_factory=list)
    launches: dict[int, tuple[tuple[Any, Any], float]] = field(default_factory=dict)
    """CUDA / HIP runtime launches by correlation id: (the launching thread, the launch time)."""
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    num_rpc_events: int = 0
    legacy_rpc: int = 0
    """record_param_comms without ``Collective name`` (PyTorch < 2.1)."""
    annotations: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """``nccl:<op>`` annotations, from which a trace before PyTorch 2.1 recovers its ops."""
    parents: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    """``c10d::`` calls, the parents of those annotations."""


def _read_events(events: list[Any], problems: Problems) -> _Events:
    """One pass over ``traceEvents``: the record_param_comms read, the NCCL kernels, the runtime launches, and the
    annotations and c10d calls an old trace's ops are recovered from; an event that is no object is reported."""
    found = _Events()
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            problems.add(f"event {i}", f"not a JSON object ({type(ev).__name__}), skipped")
            continue
        ev_name = ev.get("name")
        cat = ev.get("cat")
        args = ev.get("args")
        if ev_name == "record_param_comms":
            found.num_rpc_events += 1
            if isinstance(args, dict) and "Collective name" not in args:
                found.legacy_rpc += 1  # PyTorch < 2.1: the op is recovered from its nccl:<op> annotation below
                continue
            rpc = _read_rpc(i, ev, problems, found.skipped)
            if rpc is not None:
                found.rpcs.append(rpc)
        elif isinstance(ev_name, str) and ev_name.startswith("nccl:") and isinstance(args, dict):
            found.annotations.append((i, ev))
        elif isinstance(ev_name, str) and ev_name.startswith("c10d::") and isinstance(args, dict):
            found.parents.append((i, ev))
        elif cat in ("kernel", "Kernel") and isinstance(ev_name, str):
            m = _KERNEL_RE.match(ev_name)
            if m:
                k = _read_kernel(i, ev, m.group(1), problems)
                if k is not None:
                    found.kernels.append(k)
        elif isinstance(cat, str) and cat in _RUNTIME_CATS and isinstance(args, dict):
            corr = _int(args.get("correlation"))
            ts = _number(ev.get("ts"))
            if corr is not None and ts is not None:
                found.launches[corr] = ((_hashable(ev.get("pid")), _hashable(ev.get("tid"))), ts)
    return found


def _note_pairing(rpcs: list[_Rpc], kernels: list[_Kernel], counts: dict[str, int], legacy: bool, legacy_rpc: int,
                  problems: Problems) -> None:
    """Say what the pairing left uncertain: ops without a kernel, kernels without an op, pairs made by order only,
    and what a trace before PyTorch 2.1 could not give."""
    no_kernel = [r.index for r in rpcs if not r.kernels and not r.container]
    if no_kernel:
        shown = ", ".join(map(str, no_kernel[:10])) + (", ..." if len(no_kernel) > 10 else "")
        problems.note(f"event{'s' if len(no_kernel) > 1 else ''} {shown}",
                      f"no NCCL kernel found for {len(no_kernel)} record_param_comms (the trace may end before "
                      f"it ran); t_end_ns left empty")
    unused = [k.index for k in kernels if not k.used]
    if unused:
        shown = ", ".join(map(str, unused[:10])) + (", ..." if len(unused) > 10 else "")
        problems.note(f"event{'s' if len(unused) > 1 else ''} {shown}",
                      f"{len(unused)} NCCL kernel(s) match no record_param_comms (issued outside c10d, or before "
                      f"the trace started); not imported")
    if counts["order"]:
        problems.note(None, f"{counts['order']} op(s) paired with their NCCL kernel by order only (no External id "
                            f"or correlation link); their t_end_ns is a best guess")
    if legacy:
        problems.note(None, f"a trace from PyTorch before 2.1 ({legacy_rpc} record_param_comms without "
                            f"'Collective name'): op, size and dtype recovered from {len(rpcs)} nccl:<op> annotations "
                            f"and their input shapes; not recoverable: the process group (group left empty), the "
                            f"peer of send/recv, the size of an all_gather whose c10d:: call is missing")


#: Element type names of old traces' ``Input type`` (C++ names) -> the c10 ScalarType names of :data:`DTYPES`.
_CPP_TYPES: dict[str, str] = {
    "float": "Float", "double": "Double", "c10::half": "Half", "c10::bfloat16": "BFloat16", "long": "Long",
    "long int": "Long", "int": "Int", "short": "Short", "signed char": "Char", "unsigned char": "Byte",
    "bool": "Bool", "c10::float8_e4m3fn": "Float8_e4m3fn", "c10::float8_e5m2": "Float8_e5m2",
}
#: c10d:: call of each legacy op and which of its inputs is the buffer nccl-tests sizes (output first, then input).
_PARENT_SIZE_ARG = {"all_gather": 0, "reduce_scatter": 1}
_LEGACY_P2P_RE = re.compile(r"^(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)$")


def _dims_nelems(value: Any) -> int | None:
    """Elements of the first tensor of ``Input Dims`` (``[[8192, 384], ...]`` -> 3,145,728)."""
    if not isinstance(value, list) or not value or not isinstance(value[0], list) or not value[0]:
        return None
    n = 1
    for d in value[0]:
        d = _int(d)
        if d is None or d < 0:
            return None
        n *= d
    return n


def _legacy_rpcs(annotations: list[tuple[int, dict[str, Any]]], parents: list[tuple[int, dict[str, Any]]],
                 problems: Problems) -> list[_Rpc]:
    """Ops of a trace from PyTorch before 2.1, from the ``nccl:<op>`` record_function annotations.

    Such a trace has ``record_param_comms`` without arguments of use, but ProcessGroupNCCL wraps every call in an
    annotation ``nccl:all_reduce`` / ``nccl:_all_gather_base`` / ``nccl:all_to_all`` / ``nccl:send 0->1`` whose
    ``Input Dims`` / ``Input type`` (recorded with ``record_shapes=True``) give the input buffer. The sizes of
    all_gather (the gathered output) and reduce_scatter (the input) come from the enclosing ``c10d::`` call, whose
    first two inputs are (output, input). Worked example (HTA's sampled_rank-0 trace): ``c10d::_allgather_base_``
    with Input Dims [[1073741824], [16777216]] of 'signed char' is an all_gather of 1,073,741,824 bytes.
    """
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, dict[str, Any]]]] = defaultdict(list)
    for _, ev in parents:
        ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
        if ts is not None and dur is not None:
            by_thread[(_hashable(ev.get("pid")), _hashable(ev.get("tid")))].append((ts, dur, ev["args"]))
    out: list[_Rpc] = []
    for i, ev in annotations:
        where = f"event {i}"
        raw = str(ev["name"])[len("nccl:"):].strip()
        p2p = _LEGACY_P2P_RE.match(raw)
        coll = p2p.group(1) if p2p else raw
        op = OP_NAMES.get(coll.lower())
        if op is None:
            problems.add(where, f"unknown collective annotation {ev['name']!r}, skipped")
            continue
        args = ev["args"]
        ts, dur = _number(ev.get("ts")), _number(ev.get("dur"))
        if ts is None:
            problems.add(where, f"'ts'={ev.get('ts')!r} is not a time in microseconds, skipped")
            continue
        types = args.get("Input type")
        type_name = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else None
        dtype = _CPP_TYPES.get(type_name.strip().lower()) if type_name else None
        nelems = _dims_nelems(args.get("Input Dims"))
        if nelems is None or dtype is None:
            problems.add(where, f"{ev['name']}: no input shape or element type (Input Dims "
                                f"{args.get('Input Dims')!r}, Input type {types!r}; record with "
                                f"record_shapes=True), skipped")
            continue
        synth: dict[str, Any] = {"In msg nelems": nelems, "Out msg nelems": None, "dtype": dtype, "_legacy": True,
                                 "External id": args.get("External id")}
        if op in _PARENT_SIZE_ARG:
            parent = next((a for t, d, a in by_thread.get((_hashable(ev.get("pid")), _hashable(ev.get("tid"))), ())
                           if t <= ts <= t + d), None)
            k = _PARENT_SIZE_ARG[op]
            dims = parent.get("Input Dims") if parent else None
            full = _dims_nelems(dims[k:]) if isinstance(dims, list) and len(dims) > k else None
            if full is None:
                if op == "all_gather":
                    problems.add(where, f"{ev['name']}: the gathered size is not in the trace (no enclosing "
                                        f"c10d:: call with shapes; the annotation gives only the per-rank input), "
                                        f"skipped")
                    continue
            elif op == "all_gather":
                synth["Out msg nelems"] = full
            else:
                synth["In msg nelems"] = full
        if p2p:
            src, dst = int(p2p.group(2)), int(p2p.group(3))
            synth["Dst Rank" if op == "send" else "Src Rank"] = dst if op == "send" else src
        out.append(_Rpc(index=i, ts_us=ts, dur_us=dur if dur is not None and dur >= 0 else None,
                        thread=(_hashable(ev.get("pid")), _hashable(ev.get("tid"))), coll=raw, op=op, args=synth,
                        ext_id=_int(args.get("External id"))))
    return out


def _why_empty(num_rpc: int, legacy_rpc: int, rpcs: list[_Rpc], kernels: list[_Kernel], problems: Problems) -> str:
    """The reason a trace gave no op, for the error."""
    if rpcs:
        found = problems.finish()
        return (f"{len(rpcs)} communication events, none readable"
                + (f" ({'; '.join(found[:3])})" if found else ""))
    if kernels:
        kinds = sorted({k.func or "?" for k in kernels})
        return (f"{len(kernels)} NCCL kernels ({', '.join(kinds)}) but no event that gives their sizes: "
                f"{'the record_param_comms events carry no metadata (PyTorch < 2.1) and ' if legacy_rpc else ''}"
                f"no nccl:<op> annotation with input shapes (profile with record_shapes=True)")
    if num_rpc:
        return f"{num_rpc} record_param_comms events, all markers (wait / init / coalesced) or without metadata"
    return ("no communication events (no record_param_comms, nccl:<op> annotation or NCCL kernel): the trace "
            "holds no communication (gloo records none)")


def _read_rpc(i: int, ev: dict[str, Any], problems: Problems, skipped: dict[str, int]) -> _Rpc | None:
    where = f"event {i}"
    args = ev.get("args")
    if not isinstance(args, dict):
        problems.add(where, "record_param_comms without 'args', skipped")
        return None
    coll = _str(args.get("Collective name"))
    if coll is None:
        problems.add(where, "record_param_comms without 'Collective name' (PyTorch before 2.1 records no "
                            "communication metadata), skipped")
        return None
    key = coll.lower()
    if key in _MARKERS:
        skipped[key] += 1
        return None
    op = OP_NAMES.get(key)
    if op is None:
        problems.add(where, f"unknown collective {coll!r}, skipped; known: {', '.join(sorted(OP_NAMES))}")
        return None
    ts = _number(ev.get("ts"))
    if ts is None:
        problems.add(where, f"'ts'={ev.get('ts')!r} is not a time in microseconds, skipped")
        return None
    dur = _number(ev.get("dur"))
    if dur is not None and dur < 0:
        problems.add(where, f"'dur'={dur!r} is negative; ignored")
        dur = None
    return _Rpc(index=i, ts_us=ts, dur_us=dur, thread=(_hashable(ev.get("pid")), _hashable(ev.get("tid"))),
                coll=coll, op=op, args=args, ext_id=_int(args.get("External id")))


def _hashable(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, type(None))) else repr(value)


def _read_kernel(i: int, ev: dict[str, Any], func: str, problems: Problems) -> _Kernel | None:
    ts = _number(ev.get("ts"))
    dur = _number(ev.get("dur"))
    if ts is None or dur is None or dur < 0:
        problems.add(f"event {i}", f"NCCL kernel without a valid 'ts' / 'dur' ({ev.get('ts')!r}, "
                                   f"{ev.get('dur')!r}), skipped")
        return None
    args = a if isinstance(a := ev.get("args"), dict) else {}
    coll = _str(args.get("Collective name"))
    return _Kernel(index=i, ts_us=ts, dur_us=dur, name=str(ev["name"]), func=func,
                   coll=OP_NAMES.get(coll.lower()) if coll else None, ext_id=_int(args.get("External id")),
                   correlation=_int(args.get("correlation")), stream=_hashable(args.get("stream", ev.get("tid"))))


def _to_commop(r: _Rpc, *, trace_rank: int | None, world_size: int | None, base_ns: int | None,
               pg_ranks: dict[str, list[int]], problems: Problems) -> CommOp | None:
    where = f"event {r.index}"
    a = r.args
    in_n = _int(a.get("In msg nelems"))
    out_n = _int(a.get("Out msg nelems"))
    if in_n is None or in_n < 0 or (out_n is not None and out_n < 0):
        problems.add(where, f"{r.coll}: 'In msg nelems'={a.get('In msg nelems')!r} / 'Out msg nelems'="
                            f"{a.get('Out msg nelems')!r} are not element counts, skipped")
        return None
    dtype_name = _str(a.get("dtype"))
    dt = DTYPES.get(dtype_name.lower()) if dtype_name else None
    if dt is None:
        problems.add(where, f"{r.coll}: unknown dtype {a.get('dtype')!r}, skipped; known: "
                            f"{', '.join(sorted(DTYPES))}")
        return None
    dtype, elem = dt
    nelems = out_n if r.op in _SIZE_FROM_OUT else in_n
    if nelems is None:
        problems.add(where, f"{r.coll}: no 'Out msg nelems', which gives the size of an {r.op}, skipped")
        return None
    size = nelems * elem
    why = size_problem(size)  # the rules every reader applies (a trace once held an op of 4e29 bytes)
    if why is not None:
        problems.add(where, f"{r.coll}: {why} ({nelems} x {elem} B), skipped")
        return None

    group = _group(r, world_size, pg_ranks, problems)
    local = _int(a.get("Rank"))
    rank = trace_rank
    if rank is None and local is not None and r.op not in ("send", "recv") and 0 <= local < len(group):
        rank = group[local]
    if rank is not None and group and r.op not in ("send", "recv") and rank not in group:
        problems.add(where, f"{r.coll}: the trace's rank {rank} is not in the group {list(group)}")
    peer = None
    if r.op in ("send", "recv"):
        peer = _int(a.get("Dst Rank" if r.op == "send" else "Src Rank"))
        if peer is None and local is not None and 0 <= local < len(group):
            peer = group[local]
        if peer is not None and rank is not None:
            group = (rank, peer) if r.op == "send" else (peer, rank)
        elif peer is None:
            problems.note(where, f"{r.coll}: the trace does not say the peer (no 'Dst Rank' / 'Src Rank' / "
                                 f"'Rank'); peer left empty")

    splits = None
    if r.op == "all_to_all" and group:
        splits = _splits(r, size, len(group), problems)

    t_start = _ns(r.ts_us, base_ns)
    t_end = None
    kernel_extra: dict[str, Any] = {}
    if r.kernels:
        # start and duration are each printed to the nanosecond: round them apart, then add
        t_end = max(_ns(k.ts_us, base_ns) + round(k.dur_us * 1000) for k in r.kernels)
        first = min(r.kernels, key=lambda k: k.ts_us)
        kernel_extra = {
            "kernel_name": first.name.split("(", 1)[0],
            "kernel_start_ns": _ns(first.ts_us, base_ns),
            "kernel_duration_ns": round(sum(k.dur_us for k in r.kernels) * 1000),
            "kernel_events": tuple(k.index for k in r.kernels) if len(r.kernels) > 1 else None,
            "stream": first.stream,
        }
        if t_end < t_start:
            problems.note(where, f"{r.coll}: its kernel ends before the CPU call starts; t_end_ns left empty")
            t_end = None
    backend_op = None
    if r.kernels and r.kernels[0].func in _KERNEL_BACKEND_OP:
        run = _KERNEL_BACKEND_OP[r.kernels[0].func or ""]
        backend_op = run if run != r.op else None
    seq = _int(a.get("Seq"))
    extra = {
        "collective_name": r.coll,
        "recovered_from": "nccl_annotation" if a.get("_legacy") else None,
        "event_index": r.index,
        "in_msg_nelems": in_n,
        "out_msg_nelems": out_n,
        "pg_name": _str(a.get("Process Group Name")),
        "pg_desc": _str(a.get("Process Group Description")),
        "seq": seq,
        "cpu_duration_ns": round(r.dur_us * 1000) if r.dur_us is not None else None,
        "thread": r.thread[1] if isinstance(r.thread[1], (int, str)) else None,
        "pairing": r.pairing,
        "inside": r.inside.coll if r.inside is not None else None,
        **kernel_extra,
    }
    try:
        return CommOp(op=r.op, axis="other", group=group, size_bytes=size, dtype=dtype, rank=rank, peer=peer,
                      splits=splits, t_start_ns=t_start, t_end_ns=t_end, backend_op=backend_op,
                      extra=freeze_extra(extra))
    except ValueError as exc:
        problems.add(where, f"{r.coll}: {exc}, skipped")
        return None


def _ns(ts_us: float, base_ns: int | None) -> int:
    return (base_ns or 0) + round(ts_us * 1000)


def _group(r: _Rpc, world_size: int | None, pg_ranks: dict[str, list[int]], problems: Problems) -> tuple[int, ...]:
    where = f"event {r.index}"
    a = r.args
    size = _int(a.get("Group size"))
    ranks, truncated = _int_list(a.get("Process Group Ranks"))
    if ranks is not None and not truncated and ranks:
        group = tuple(ranks)
    else:
        group = ()
        pg = _str(a.get("Process Group Name"))
        start, stride = _int(a.get("Global rank start")), _int(a.get("Global rank stride"))
        if pg is not None and pg in pg_ranks and (size is None or len(pg_ranks[pg]) == size):
            group = tuple(pg_ranks[pg])
        elif start is not None and stride is not None and stride > 0 and size is not None and size > 0:
            group = tuple(start + stride * j for j in range(size))
        elif size is not None and world_size is not None and size == world_size:
            group = tuple(range(world_size))
        elif truncated and ranks:
            problems.note(where, f"{r.coll}: 'Process Group Ranks' is cut short by the profiler and nothing else "
                                 f"gives the group; group left empty")
        elif not a.get("_legacy"):  # legacy traces say it once for all
            problems.note(where, f"{r.coll}: the trace does not say the group's ranks; group left empty")
    if size is not None and group and len(group) != size:
        problems.add(where, f"{r.coll}: 'Group size'={size} but the group has {len(group)} ranks {list(group)}")
    return group


def _splits(r: _Rpc, size: int, n: int, problems: Problems) -> tuple[int, ...] | None:
    where = f"event {r.index}"
    units, truncated = _int_list(r.args.get("In split size"))
    if units is None or truncated:
        problems.note(where, f"{r.coll}: 'In split size'={r.args.get('In split size')!r} unreadable; splits "
                             f"left empty")
        return None
    if not units:
        return (size // n,) * n if size % n == 0 else None
    total = sum(units)
    if len(units) != n or total <= 0 or size % total or any(u < 0 for u in units):
        if total == 0 and size == 0 and len(units) == n:
            return (0,) * n
        problems.note(where, f"{r.coll}: 'In split size' {units} does not divide the {size} bytes of the send "
                             f"buffer over {n} ranks; splits left empty")
        return None
    per_unit = size // total
    return tuple(u * per_unit for u in units)
