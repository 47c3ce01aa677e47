"""PyTorch Flight Recorder dumps as CommOps: what every rank was doing when a job hung.

torch.distributed keeps a ring buffer of the last collectives of each rank (``TORCH_NCCL_TRACE_BUFFER_SIZE`` or
``TORCH_FR_BUFFER_SIZE`` entries) and writes it, one file per rank, on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``,
file ``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``) or on demand (``torch._C._distributed_c10d._dump_nccl_trace()``,
``_dump_fr_trace()``). The file is a pickle of plain data (PyTorch's C++ pickler writes dicts, lists, strings,
numbers, tuples), or the same structure as JSON (``_dump_nccl_trace_json``)::

    {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
     "pg_status": {...}, "entries": [{"profiling_name": "nccl:all_reduce", "process_group": ("0", "default_pg"),
       "input_sizes": [[3, 4]], "input_dtypes": ["Float"], "output_sizes": [[3, 4]], "state": "completed",
       "time_created_ns": ..., "time_discovered_completed_ns": ..., "collective_seq_id": 1, ...}, ...]}

The pickle is read with a restricted unpickler that builds plain data only: a dump that names any class or
function (which an ordinary ``pickle.load`` would import and call) is refused with the name it asked for.

Each entry becomes one CommOp: ``op`` from ``profiling_name`` (``nccl:all_reduce``, ``gloo:all_gather``,
``nccl:send 0->1``) through the same table as Kineto's collective names; ``size_bytes`` from the shapes and
element types (nccl-tests' convention: the output of all_gather, the input of everything else, summed over the
tensors of a coalesced call); ``group`` from ``pg_config`` (the process group's global ranks); ``peer`` of
send/recv from the group-local ranks in the name; ``t_start_ns`` = ``time_created_ns`` (when the op was enqueued)
and ``t_end_ns`` = ``time_discovered_completed_ns`` where the op completed. ``extra`` keeps ``state``
(``scheduled``, ``started``, ``completed``), the sequence numbers, ``pg_name`` / ``pg_desc``, ``retired``,
``timeout_ms`` and ``duration_ms``. Ops that had not completed when the dump was written are counted in
``meta["not_completed"]`` and named in ``problems``: those are where a hang is. ``rank`` comes from the file
name's trailing digits (PyTorch writes ``<prefix><rank>``), since the dump itself does not say it.

What a dump cannot give: ``axis``, ``phase``, ``micro_batch``, ``layer``, ``splits`` of all_to_all, and the
group where ``pg_config`` lacks the process group (gloo's dumps in PyTorch 2.13 leave it empty).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from pathlib import Path
from typing import Any

from commscope.io.checks import size_problem
from commscope.io.import_base import (
    ImportResult,
    Problems,
    freeze_extra,
    missing_fields,
    read_input,
)
from commscope.commop import CommOp

__all__ = ["import_flight_recorder", "is_flight_recorder", "load_dump"]

_P2P_RE = re.compile(r"^(send|recv)\s+(\d+)\s*(?:->|<-)\s*(\d+)$")
_RANK_RE = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$")
#: Ops whose nccl-tests size is the output buffer.
_SIZE_FROM_OUT = frozenset({"all_gather", "gather"})


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers, booleans and None; refuses every class and function."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the pickle asks for {module}.{name}; a Flight Recorder dump holds plain data "
                                     f"only, so it is not loaded (commscope never imports what a dump names)")

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("the pickle refers to persistent objects (tensor storage?), which a Flight "
                                     "Recorder dump does not hold")


def is_flight_recorder(obj: Any) -> bool:
    """Whether an unpickled or JSON-decoded object has the shape of a Flight Recorder dump."""
    return isinstance(obj, dict) and isinstance(obj.get("entries"), list) and (
        "pg_config" in obj or "version" in obj)


def load_dump(name: str, data: bytes) -> dict[str, Any]:
    """The dump in ``data`` (pickle or JSON) as plain data. Raises ValueError naming ``name`` when it is neither."""
    if data[:1] == b"\x80":  # pickle protocol 2 and later
        try:
            obj = _PlainUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 - damaged pickles raise anything from struct.error to OverflowError
            raise ValueError(f"{name}: not a readable Flight Recorder pickle ({exc})") from None
    else:
        try:
            obj = json.loads(data.decode("utf-8-sig", errors="replace"))  # a byte-order mark skipped
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{name}: neither a pickle nor JSON ({exc}); expected a Flight Recorder dump") from None
    if not is_flight_recorder(obj):
        raise ValueError(f"{name}: no 'entries' list with 'pg_config' / 'version' at the top level; expected a "
                         f"Flight Recorder dump")
    return obj


def _int(value: Any) -> int | None:
    """A non-negative integer, else None (ids, sizes and times in a dump are never negative)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _ranks(text: Any) -> tuple[int, ...] | None:
    if isinstance(text, list):
        vals = [_int(v) for v in text]
        return tuple(v for v in vals if v is not None) if all(v is not None and v >= 0 for v in vals) else None
    if isinstance(text, str) and re.fullmatch(r"\s*\[\s*(\d+\s*(,\s*\d+\s*)*)?\]\s*", text):
        return tuple(int(x) for x in re.findall(r"\d+", text))
    return None


def _numel(shape: Any) -> int | None:
    if not isinstance(shape, list):
        return None
    n = 1
    for d in shape:
        d = _int(d)
        if d is None or d < 0:
            return None
        n *= d
    return n


def _buffer_bytes(shapes: Any, dtypes: Any) -> tuple[int | None, str | None]:
    """Bytes of a list of tensors given as shapes and c10 type names, and the first dtype (commscope's name)."""
    from commscope.io.kineto import DTYPES

    if not isinstance(shapes, list) or not isinstance(dtypes, list) or len(shapes) != len(dtypes):
        return None, None
    total, first = 0, None
    for shape, dtype in zip(shapes, dtypes, strict=True):
        n = _numel(shape)
        dt = DTYPES.get(dtype.lower()) if isinstance(dtype, str) else None
        if n is None or dt is None:
            return None, None
        first = first or dt[0]
        total += n * dt[1]
    return total, first


def import_flight_recorder(path: str | Path, *, strict: bool = False) -> ImportResult:
    """Read one rank's Flight Recorder dump (pickle or JSON; see the module docstring)."""
    from commscope.io.kineto import OP_NAMES

    name, data = read_input(path)
    dump = load_dump(name, data)
    problems = Problems(name, strict=strict)
    m = _RANK_RE.search(Path(path).name)
    rank = int(m.group(1)) if m else None
    if rank is None:
        problems.note(None, "the file name ends in no rank number (PyTorch writes <prefix><rank>); rank left empty")
    groups: dict[str, tuple[int, ...]] = {}
    pg_config = dump.get("pg_config")
    if isinstance(pg_config, dict):
        for key, pg in pg_config.items():
            ranks = _ranks(pg.get("ranks")) if isinstance(pg, dict) else None
            if ranks:
                groups[str(key)] = ranks
    ops: list[CommOp] = []
    not_completed: list[str] = []
    no_group = 0
    for i, e in enumerate(dump["entries"]):
        where = f"entry {i}"
        if not isinstance(e, dict):
            problems.add(where, f"not a dict ({type(e).__name__}), skipped")
            continue
        pname = e.get("profiling_name")
        if not isinstance(pname, str) or ":" not in pname:
            problems.add(where, f"profiling_name={pname!r}: expected '<backend>:<collective>', skipped")
            continue
        backend, coll = pname.split(":", 1)
        coll = coll.strip()
        p2p = _P2P_RE.match(coll)
        key = (p2p.group(1) if p2p else coll.split()[0] if coll else "").lower()
        op = OP_NAMES.get(key)
        if op is None:
            problems.add(where, f"unknown collective {pname!r}, skipped")
            continue
        which = ("output_sizes", "output_dtypes") if op in _SIZE_FROM_OUT else ("input_sizes", "input_dtypes")
        size, dtype = _buffer_bytes(e.get(which[0]), e.get(which[1]))
        if op == "barrier":  # a barrier moves no data of the caller's (its tensors, if any, are a token)
            size, dtype = 0, "uint8"
        if size is None or dtype is None:
            problems.add(where, f"{pname}: {which[0]}={e.get(which[0])!r} / {which[1]}={e.get(which[1])!r} give no "
                                f"size, skipped")
            continue
        why = size_problem(size)  # the rules every reader applies
        if why is not None:
            problems.add(where, f"{pname}: {why}, skipped")
            continue
        pg = e.get("process_group")
        pg_name = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else None
        pg_desc = str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else None
        group = groups.get(pg_name or "", ())
        if not group:
            no_group += 1
        peer = None
        if p2p:
            src, dst = int(p2p.group(2)), int(p2p.group(3))
            local_peer = dst if op == "send" else src
            if group and local_peer < len(group):
                peer = group[local_peer]
                me = group[src if op == "send" else dst]
                group = (me, peer) if op == "send" else (peer, me)
        state = e.get("state")
        t_start = _int(e.get("time_created_ns"))
        t_end = _int(e.get("time_discovered_completed_ns")) if state == "completed" else None
        if t_start is not None and t_end is not None and t_end < t_start:
            t_end = None
        if state != "completed":
            not_completed.append(f"{pname} (pg {pg_name}:{pg_desc}, seq {e.get('collective_seq_id')}, {state})")
        duration = e.get("duration_ms")
        extra = {
            "state": state if isinstance(state, str) else None,
            "backend": backend,
            "profiling_name": pname,
            "pg_name": pg_name,
            "pg_desc": pg_desc,
            "collective_seq_id": _int(e.get("collective_seq_id")),
            "p2p_seq_id": _int(e.get("p2p_seq_id")),
            "op_id": _int(e.get("op_id")),
            "record_id": _int(e.get("record_id")),
            "retired": e.get("retired") if isinstance(e.get("retired"), bool) else None,
            "timeout_ms": _int(e.get("timeout_ms")),
            "duration_ms": duration if isinstance(duration, (int, float)) and math.isfinite(duration) else None,
            "entry": i,
        }
        try:
            ops.append(CommOp(op=op, axis="other", group=group, size_bytes=size, dtype=dtype, rank=rank, peer=peer,
                              t_start_ns=t_start, t_end_ns=t_end, name="flight-recorder", extra=freeze_extra(extra)))
        except ValueError as exc:
            problems.add(where, f"{pname}: {exc}, skipped")
    if not_completed:
        shown = "; ".join(not_completed[:5]) + (" ..." if len(not_completed) > 5 else "")
        problems.note(None, f"{len(not_completed)} op(s) had not completed when the dump was written (where a hang "
                            f"is, or a backend that does not track completion): {shown}")
    if no_group:
        problems.note(None, f"{no_group} op(s) on a process group that pg_config does not list; group left empty")
    if not ops:
        found = problems.finish()
        raise ValueError(f"{name}: nothing importable: {len(dump['entries'])} entries, none readable"
                         + (f" ({'; '.join(found[:3])})" if found else ""))
    meta = {"rank": rank, "version": dump.get("version"), "comm_lib_version": dump.get("comm_lib_version"),
            "pg_config": pg_config if isinstance(pg_config, dict) else None, "pg_status": dump.get("pg_status"),
            "not_completed": len(not_completed), "num_entries": len(dump["entries"])}
    world = max((max(g) + 1 for g in groups.values() if g), default=None)
    if world is not None:
        meta["world_size"] = world
    return ImportResult(ops=ops, source=str(path), format="flight_recorder",
                        missing_fields=missing_fields(ops, ("axis", "phase", "micro_batch", "layer")),
                        problems=problems.finish(), meta=meta)
