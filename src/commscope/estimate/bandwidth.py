"""Effective-bandwidth models: how long one collective of S bytes over a group of n GPUs takes.

Time follows nccl-tests' definitions (NVIDIA/nccl-tests doc/PERFORMANCE.md [nccl-tests-perf]):
algbw = S / t and busbw = algbw x f(op, n) with

    f = 2 (n-1)/n   all_reduce
    f = (n-1)/n     all_gather, reduce_scatter, all_to_all, gather, scatter
    f = 1           broadcast, reduce, send/recv

so an op takes t = S f / busbw. busbw is what a link tier sustains per GPU, independent of n for ring
algorithms, which is why presets store it.

:class:`AlphaBeta` adds a latency term per algorithm step (Hockney's alpha-beta model [thakur-2005]):

    t = steps(op, n) x alpha + S f / busbw_eff

with steps = 2(n-1) for a ring all_reduce, n-1 for all_gather / reduce_scatter / all_to_all / broadcast /
reduce, 1 for send/recv. The tier follows from the layout: a group inside one node uses the intra-node
links; a group spanning N nodes with k members on each runs hierarchically (NVLink inside, k NICs between
nodes: NCCL's rings cross each node boundary once per channel, so the k NICs of the group's members
carry the whole ring and its bus bandwidth is

    busbw_eff = min(B_intra, k x B_inter)

Worked example, DGX A100 (B_intra 230 GB/s, B_inter 24 GB/s per GPU): an all_reduce over 16 GPUs on
2 nodes (k = 8) gets min(230, 8 x 24) = 192 GB/s, the published plateau for that setup (GTC24 S62129 in
published_busbw.csv); over 2 GPUs on 2 nodes (k = 1), 24 GB/s. B_inter is a per-GPU share (NICs per node
x NIC rate / GPUs per node), so a DP group with one GPU per node shares no NIC with the other DP groups.

:class:`MeasuredTable` interpolates measured busbw (nccl-tests output or commscope bench JSON) in log
size for each (op, group size), and says when a query falls outside what was measured.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from commscope.errors import ConfigError
from commscope.spec.cluster import ClusterSpec

T = TypeVar("T")


#: nccl-tests' bus-bandwidth factors.
def busbw_factor(op: str, n: int) -> float:
    """f(op, n) of nccl-tests: busbw = algbw x f. ``busbw_factor('all_reduce', 8) == 1.75``."""
    if n < 1:
        raise ValueError(f"group size n={n} must be >= 1")
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "alltoall", "gather", "scatter"):
        return (n - 1) / n
    if op in ("broadcast", "reduce", "send", "recv", "sendrecv"):
        return 1.0
    raise ValueError(f"no bus-bandwidth factor for op {op!r}")


def algorithm_steps(op: str, n: int) -> int:
    """Latency-bound steps of the ring/direct algorithm: 2(n-1) for all_reduce, n-1 for the others, 1 for p2p."""
    if op in ("send", "recv", "sendrecv"):
        return 1
    if op == "all_reduce":
        return 2 * (n - 1)
    return max(1, n - 1)


@dataclass(frozen=True, slots=True)
class GroupSpan:
    """Where a group's members sit: n ranks on num_nodes nodes with at most per_node on any node."""

    n: int
    num_nodes: int
    per_node: int

    @classmethod
    def of(cls, group, gpus_per_node: int) -> GroupSpan:
        nodes = np.asarray(group) // gpus_per_node
        uniq, counts = np.unique(nodes, return_counts=True)
        return cls(n=len(nodes), num_nodes=len(uniq), per_node=int(counts.min()))

    @classmethod
    def slowest(cls, groups, gpus_per_node: int) -> GroupSpan:
        """The span of the slowest of ``groups`` (a (G, n) array of ranks, or one group): one that crosses nodes
        if any does, with the fewest members on some node (the fewest NICs carry its inter-node traffic), then on
        the most nodes. Every group of an op set runs at once and the op takes as long as its slowest; with whole
        nodes and Megatron's orders all groups sit alike, but not when a group size does not divide the node (tp 3
        on 8 GPUs per node) or the last node is partly used."""
        g = np.asarray(groups, dtype=np.int64)
        if g.ndim == 1 or g.shape[0] == 1:
            return cls.of(g.reshape(-1), gpus_per_node)
        num_nodes, per_node = cls.row_spans(g, gpus_per_node)
        i = slowest_row(num_nodes, per_node)
        return cls(n=g.shape[1], num_nodes=int(num_nodes[i]), per_node=int(per_node[i]))

    @staticmethod
    def row_spans(groups: np.ndarray, gpus_per_node: int) -> tuple[np.ndarray, np.ndarray]:
        """(num_nodes, per_node) of every row of a (G, n) array of groups, vectorised."""
        rows, n = groups.shape
        lo, hi = groups.min(axis=1) // gpus_per_node, groups.max(axis=1) // gpus_per_node
        if (lo == hi).all():  # every group inside one node: the common case
            return np.ones(rows, dtype=np.int64), np.full(rows, n, dtype=np.int64)
        nodes = np.sort(groups // gpus_per_node, axis=1)
        starts = np.ones(nodes.shape, dtype=bool)
        starts[:, 1:] = nodes[:, 1:] != nodes[:, :-1]
        first = np.flatnonzero(starts.ravel())  # every row starts a run: runs never cross rows
        runs = np.concatenate((first[1:], (starts.size,))) - first
        # each row's shortest run: the runs of row r are those from the one at column 0 of r on
        per_node = np.minimum.reduceat(runs, np.flatnonzero(first % n == 0))
        return starts.sum(axis=1), per_node

    @property
    def intra_node(self) -> bool:
        return self.num_nodes == 1


class BandwidthModel(Protocol):
    """What the estimator needs: the time of one op, and what the model had to assume."""

    def op_time_s(self, op: str, size_bytes: float, span: GroupSpan) -> float: ...

    def busbw_bytes_per_s(self, op: str, size_bytes: float, span: GroupSpan) -> float: ...

    @property
    def notes(self) -> list[str]: ...


def slowest_row(num_nodes: np.ndarray, per_node: np.ndarray) -> int:
    """Index of the slowest of groups with these spans (see :meth:`GroupSpan.slowest`): crossing nodes first, then
    the fewest members on one node, then the most nodes; the first such."""
    return int(np.lexsort((-num_nodes, per_node, num_nodes == 1))[0])


def _alpha_beta_terms(cluster: ClusterSpec, op: str, size: np.ndarray, n, num_nodes, per_node):
    """(steps, alpha per step, bus factor f, bus bandwidth) of ``op``: time = steps x alpha + size x f / bandwidth."""
    n = np.asarray(n, dtype=np.int64)
    nodes = np.asarray(num_nodes, dtype=np.int64)
    k = np.asarray(per_node, dtype=np.int64)
    intra_bw = cluster.intra_node.bandwidth_bytes_per_s
    inter_bw = cluster.inter_node.bandwidth_bytes_per_s
    inside = nodes <= 1
    if op in ("send", "recv", "sendrecv"):
        f = np.ones_like(size)
        steps = np.ones_like(n)
        bw = np.where(inside, intra_bw, inter_bw)
    elif op == "all_to_all":
        nn = np.maximum(n, 1)
        f = (nn - 1) / nn
        steps = np.maximum(nn - 1, 1)
        t_unit = np.maximum((nn - k) / nn / inter_bw, (k - 1) / nn / intra_bw)
        bw = np.where(inside, intra_bw, f / np.where(t_unit > 0, t_unit, np.inf))
    else:
        nn = np.maximum(n, 1)
        f = np.asarray(2 * (nn - 1) / nn if op == "all_reduce" else ((nn - 1) / nn if op in ("all_gather", "reduce_scatter") else 1.0))
        f = np.broadcast_to(f, np.broadcast_shapes(np.shape(f), size.shape)).astype(np.float64)
        steps = 2 * (nn - 1) if op == "all_reduce" else np.maximum(nn - 1, 1)
        bw = np.where(inside, intra_bw, np.minimum(intra_bw, k * inter_bw))
    alpha = np.where(inside, cluster.intra_node.latency_s, cluster.inter_node.latency_s)
    return steps, alpha, f, bw


def _alpha_beta_numbers(cluster: ClusterSpec, op: str, n: int, num_nodes: int, per_node: int) -> tuple[Any, ...]:
    """:func:`_alpha_beta_terms` of one group given as numbers: the same arithmetic, operation for operation (Python's
    floats round as numpy's float64 do), without an array's overhead; one estimate's groups mostly sit alike, and
    the closed form times each of their op sets with it (tests/estimate/test_estimate_many.py holds the two equal)."""
    intra_bw = cluster.intra_node.bandwidth_bytes_per_s
    inter_bw = cluster.inter_node.bandwidth_bytes_per_s
    inside = num_nodes <= 1
    alpha = cluster.intra_node.latency_s if inside else cluster.inter_node.latency_s
    if op in ("send", "recv", "sendrecv"):
        return 1, alpha, 1.0, intra_bw if inside else inter_bw
    nn = max(n, 1)
    if op == "all_to_all":
        f = (nn - 1) / nn
        t_unit = max((nn - per_node) / nn / inter_bw, (per_node - 1) / nn / intra_bw)
        return max(nn - 1, 1), alpha, f, intra_bw if inside else f / (t_unit if t_unit > 0 else math.inf)
    f = 2 * (nn - 1) / nn if op == "all_reduce" else ((nn - 1) / nn if op in ("all_gather", "reduce_scatter") else 1.0)
    steps = 2 * (nn - 1) if op == "all_reduce" else max(nn - 1, 1)
    return steps, alpha, f, intra_bw if inside else min(intra_bw, per_node * inter_bw)


def alpha_beta_time_s(cluster: ClusterSpec, op: str, size_bytes, n, num_nodes, per_node):
    """Vectorised alpha-beta time of ``op`` (arrays broadcast): the formula of the module docstring.

    ``n`` ranks on ``num_nodes`` nodes with ``per_node`` ranks on each; size 0 or n < 2 takes 0 s.
    """
    size = np.asarray(size_bytes, dtype=np.float64)
    steps, alpha, f, bw = _alpha_beta_terms(cluster, op, size, n, num_nodes, per_node)
    t = steps * alpha + size * f / bw
    return np.where((np.asarray(n) < 2) | (size <= 0), 0.0, t)


def alpha_beta_busbw_bytes_per_s(cluster: ClusterSpec, op: str, n, num_nodes, per_node):
    """Vectorised large-message bus bandwidth of ``op`` (no latency term), as nccl-tests' busbw: f bytes over the
    time of one more byte, f / (f / bandwidth), which is the bandwidth term of :func:`alpha_beta_time_s` itself (taken
    directly: the time of one byte less that of half a byte loses 11 digits to the latency term); a group of fewer
    than 2 ranks gets the intra-node bandwidth."""
    n = np.asarray(n, dtype=np.int64)
    _, _, _, bw = _alpha_beta_terms(cluster, op, np.ones(n.shape), n, num_nodes, per_node)
    return np.where(n < 2, cluster.intra_node.bandwidth_bytes_per_s, np.broadcast_to(bw, n.shape)).astype(np.float64)


@dataclass(slots=True)
class AlphaBeta:
    """Alpha-beta model per link tier, from a ClusterSpec."""

    cluster: ClusterSpec
    notes: list[str] = field(default_factory=list)

    def busbw_bytes_per_s(self, op: str, size_bytes: float, span: GroupSpan) -> float:
        """Large-message bus bandwidth of ``op`` on ``span`` (no latency term)."""
        return float(alpha_beta_busbw_bytes_per_s(self.cluster, op, span.n, span.num_nodes, span.per_node))

    def op_time_s(self, op: str, size_bytes: float, span: GroupSpan) -> float:
        return float(alpha_beta_time_s(self.cluster, op, size_bytes, span.n, span.num_nodes, span.per_node))


@dataclass(frozen=True, slots=True, kw_only=True)
class TableRow:
    """One measured point: ``op`` over ``group_size`` ranks at ``size_bytes`` reached ``busbw_bytes_per_s``."""

    op: str
    group_size: int
    size_bytes: int
    busbw_bytes_per_s: float
    intra_node: bool | None = None
    """True/False when known whether the group stayed inside one node; None: unknown (applies to both)."""


@dataclass(slots=True)
class MeasuredTable:
    """Bus bandwidth interpolated from measurements, per (op, group size), linear in log2(size).

    Queries outside the measured sizes use the nearest measured busbw and add a note; a query for an op
    that was never measured raises ConfigError naming the op and the sizes it needed. Ops with no
    measurement for the requested group size use the closest measured group size (noted).
    """

    rows: list[TableRow]
    source: str = "measured table"
    fallback: AlphaBeta | None = None
    """Used for ops the table lacks, when given (noted); otherwise such a query raises."""
    notes: list[str] = field(default_factory=list)
    _curves: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.rows:
            raise ConfigError("bandwidth", self.source, "has no rows (expected op, group size, size and busbw per row)")
        curves: dict[tuple[str, int, bool | None], list[tuple[int, float]]] = {}
        for i, r in enumerate(self.rows, start=1):
            if not (r.busbw_bytes_per_s > 0 and r.size_bytes > 0 and r.group_size >= 2):
                raise ConfigError(f"row {i}", f"{r.op} over {r.group_size} ranks at {r.size_bytes} B, "
                                              f"{r.busbw_bytes_per_s / 1e9:g} GB/s",
                                  "needs a group of >= 2 ranks, a size > 0 and a bus bandwidth > 0", source=self.source)
            op = "send" if r.op in ("sendrecv", "recv") else r.op
            curves.setdefault((op, r.group_size, r.intra_node), []).append((r.size_bytes, r.busbw_bytes_per_s))
        for key, pts in curves.items():
            pts.sort()
            by_size: dict[int, list[float]] = {}
            for s, b in pts:
                by_size.setdefault(s, []).append(b)
            sizes = np.array(sorted(by_size), dtype=float)
            bw = np.array([float(np.median(by_size[s])) for s in sorted(by_size)])
            self._curves[key] = (np.log2(sizes), bw)

    def ops(self) -> set[str]:
        return {k[0] for k in self._curves}

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _curve(self, op: str, span: GroupSpan):
        """The curve that times ``op`` over ``span`` (:func:`nearest_measured`), or None."""
        op = "send" if op in ("sendrecv", "recv") else op
        best = nearest_measured([k for k in self._curves if k[0] == op], span, group_size=lambda k: k[1],
                                intra_node=lambda k: k[2])
        if best is None:
            return None
        if best[1] != span.n:
            self._note(f"{self.source}: no {op} measured over {span.n} ranks {_placement(span)}; used the "
                       f"{best[1]}-rank rows")
        else:
            self._note(f"{self.source}: {op} over {span.n} ranks {_placement(span)} timed from the table")
        return self._curves[best]

    def _without_curve(self, op: str, size_bytes: float, span: GroupSpan) -> AlphaBeta:
        """The fallback for an op the table lacks (noted); ConfigError without one."""
        if self.fallback is None:
            have = ", ".join(sorted(self.ops())) or "none"
            raise ConfigError("bandwidth", self.source,
                              f"lacks {op} (needed for {span.n} ranks at {int(size_bytes):,} bytes); it has: {have}")
        self._note(f"{self.source}: no {op} measured {_placement(span)} (over {span.n} ranks); those use the cluster "
                   f"preset's alpha-beta model")
        return self.fallback

    def busbw_bytes_per_s(self, op: str, size_bytes: float, span: GroupSpan) -> float:
        curve = self._curve(op, span)
        if curve is None:
            return self._without_curve(op, size_bytes, span).busbw_bytes_per_s(op, size_bytes, span)
        return self._interpolate(op, size_bytes, curve)

    def _interpolate(self, op: str, size_bytes: float, curve) -> float:
        logs, bw = curve
        x = math.log2(max(size_bytes, 1))
        if x < logs[0] or x > logs[-1]:
            self._note(f"{self.source}: {op} at {int(size_bytes):,} bytes is outside the measured "
                       f"{int(2 ** logs[0]):,}-{int(2 ** logs[-1]):,} bytes; extrapolated with the nearest busbw")
        return float(np.interp(x, logs, bw))

    def op_time_s(self, op: str, size_bytes: float, span: GroupSpan) -> float:
        if span.n < 2 or size_bytes <= 0:
            return 0.0
        curve = self._curve(op, span)
        if curve is None:  # the preset's whole alpha-beta time: its busbw alone would drop the latency term
            return self._without_curve(op, size_bytes, span).op_time_s(op, size_bytes, span)
        f = busbw_factor(op, span.n if op not in ("send", "recv") else 2)
        return size_bytes * f / self._interpolate(op, size_bytes, curve)


def _placement(span: GroupSpan) -> str:
    return "inside one node" if span.intra_node else "across nodes"


def nearest_measured(items: Iterable[T], span: GroupSpan, *, group_size: Callable[[T], int],
                     intra_node: Callable[[T], bool | None]) -> T | None:
    """Of measured ``items`` (table curves, fitted curves), the one that stands for a group ``span``: measured in
    the same placement (inside one node, or across nodes) at the nearest group size (the smaller on a tie). One of
    unknown placement stands for a group inside a node, and for one across nodes only at its own group size (8
    GPUs measured on one node say nothing of 16 on two). None when no item may."""
    usable = [x for x in items if intra_node(x) == span.intra_node
              or (intra_node(x) is None and (span.intra_node or group_size(x) == span.n))]
    if not usable:
        return None
    return min(usable, key=lambda x: (abs(math.log2(group_size(x)) - math.log2(max(span.n, 1))), group_size(x)))


def table_from_bench_rows(rows, *, source: str, fallback: AlphaBeta | None = None) -> MeasuredTable:
    """A MeasuredTable from objects with op, group_size, size_bytes, busbw_bytes_per_s (e.g. parsed nccl-tests)."""
    table_rows = []
    for r in rows:
        n = getattr(r, "group_size", None)
        if not n:
            raise ConfigError("bandwidth", source, f"row for {r.op} at {r.size_bytes} bytes has no group size")
        table_rows.append(TableRow(op=r.op, group_size=int(n), size_bytes=int(r.size_bytes),
                                   busbw_bytes_per_s=float(r.busbw_bytes_per_s),
                                   intra_node=getattr(r, "intra_node", None)))
    return MeasuredTable(rows=table_rows, source=source, fallback=fallback)
