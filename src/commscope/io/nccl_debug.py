"""NCCL's own collective log (``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL``) as CommOps.

With those settings NCCL (and RCCL) prints one line per collective or point-to-point call of every rank::

    hopper01:191369:191420 [0] NCCL INFO ReduceScatter: opCount e sendbuff 0x7fdf57c00000 recvbuff 0x7fdf61a00000
        count 2097152 datatype 7 op 0 root 0 comm 0x55e290bd32d0 [nranks=2] stream 0x55e29067e430

(``host:pid:tid [cudaDev]``, then the call: the function, the communicator's ``opCount`` in hex, ``count``
elements of ``datatype`` (``ncclDataType_t``: 0 int8, 1 uint8, 2 int32, 3 uint32, 4 int64, 5 uint64, 6 fp16,
7 fp32, 8 fp64, 9 bf16, 10 fp8 e4m3, 11 fp8 e5m2), the reduction ``op``, ``root`` (the peer of Send/Recv),
the communicator and its size; RCCL adds ``task N globalrank R``). Launchers may put a prefix in front
(Ray's ``(RayTrainWorker pid=615, ip=...)``, mpirun's ``[1,0]<stdout>:``): it is skipped.

``size_bytes`` (nccl-tests' convention): ``count`` x element size for AllReduce, Broadcast, Reduce, Send and Recv;
``count`` x ``nranks`` x element size for AllGather (``count`` is what each rank sends) and ReduceScatter
(``count`` is what each rank receives); ``count`` x ``nranks`` x element size for AllToAll (``count`` per peer).

Ranks and groups. A line names the process (host:pid) and its communicator, not the global rank: the rank comes
from RCCL's ``globalrank``, else from the communicator's ``Init COMPLETE`` line (``comm 0x... rank 0 nranks 8 ...``)
when that communicator spans the world (the largest ``nranks`` in the log), else it is left empty. A collective on
a communicator of the world's size gets the group ``(0, ..., n-1)``; on a smaller communicator the log does not say
which global ranks it holds, and the group is left empty. Where a process's rank is unknown, every member's line of
the same collective would count it once more: such lines are kept for one process per communicator size only
(the first seen), and the others are counted in ``meta["duplicates_dropped"]``. The log has no times.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any, cast

from commscope.io.checks import size_problem
from commscope.io.import_base import (
    ImportResult,
    Problems,
    freeze_extra,
    missing_fields,
    read_input,
)
from commscope.commop import CommOp, OpName

__all__ = ["NCCL_DATATYPES", "import_nccl_debug", "looks_like_nccl_debug"]

#: ``ncclDataType_t`` code -> (commscope dtype, bytes per element) (nccl.h; 10 and 11 since NCCL 2.24 / RCCL).
NCCL_DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8), 5: ("uint64", 8),
    6: ("fp16", 2), 7: ("fp32", 4), 8: ("fp64", 8), 9: ("bf16", 2), 10: ("fp8_e4m3", 1), 11: ("fp8_e5m2", 1),
}
#: NCCL function -> (CommOp op, whether size is count x nranks).
_FUNCS: dict[str, tuple[str, bool]] = {
    "AllReduce": ("all_reduce", False), "Broadcast": ("broadcast", False), "Reduce": ("reduce", False),
    "AllGather": ("all_gather", True), "ReduceScatter": ("reduce_scatter", True), "AllToAll": ("all_to_all", True),
    "Send": ("send", False), "Recv": ("recv", False), "Gather": ("gather", True), "Scatter": ("scatter", True),
}
_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
_LINE_RE = re.compile(
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<dev>\d+)\](?:\s+\d+)?\s+NCCL INFO\s+"
    r"(?P<func>[A-Za-z]+):\s+opCount\s+(?P<opcount>[0-9a-fA-F]+)\s+sendbuff\s+\S+\s+recvbuff\s+\S+\s+"
    r"count\s+(?P<count>\d+)\s+datatype\s+(?P<dtype>\d+)\s+op\s+(?P<redop>\d+)\s+root\s+(?P<root>-?\d+)\s+"
    r"comm\s+(?P<comm>\S+)\s+\[nranks=(?P<nranks>\d+)\]"
    r"(?:.*?\bglobalrank\s+(?P<globalrank>\d+))?")
_HINT_RE = re.compile(r"NCCL INFO\s+[A-Za-z]+:\s+opCount\b")
_INIT_RE = re.compile(r"(?P<host>[^\s:]+):(?P<pid>\d+):\d+\s+\[\d+\].*?NCCL INFO\s+(?:ncclCommInit\w*\s+)?"
                      r"comm\s+(?P<comm>0x[0-9a-fA-F]+)\s+rank\s+(?P<rank>\d+)\s+nranks\s+(?P<nranks>\d+)"
                      r".*?Init COMPLETE")


def looks_like_nccl_debug(text: str) -> bool:
    """Whether the text holds NCCL_DEBUG=INFO collective lines."""
    return _HINT_RE.search(text) is not None


def import_nccl_debug(path: str | Path, *, strict: bool = False) -> ImportResult:
    """Read the ``NCCL INFO <Func>: opCount ...`` lines of a log (see the module docstring)."""
    name, data = read_input(path)
    problems = Problems(name, strict=strict)
    lines = data.decode("utf-8", errors="replace").splitlines()
    comm_rank: dict[tuple[str, str, str], tuple[int, int]] = {}
    for raw in lines:
        if "Init COMPLETE" in raw:
            m = _INIT_RE.search(raw)
            if m:
                comm_rank[(m["host"], m["pid"], m["comm"])] = (int(m["rank"]), int(m["nranks"]))
    records: list[tuple[int, re.Match[str]]] = []
    for ln, raw in enumerate(lines, start=1):
        if not _HINT_RE.search(raw):
            continue
        m = _LINE_RE.search(raw)
        if m is None:
            problems.add(f"line {ln}", f"an NCCL collective line that cannot be read ({raw.strip()[:120]!r}), "
                                       f"skipped")
            continue
        records.append((ln, m))
    if not records:
        raise ValueError(f"{name}: nothing importable: no 'NCCL INFO <Func>: opCount ... count ... datatype ... "
                         f"comm ... [nranks=N]' line (run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL)")
    world = max(int(m["nranks"]) for _, m in records)
    keeper: dict[int, tuple[str, str]] = {}  # nranks -> the one process whose rank-less lines are kept
    dropped = 0
    unknown_funcs: Counter[str] = Counter()
    ops: list[CommOp] = []
    processes: set[tuple[str, str]] = set()
    for ln, m in records:
        func = m["func"]
        if func not in _FUNCS:
            unknown_funcs[func] += 1
            continue
        op, times_n = _FUNCS[func]
        code = int(m["dtype"])
        if code not in NCCL_DATATYPES:
            problems.add(f"line {ln}", f"datatype={code}: unknown ncclDataType_t (known: 0-11), skipped")
            continue
        dtype, elem = NCCL_DATATYPES[code]
        nranks, count = int(m["nranks"]), int(m["count"])
        proc = (m["host"], m["pid"])
        processes.add(proc)
        rank: int | None = int(m["globalrank"]) if m["globalrank"] is not None else None
        local = comm_rank.get((m["host"], m["pid"], m["comm"]))
        if rank is None and local is not None and nranks == world:
            rank = local[0]
        if rank is None:
            first = keeper.setdefault(nranks, proc)
            if first != proc and op not in ("send", "recv"):
                dropped += 1
                continue
        group: tuple[int, ...] = tuple(range(nranks)) if nranks == world else ()
        peer = None
        root = int(m["root"])
        if op in ("send", "recv"):
            peer = root if nranks == world and 0 <= root < world else None
            group = ((rank, peer) if op == "send" else (peer, rank)) if rank is not None and peer is not None else ()
        extra: dict[str, Any] = {
            "op_count": int(m["opcount"], 16), "count_elements": count, "nranks": nranks, "comm": m["comm"],
            "host": m["host"], "pid": int(m["pid"]), "cuda_dev": int(m["dev"]), "line": ln,
            "redop": _REDOPS.get(int(m["redop"])) if op in ("all_reduce", "reduce", "reduce_scatter") else None,
            "root": root if op in ("broadcast", "reduce") else None,
            "comm_rank": local[0] if local else None,
        }
        size = count * elem * (nranks if times_n else 1)
        why = size_problem(size)  # the rules every reader applies
        if why is not None:
            problems.add(f"line {ln}", f"{m['func']}: {why} (count {count}), skipped")
            continue
        ops.append(CommOp(op=cast(OpName, op), axis="other", group=group, size_bytes=size,
                          dtype=dtype, rank=rank, peer=peer, name="nccl-debug", extra=freeze_extra(extra)))
    for func, num in sorted(unknown_funcs.items()):
        problems.add(None, f"{num} '{func}' line(s): no CommOp form for this NCCL function, skipped")
    if dropped:
        problems.note(None, f"{dropped} line(s) of other processes left out: without their global ranks, the "
                            f"same collective on every member would count once per member (kept: one process per "
                            f"communicator size)")
    small = sorted({int(m["nranks"]) for _, m in records} - {world})
    if small:
        problems.note(None, f"communicators of {', '.join(map(str, small))} rank(s) (smaller than the world of "
                            f"{world}): the log does not say their global ranks; group left empty")
    if not ops:
        found = problems.finish()
        raise ValueError(f"{name}: nothing importable: {len(records)} collective lines, none with a CommOp form"
                         + (f" ({'; '.join(found[:3])})" if found else ""))
    meta = {"world_size": world, "num_lines": len(records), "processes": len(processes),
            "duplicates_dropped": dropped, "communicators_with_rank": len(comm_rank)}
    always = ("axis", "phase", "micro_batch", "layer", "t_start_ns", "t_end_ns", "splits")
    return ImportResult(ops=ops, source=str(path), format="nccl_debug", missing_fields=missing_fields(ops, always),
                        problems=problems.finish(), meta=meta)
