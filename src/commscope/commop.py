"""The one record that predicted and measured communication share.

A predicted workload is a list of :class:`CommOp` per iteration; a captured run is a list of
:class:`CommOp` per rank. Every comparison between them is a join on these fields.

``size_bytes`` follows nccl-tests' convention (PERFORMANCE.md in NVIDIA/nccl-tests):

==================  ===========================================
op                  size_bytes is
==================  ===========================================
all_reduce          the buffer
all_gather          the gathered output (n x the input)
reduce_scatter      the input (n x the output)
all_to_all          the whole send buffer of one rank
broadcast, reduce   the buffer
send, recv          the message
==================  ===========================================
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

OpName = Literal[
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
    "send",
    "recv",
    "barrier",
    "gather",
    "scatter",
]
Axis = Literal["tp", "pp", "dp", "ep", "cp", "emb", "other"]
Phase = Literal["fwd", "bwd", "optim", "setup"]

OP_NAMES: tuple[str, ...] = get_args(OpName)
AXES: tuple[str, ...] = get_args(Axis)
#: Axes reported in summaries, in this order (``other`` only when present).
REPORT_AXES: tuple[str, ...] = ("tp", "pp", "dp", "emb", "cp", "ep")
PHASES: tuple[str, ...] = get_args(Phase)
COLLECTIVES: frozenset[str] = frozenset(OP_NAMES) - {"send", "recv"}
#: Collectives with a root, whose data starts (broadcast, scatter) or ends (reduce, gather) there. A measured op
#: keeps its root as ``extra["root"]``: a global rank, a member of its group (nccl-tests' and NCCL's logs number the
#: ranks of their group 0..n-1, so their root is its rank there too).
ROOTED_OPS: frozenset[str] = frozenset({"broadcast", "reduce", "gather", "scatter"})


#: Larger than any one message a training job can send: 1 TiB, several times the memory of the largest GPU
#: (288 GB), which must hold the whole buffer of any collective (all_gather's gathered output included).
#: Readers of other tools' logs skip a size above it as damaged, with a problem line.
MAX_MESSAGE_BYTES = 2**40

#: More ranks than any job has: the largest training clusters hold ~10^5 GPUs, and commscope's commands are tested to
#: 2^20 (routed MoE traffic). ``plan`` and ``traffic`` refuse more GPUs, and readers of measurements a larger group.
MAX_RANKS = 1 << 20

@dataclass(frozen=True, slots=True, kw_only=True)
class CommOp:
    """One communication operation.

    For a predicted collective ``rank`` is ``None``: every member of ``group`` runs it. A measured
    op always has the ``rank`` that issued it. Point-to-point ops carry ``peer``; a ``send`` from
    ``rank`` to ``peer`` and the matching ``recv`` on ``peer`` both appear, and only the ``send``
    moves bytes in a traffic matrix.
    """

    op: OpName
    """Logical operation as called (``all_reduce``, ``send``, ...)."""
    axis: Axis
    """The parallelism that caused it."""
    group: tuple[int, ...]
    """Global ranks of the process group, in ring order. For send/recv: ``(src, dst)``."""
    size_bytes: int
    """Message size in nccl-tests' convention (see the module docstring)."""
    dtype: str = "bf16"
    """Element type of the buffer (``bf16``, ``fp32``, ...)."""
    rank: int | None = None
    """Global rank that issued the op; ``None`` for a predicted collective (all of ``group``)."""
    peer: int | None = None
    """Other side of a send/recv (global rank)."""
    splits: tuple[int, ...] | None = None
    """all_to_all: bytes sent to each member of ``group``, in group order (sums to ``size_bytes``)."""
    phase: Phase | None = None
    """Where in the iteration: forward, backward, optimizer step or setup."""
    micro_batch: int | None = None
    """Micro-batch index within the iteration."""
    layer: int | None = None
    """Global transformer-layer index (0-based); ``None`` for ops not tied to one layer."""
    count: int = 1
    """Multiplicity, for aggregated predicted ops."""
    name: str = ""
    """What it is for, e.g. ``attn_out``, ``mlp_down``, ``grad_bucket0``, ``activation``."""
    t_start_ns: int | None = None
    """Measured only: issue time."""
    t_end_ns: int | None = None
    """Measured only: completion time."""
    backend_op: str | None = None
    """Measured only: the op the backend really executed, where it differs (gloo runs reduce_scatter as all_reduce)."""
    extra: tuple[tuple[str, Any], ...] = field(default=())
    """Free-form key/value pairs a producer wants to keep (never used for joins)."""

    def __post_init__(self) -> None:
        if self.op not in OP_NAMES:
            raise ValueError(f"CommOp.op={self.op!r}: valid ops are {', '.join(OP_NAMES)}")
        if self.axis not in AXES:
            raise ValueError(f"CommOp.axis={self.axis!r}: valid axes are {', '.join(AXES)}")
        if self.size_bytes < 0:
            raise ValueError(f"CommOp.size_bytes={self.size_bytes}: must be >= 0")
        if self.count < 1:
            raise ValueError(f"CommOp.count={self.count}: must be >= 1")
        if self.phase is not None and self.phase not in PHASES:
            raise ValueError(f"CommOp.phase={self.phase!r}: valid phases are {', '.join(PHASES)}")

    @property
    def group_size(self) -> int:
        return len(self.group)

    @property
    def total_bytes(self) -> int:
        """``size_bytes * count``."""
        return self.size_bytes * self.count

    @property
    def duration_ns(self) -> int | None:
        if self.t_start_ns is None or self.t_end_ns is None:
            return None
        return self.t_end_ns - self.t_start_ns

    def to_dict(self) -> dict[str, Any]:
        """A flat, JSON-ready dict; ``None`` fields are left out."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or (f.name == "extra" and not value) or (f.name == "name" and not value):
                continue
            if isinstance(value, tuple):
                value = dict(value) if f.name == "extra" else list(value)
            out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CommOp:
        """Inverse of :meth:`to_dict`; unknown keys raise a ValueError naming them."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown CommOp field(s) {sorted(unknown)}; valid: {sorted(known)}")
        kwargs = dict(data)
        for key in ("group", "splits"):
            if kwargs.get(key) is not None:
                kwargs[key] = tuple(int(x) for x in kwargs[key])
        if "extra" in kwargs:
            kwargs["extra"] = tuple(sorted(dict(kwargs["extra"]).items()))
        return cls(**kwargs)

    def with_(self, **changes: Any) -> CommOp:
        return replace(self, **changes)


def op_root(op: CommOp) -> int | None:
    """The root a measured rooted collective recorded (``extra["root"]``, a global rank); None for an op without a
    root or whose record does not say (a predicted op, a Kineto trace, a DeepSpeed log)."""
    if op.op not in ROOTED_OPS:
        return None
    for key, value in op.extra:
        if key == "root":
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


__all__ = [
    "AXES",
    "COLLECTIVES",
    "OP_NAMES",
    "PHASES",
    "REPORT_AXES",
    "ROOTED_OPS",
    "Axis",
    "CommOp",
    "OpName",
    "Phase",
    "op_root",
]
