"""What a rank's Chakra program is made of: its nodes, the job they are built from, and the rank's op instances.

:mod:`commscope.io.chakra_trace` builds each rank's program from these; :mod:`commscope.io.chakra` encodes it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commscope.estimate.bandwidth import GroupSpan, slowest_row
from commscope.io.chakra_compute import Kernel, StageKernels
from commscope.commop import CommOp

__all__ = ["MAX_TAG", "OpIndex", "TraceJob", "TraceNode", "a2a_sizes", "comm_node_name", "rank_ops"]

#: ASTRA-sim keeps send/recv tags of a trace below 500,000,000 (Sys::FrontEndSendRecvType::COLLECTIVE); tags are
#: unique per message below this, and wrap above it (a simulator still matches sends and receives of one pair in
#: order).
MAX_TAG = 500_000_000

#: PyTorch's names for the TP ops of a layer, in the order a layer issues them -> the slot's Megatron name.
_TORCH_TP = {"attention_mlp_input": ("attn_in", "mlp_in"), "attention_mlp_output": ("attn_out", "mlp_out"),
             "attention_mlp_output_grad": ("mlp_out_grad", "attn_out_grad"),
             "attention_mlp_input_grad": ("mlp_in_grad", "attn_in_grad")}


@dataclass(slots=True)
class TraceNode:
    """One node of a rank's program (a Chakra node before encoding)."""

    id: int
    name: str
    type: str
    """``comp``, ``coll``, ``send`` or ``recv``."""
    data_deps: list[int]
    ctrl_deps: list[int]
    kernel: Kernel | None = None
    op: CommOp | None = None
    index: int = 0
    """Which of the op's ``count`` instances this node is."""
    comm_size: int = 0
    """What the simulator moves: the op's size (an all-to-all: the group's largest send buffer)."""
    tag: int = 0
    phase: str = ""
    micro_batch: int | None = None
    layer: int | None = None
    chunk: int | None = None
    recompute: bool = False
    stream: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceJob:
    """What every rank's program is built from."""

    prediction: Any
    kernels: list[StageKernels]
    comm_streams: int = 1
    comm_time_s: Any = None
    """Op times (:data:`commscope.io.chakra_replay.CommTime`) for ordering the one chain; None: overlapped
    communication goes after the next blocking op, whatever its time."""
    schedule: str = field(init=False)
    tag_names: dict[str, int] = field(init=False)
    tag_radix: tuple[int, int, int] = field(init=False)
    groups: dict[tuple[str, str, int], tuple[int, ...]] = field(init=False)

    def __post_init__(self) -> None:
        par = self.prediction.parallel
        object.__setattr__(self, "schedule", "interleaved" if par.virtual_pipeline_size > 1 else par.schedule)
        names = sorted({s.name for s in self.prediction.workload.opsets if s.op == "send"})
        object.__setattr__(self, "tag_names", {n: i for i, n in enumerate(names)})
        repeat = max((s.repeat for s in self.prediction.workload.opsets if s.op == "send"), default=1)
        object.__setattr__(self, "tag_radix", (par.num_micro_batches + 1, self.prediction.model.num_layers + 1, repeat))
        # the slowest group of each op set per stage: what times an op the same way on every rank of the stage
        gpn = self.prediction.cluster.gpus_per_node
        stage_of = self.prediction.workload.layout.stage_of()
        groups: dict[tuple[str, str, int], tuple[int, ...]] = {}
        for s in self.prediction.workload.opsets:
            row = slowest_row(*GroupSpan.row_spans(s.groups, gpn))
            groups.setdefault((s.op, s.name, int(stage_of[s.groups[0, 0]])), tuple(int(r) for r in s.groups[row]))
        object.__setattr__(self, "groups", groups)

    def op_time_s(self, op: CommOp, size_bytes: int, stage: int) -> float:
        """Seconds of ``op`` as the bandwidth model times its op set's slowest group (the same on every rank of the
        stage); 0 without ``comm_time_s``."""
        if self.comm_time_s is None:
            return 0.0
        return float(self.comm_time_s(op.op, size_bytes, self.groups.get((op.op, op.name, stage), op.group)))

    def tag(self, op: CommOp, index: int) -> int:
        """The tag a send and its receive share: unique per message of the iteration (below :data:`MAX_TAG`)."""
        mbs, layers, repeat = self.tag_radix
        value = self.tag_names.get(op.name, len(self.tag_names))
        value = value * mbs + (0 if op.micro_batch is None else op.micro_batch + 1)
        value = value * layers + (0 if op.layer is None else op.layer + 1)
        return (value * repeat + index) % MAX_TAG


def rank_ops(workload: Any, rank: int) -> Iterator[CommOp]:
    """The CommOps of ``workload`` that ``rank`` issues: collectives of its groups, its sends and receives, its own
    all-to-all records; as :meth:`Workload.ops` has them, without expanding the other ranks'."""
    for s in workload.opsets:
        g = s.groups
        if s.op == "send":
            rows = np.flatnonzero(g[:, 0] == rank)
        elif s.op == "recv":
            rows = np.flatnonzero(g[:, 1] == rank)
        else:
            rows = np.flatnonzero((g == rank).any(axis=1))
        for row in rows:
            for op in s.row_ops(int(row)):
                if op.op == "all_to_all" and op.rank is not None and op.rank != rank:
                    continue
                yield op


def a2a_sizes(workload: Any, rank: int) -> dict[tuple[Any, ...], int]:
    """The group's largest send buffer of each all-to-all ``rank`` joins (what every member must agree on)."""
    out: dict[tuple[Any, ...], int] = {}
    for s in workload.opsets:
        if s.op != "all_to_all":
            continue
        for row in np.flatnonzero((s.groups == rank).any(axis=1)):
            for op in s.row_ops(int(row)):
                key = (op.name, op.phase, op.micro_batch, op.layer, op.group)
                out[key] = max(out.get(key, 0), op.size_bytes)
    return out


class OpIndex:
    """A rank's op instances (``count`` expanded), taken by where the program needs them."""

    def __init__(self, ops: Iterator[CommOp]) -> None:
        self.slots: dict[tuple[Any, ...], deque[tuple[CommOp, int]]] = {}
        for op in ops:
            kind = op.op if op.op in ("send", "recv") else "coll"
            for j in range(op.count):
                name, index = op.name, j
                if op.name in _TORCH_TP and op.count == 2:
                    name, index = _TORCH_TP[op.name][j], 0
                key = (kind, op.phase, op.micro_batch, op.layer, name)
                self.slots.setdefault(key, deque()).append((op, index))

    def take(self, kind: str, phase: str, mb: int | None, layer: int | None, name: str) -> tuple[CommOp, int] | None:
        q = self.slots.get((kind, phase, mb, layer, name))
        return q.popleft() if q else None

    def take_all(self, kind: str, phase: str, mb: int | None, layer: int | None, name: str) -> list[tuple[CommOp, int]]:
        q = self.slots.pop((kind, phase, mb, layer, name), None)
        return list(q) if q else []

    def take_once(self, predicate: Any) -> list[tuple[CommOp, int]]:
        """Instances of once-per-iteration ops (no micro-batch) whose (kind, phase, name) satisfy ``predicate``, in
        the order the op list has them."""
        out: list[tuple[CommOp, int]] = []
        for key in [k for k in self.slots if k[2] is None and predicate(k[0], k[1], k[4])]:
            out += self.slots.pop(key)
        return out

    def rest(self) -> list[tuple[CommOp, int]]:
        order = {"setup": 0, "fwd": 1, "bwd": 2, "optim": 3}

        def key(k: tuple[Any, ...]) -> tuple[Any, ...]:
            kind, phase, mb, layer, name = k
            return (order.get(phase or "", 4), -1 if mb is None else mb, -1 if layer is None else layer, name, kind)
        out: list[tuple[CommOp, int]] = []
        for k in sorted((k for k, q in self.slots.items() if q), key=key):
            out += self.slots.pop(k)
        return out


def comm_node_name(op: CommOp, index: int) -> str:
    """``tp:all_reduce:fwd:mb0:layer3:attn_out#1``: axis, op, where, and which of the op's ``count``."""
    where = [p for p in (op.phase, None if op.micro_batch is None else f"mb{op.micro_batch}",
                         None if op.layer is None else f"layer{op.layer}", op.name or None) if p]
    return ":".join([op.axis, op.op, *where]) + (f"#{index}" if op.count > 1 else "")
