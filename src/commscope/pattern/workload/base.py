"""A workload: the CommOps of one iteration, stored as vectorised op sets.

An :class:`OpSet` is one CommOp template run by many process groups at once (all TP groups of a
pipeline stage, say) for a list of layers and micro-batches. Millions of CommOps stay a few hundred
op sets, which is what lets a 16,384-GPU prediction finish in well under a second; :meth:`Workload.ops`
expands them into individual :class:`~commscope.commop.CommOp` records when they are wanted.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from commscope.pattern.layout import Layout
from commscope.commop import AXES, CommOp
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

Detail = Literal["full", "group"]


@dataclass(frozen=True, slots=True, kw_only=True)
class OpSet:
    """One op template applied to every row of ``groups``.

    Each group row runs the op ``repeat`` times for every layer in ``layers`` (once when empty) and every
    micro-batch in ``micro_batches`` (once, outside any micro-batch, when ``None``).
    For ``send``/``recv`` each row is ``(src, dst)``: a send is issued by src, a recv by dst.
    """

    op: str
    axis: str
    name: str
    size_bytes: int
    dtype: str
    phase: str
    groups: np.ndarray
    """(num_groups, group_size) global ranks, ring order."""
    layers: tuple[int, ...] = ()
    micro_batches: int | None = None
    """Number of micro-batches the op runs in (indices 0..m-1), or None for once per iteration."""
    repeat: int = 1
    splits: np.ndarray | None = None
    """all_to_all only: (group_size, group_size) bytes from position i to position j, shared by all rows,
    or (num_groups, group_size, group_size) per row. None: even split of ``size_bytes``."""

    def __post_init__(self) -> None:
        assert self.groups.ndim == 2, self.groups.shape
        assert self.axis in AXES, self.axis

    @property
    def num_groups(self) -> int:
        return int(self.groups.shape[0])

    @property
    def group_size(self) -> int:
        return int(self.groups.shape[1])

    @property
    def count(self) -> int:
        """Ops per group row per iteration."""
        return max(1, len(self.layers)) * (self.micro_batches or 1) * self.repeat

    @property
    def num_ops(self) -> int:
        """Logical ops per iteration: group rows x count (a collective counts once per group)."""
        return self.num_groups * self.count

    @property
    def logical_bytes(self) -> int:
        """Sum of size_bytes over all ops of this set."""
        return self.size_bytes * self.num_ops

    def row_ops(self, row: int, detail: Detail = "full") -> Iterator[CommOp]:
        """The CommOps of group row ``row``."""
        group = tuple(int(r) for r in self.groups[row])
        rank = peer = None
        if self.op == "send":
            rank, peer = group[0], group[1]
        elif self.op == "recv":
            rank, peer = group[1], group[0]
        if self.op == "all_to_all" and self.splits is not None:
            # Each rank sends its own row of the split matrix: one record per issuing rank, as measured.
            mat = self.splits if self.splits.ndim == 2 else self.splits[row]
            for pos, member in enumerate(group):
                sends = tuple(int(x) for x in mat[pos])
                per_rank = OpSet(op=self.op, axis=self.axis, name=self.name, size_bytes=sum(sends), dtype=self.dtype,
                                 phase=self.phase, groups=self.groups[row:row + 1], layers=self.layers,
                                 micro_batches=self.micro_batches, repeat=self.repeat)
                for op in per_rank.row_ops(0, detail):
                    yield op.with_(rank=member, splits=sends)
            return
        base: dict[str, Any] = dict(op=self.op, axis=self.axis, group=group, size_bytes=self.size_bytes, dtype=self.dtype,
                    rank=rank, peer=peer, phase=self.phase, name=self.name)
        if detail == "group":
            layer = self.layers[0] if len(self.layers) == 1 else None
            yield CommOp(**base, layer=layer, count=self.count)
            return
        layers = self.layers or (None,)
        mbs = range(self.micro_batches) if self.micro_batches else (None,)
        for mb in mbs:
            for layer in layers:
                yield CommOp(**base, layer=layer, micro_batch=mb, count=self.repeat)


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """All communication of one training iteration."""

    model: ModelSpec
    parallel: ParallelSpec
    layout: Layout
    opsets: tuple[OpSet, ...]
    framework: str = "megatron"
    notes: tuple[str, ...] = field(default=())
    """Assumptions the generator made, for reports."""

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def num_ops(self, detail: Detail = "full") -> int:
        """How many CommOp records :meth:`ops` yields (all_to_all with splits: one per issuing rank)."""
        def per_row(s: OpSet) -> int:
            return s.group_size if (s.op == "all_to_all" and s.splits is not None) else 1
        if detail == "group":
            return sum(s.num_groups * per_row(s) for s in self.opsets)
        return sum(s.num_groups * per_row(s) * max(1, len(s.layers)) * (s.micro_batches or 1) for s in self.opsets)

    def ops(self, detail: Detail = "full") -> Iterator[CommOp]:
        """Every CommOp of the iteration; ``detail="group"`` aggregates each group row with a count."""
        for opset in self.opsets:
            for row in range(opset.num_groups):
                yield from opset.row_ops(row, detail)

    def logical_bytes_by_axis(self) -> dict[str, int]:
        """Sum of size_bytes x count per axis, counting each collective once and p2p on the send side."""
        out = {axis: 0 for axis in AXES}
        for s in self.opsets:
            if s.op != "recv":
                out[s.axis] += s.logical_bytes
        return out

    def op_counts(self) -> dict[tuple[str, str], int]:
        """Number of logical ops per (axis, op)."""
        out: dict[tuple[str, str], int] = {}
        for s in self.opsets:
            out[(s.axis, s.op)] = out.get((s.axis, s.op), 0) + s.num_ops
        return out


def p2p_pair(*, axis: str, name: str, size_bytes: int, dtype: str, phase: str, src: np.ndarray, dst: np.ndarray,
             layers: tuple[int, ...] = (), micro_batches: int | None = None, repeat: int = 1) -> tuple[OpSet, OpSet]:
    """A send op set and its matching recv op set for flows src[i] -> dst[i]."""
    pairs = np.stack([np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)], axis=1)
    common: dict[str, Any] = dict(axis=axis, name=name, size_bytes=size_bytes, dtype=dtype, phase=phase, groups=pairs,
                  layers=layers, micro_batches=micro_batches, repeat=repeat)
    return OpSet(op="send", **common), OpSet(op="recv", **common)
