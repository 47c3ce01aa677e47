"""What a record read from an op log must be before it counts: the checks :class:`~commscope.commop.CommOp` leaves
to readers, because a file can hold what code would never build (a null group, a size of ``1e400`` or over 1 TiB,
an unknown dtype, a step that is no integer), and the consistency of a record's rank, group, peer, root and splits
with each other and with its file's header. Each message names the field, the value and what would be valid.

:mod:`commscope.io.oplog` and :mod:`commscope.io.oplog_csv` skip a record these find wrong, saying why;
:func:`is_int` serves every reader of logged integers.
"""

from __future__ import annotations

from typing import Any, TypeGuard

from commscope.commop import MAX_MESSAGE_BYTES, ROOTED_OPS, CommOp
from commscope.io.import_base import KNOWN_DTYPES

#: dtype names a record may carry (lower case): commscope's, torch's (``float8_e4m3fn``), the importers', and
#: ``none``, which the recorder writes for an op that moves no data (a barrier).
_KNOWN_DTYPES = frozenset(d.lower() for d in KNOWN_DTYPES) | {
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "complex32", "qint8", "quint8", "qint32",
    "none"}


def is_int(value: Any) -> TypeGuard[int]:
    """An integer that is not a bool (JSON true/false read as 1/0 is no rank, size or count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _raw_problem(obj: dict[str, Any]) -> str | None:
    """What is wrong with the fields of a record's JSON object that CommOp computes with before :func:`check_op` can
    look at them, or None: a size or count that is no integer (``"4000"``: CommOp would fail comparing it with 0),
    a group or splits that is no list of integers (``int()`` would silently turn ``["1"]`` or ``[0.5]`` into
    ranks). The message names the field, the value and what would be valid, as :func:`check_op`'s do."""
    size = obj.get("size_bytes", 0)
    if not (is_int(size) and size >= 0):
        return f"size_bytes={size!r}: expected a whole number of bytes >= 0"
    count = obj.get("count", 1)
    if not (is_int(count) and count >= 1):
        return f"count={count!r}: expected an integer >= 1"
    group = obj.get("group", [])
    if not (isinstance(group, list) and all(is_int(r) and r >= 0 for r in group)):
        return f"group={group!r}: expected a list of ranks (integers >= 0)"
    splits = obj.get("splits")
    if splits is not None and not (isinstance(splits, list) and all(is_int(b) and b >= 0 for b in splits)):
        return f"splits={splits!r}: expected bytes per peer (integers >= 0)"
    return None


def check_op(op: CommOp) -> str | None:
    """What is wrong with a record read from a file, or None: the checks CommOp leaves to readers, because a file
    can hold what code would never build (a null group, a size of ``1e400`` read as infinity, a size over
    :data:`~commscope.commop.MAX_MESSAGE_BYTES`, NaN times, an unknown dtype, a step that is no integer). The
    message names the field, the value and what would be valid."""
    if not isinstance(op.group, tuple) or not all(is_int(r) and r >= 0 for r in op.group):
        return f"group={op.group!r}: expected a list of ranks (integers >= 0)"
    if not is_int(op.size_bytes):
        return f"size_bytes={op.size_bytes!r}: expected a whole number of bytes >= 0"
    if op.size_bytes > MAX_MESSAGE_BYTES:
        return (f"size_bytes={op.size_bytes} is larger than any real message (> 1 TiB, {MAX_MESSAGE_BYTES} B): "
                f"a damaged record")
    if not is_int(op.count):
        return f"count={op.count!r}: expected an integer >= 1"
    for name in ("rank", "peer", "micro_batch", "layer", "t_start_ns", "t_end_ns"):
        value = getattr(op, name)
        if value is not None and not (is_int(value) and value >= 0):
            return f"{name}={value!r}: expected an integer >= 0 or nothing"
    if op.t_start_ns is not None and op.t_end_ns is not None and op.t_end_ns < op.t_start_ns:
        return f"t_end_ns={op.t_end_ns} is before t_start_ns={op.t_start_ns}"
    if op.splits is not None and not all(is_int(b) and b >= 0 for b in op.splits):
        return f"splits={op.splits!r}: expected bytes per peer (integers >= 0)"
    if not isinstance(op.dtype, str) or op.dtype.lower() not in _KNOWN_DTYPES:
        return f"dtype={op.dtype!r}: unknown; valid: {', '.join(sorted(_KNOWN_DTYPES))}"
    for key, value in op.extra:
        if key == "step" and value is not None and not (is_int(value) and value >= 0):
            return f"step={value!r}: expected a training step (an integer >= 0) or nothing (setup)"
    return None


def _consistency_problem(op: CommOp, header: dict[str, Any] | None) -> str | None:
    """What is wrong with a valid record's rank and process group against each other and the file's header, or
    None. A record in a rank's log is that rank's (the header's ``rank``). Its group is the global ranks of the
    process group it ran on, its own rank among them (a send's and recv's too: their group is the process group's,
    or the pair, and holds the peer, another rank, as well); no rank twice; none at or above the header's world
    size. An all_to_all's splits give the bytes to each member and add up to its size. A record that breaks this
    would add ranks the job never had, count the op on a group its rank is not in, or place bytes nowhere."""
    group = op.group
    if len(set(group)) != len(group):
        twice = sorted({r for r in group if group.count(r) > 1})
        return f"group={list(group)}: rank {', '.join(map(str, twice))} more than once; expected distinct ranks"
    stated = (header or {}).get("rank")
    stated = stated if is_int(stated) and stated >= 0 else None
    if op.rank is not None and stated is not None and op.rank != stated:
        return f"rank={op.rank} in the log of rank {stated} (its header's): expected {stated}"
    rank = op.rank if op.rank is not None else stated
    if group and rank is not None and rank not in group:
        return (f"group={list(group)} does not hold the record's rank {rank}: expected the group the rank ran "
                f"the op on, itself among its members")
    if group and op.op in ("send", "recv"):
        if op.peer is None:
            return (f"op={op.op!r} names no peer: expected the rank it {'sent to' if op.op == 'send' else 'received from'}"
                    f" (peer, a member of group={list(group)})")
        if op.peer == rank:
            return f"peer={op.peer} is the record's own rank: a {op.op} goes to another rank"
    if group and op.peer is not None and op.peer not in group:
        return f"peer={op.peer} is not in group={list(group)}: expected a member of the group it sent or received on"
    if group and op.op in ROOTED_OPS:
        root = dict(op.extra).get("root")
        if root is not None and not (is_int(root) and root in group):
            return (f"root={root!r} is not in group={list(group)}: expected the member of the group the {op.op} "
                    f"{'starts' if op.op in ('broadcast', 'scatter') else 'ends'} at (a global rank)")
    if group and op.op == "all_to_all" and op.splits is not None:
        if len(op.splits) != len(group):
            return (f"splits={list(op.splits)} has {len(op.splits)} entries for group={list(group)}: expected the bytes "
                    f"sent to each of its {len(group)} members, in group order")
        if sum(op.splits) != op.size_bytes:
            return (f"splits={list(op.splits)} sum to {sum(op.splits)} B, size_bytes={op.size_bytes}: expected the "
                    f"whole send buffer split among the group")
    world = (header or {}).get("world_size")
    if is_int(world) and world > 0:
        if group and max(group) >= world:
            return (f"group={list(group)}: rank {max(group)} is not below the header's world_size={world}; "
                    f"expected ranks 0 to {world - 1}")
        for key, value in (("rank", op.rank), ("peer", op.peer)):
            if value is not None and value >= world:
                return (f"{key}={value} is not below the header's world_size={world}; expected a rank 0 to "
                        f"{world - 1}")
    return None

