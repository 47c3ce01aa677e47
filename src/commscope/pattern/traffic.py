"""Collective algorithms -> (src, dst, bytes) flows -> a sparse traffic matrix.

Orientation: ``traffic_bytes[src, dst]`` is the number of bytes GPU ``src`` sends to GPU ``dst`` in one
iteration. Rows are senders, columns receivers; the diagonal is always zero.

Every algorithm is written once, at the level of positions 0..n-1 in a group ("position i sends so many
bytes to position j"), and then applied to all groups of an op set at once by indexing the group array.
Buffers are split into n chunks at element granularity (chunk j holds E // n + (j < E % n) elements),
as NCCL splits them, so byte counts are exact integers and conserved.

Algorithms (per-rank bytes sent for a buffer of S bytes over n ranks; all from nccl-tests' PERFORMANCE.md
and Thakur, Rabenseifner & Gropp 2005 [thakur-2005]):

=============  =====================================================  =========================
op             ring (default)                                          volume sent per rank
=============  =====================================================  =========================
all_reduce     reduce-scatter then all-gather around the ring          2 (n-1)/n S  [seed-talk]
reduce_scatter n-1 chunks to the ring successor                        (n-1)/n S
all_gather     n-1 chunks to the ring successor                        (n-1)/n S
broadcast      pipelined chain from the root                           S (n-1 ranks)
reduce         pipelined chain into the root                           S (n-1 ranks)
all_to_all     direct: the split for j goes to j                       (n-1)/n S (balanced)
send           direct                                                  S
=============  =====================================================  =========================

``direct`` sends every chunk straight to its owner (pairwise); ``tree`` is NCCL's double binary tree for
all_reduce (each half of the buffer reduced up one tree and broadcast down it; other ops fall back to
ring); ``hierarchical`` runs an all_reduce as intra-node reduce-scatter, inter-node all-reduce of each
chunk among ranks with the same local index, intra-node all-gather (falls back to ring when the group
does not have the same number of ranks on each of its nodes). Worked example: a ring all_reduce of
100 MB over 4 ranks sends 150 MB per rank, 600 MB in all = 2 (n-1) S.

Rooted collectives (broadcast, reduce, gather, scatter) are decomposed with their root at position 0. A measured
op's group is first turned, ring order kept, to start at the root its record names (:func:`root_first`):
nccl-tests, NCCL's own log and commscope's recorder keep the group as called and the root apart. A broadcast
from rank 2 of ``(0, 1, 2, 3)`` then runs 2 -> 3 -> 0 -> 1. An op that names no root starts at its group's first
rank, as predicted ops do.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from commscope.commop import AXES, ROOTED_OPS, CommOp, op_root
from commscope.units import dtype_bytes

if TYPE_CHECKING:  # the workload imports nothing of this module, but flows_of_op makes op sets at run time
    from commscope.pattern.workload.base import OpSet, Workload

Algorithm = Literal["ring", "direct", "tree", "hierarchical"]
ALGORITHMS: tuple[str, ...] = ("ring", "direct", "tree", "hierarchical")
LINK_CLASSES: tuple[str, ...] = ("intra_node", "inter_node")
_AXIS_CODE = {a: i for i, a in enumerate(AXES)}
_NO_FLOW_OPS = frozenset({"recv", "barrier"})


def _chunks(size_bytes: int, elem_bytes: int, n: int) -> np.ndarray:
    """Byte size of each of the n chunks of a buffer split at element granularity."""
    if size_bytes % elem_bytes:
        elem_bytes = 1
    elements = size_bytes // elem_bytes
    base, rest = divmod(elements, n)
    return (np.full(n, base, dtype=np.int64) + (np.arange(n) < rest)) * elem_bytes


Pattern = tuple[np.ndarray, np.ndarray, np.ndarray]  # src positions, dst positions, bytes


@lru_cache(maxsize=4096)
def _pattern(op: str, algorithm: str, n: int, size_bytes: int, elem_bytes: int, node_key: tuple[int, ...] | None) -> Pattern:
    """Position-level flows of one op (cached: op sets share a handful of shapes)."""
    pos = np.arange(n, dtype=np.int64)
    nxt = (pos + 1) % n
    c = _chunks(size_bytes, elem_bytes, n)
    if op == "send":
        return np.array([0]), np.array([1]), np.array([size_bytes], dtype=np.int64)
    if op == "all_to_all":
        src, dst = np.meshgrid(pos, pos, indexing="ij")
        mask = src != dst
        return src[mask], dst[mask], np.broadcast_to(c, (n, n))[mask].copy()
    if algorithm == "hierarchical" and op == "all_reduce" and node_key is not None:
        flows = _hierarchical_all_reduce(n, size_bytes, elem_bytes, node_key)
        if flows is not None:
            return flows
    if algorithm == "tree" and op == "all_reduce" and n > 2:
        return _double_tree_all_reduce(n, size_bytes, elem_bytes)
    if algorithm == "direct":
        src, dst = np.meshgrid(pos, pos, indexing="ij")
        mask = src != dst
        s, d = src[mask], dst[mask]
        if op == "all_reduce":
            return s, d, c[d] + c[s]
        if op == "reduce_scatter":
            return s, d, c[d]
        if op == "all_gather":
            return s, d, c[s]
        if op == "broadcast":
            return np.zeros(n - 1, dtype=np.int64), pos[1:], np.full(n - 1, size_bytes, dtype=np.int64)
        if op == "reduce":
            return pos[1:], np.zeros(n - 1, dtype=np.int64), np.full(n - 1, size_bytes, dtype=np.int64)
    # ring (and the fall-back of every other algorithm)
    if op == "all_reduce":
        return pos, nxt, 2 * size_bytes - c[(pos + 1) % n] - c[(pos + 2) % n]
    if op in ("reduce_scatter", "all_gather"):
        return pos, nxt, size_bytes - c[(pos + 1) % n]
    if op == "broadcast":
        return pos[:-1], pos[1:], np.full(n - 1, size_bytes, dtype=np.int64)
    if op == "reduce":
        chain = np.concatenate([pos[1:], [0]])
        return chain[:-1], chain[1:], np.full(n - 1, size_bytes, dtype=np.int64)
    if op in ("gather", "scatter"):
        others = pos[1:]
        sizes = c[1:]
        if op == "gather":
            return others, np.zeros(n - 1, dtype=np.int64), sizes
        return np.zeros(n - 1, dtype=np.int64), others, sizes
    raise ValueError(f"no traffic decomposition for op {op!r}")


def _double_tree_all_reduce(n: int, size_bytes: int, elem_bytes: int) -> Pattern:
    """Two binary trees (heap order over positions, the second over positions shifted by one), each reducing
    and broadcasting one half of the buffer: 2 (n-1) S bytes in all, like the ring [nccl-trees]."""
    halves = _chunks(size_bytes, elem_bytes, 2)
    src, dst, nbytes = [], [], []
    for t, half in enumerate(halves):
        child = np.arange(1, n)
        parent = (child - 1) // 2
        child, parent = (child + t) % n, (parent + t) % n
        src += [child, parent]
        dst += [parent, child]
        nbytes += [np.full(n - 1, half, dtype=np.int64)] * 2
    return np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes)


def _hierarchical_all_reduce(n: int, size_bytes: int, elem_bytes: int, node_key: tuple[int, ...]) -> Pattern | None:
    nodes = np.asarray(node_key)
    uniq = np.unique(nodes)
    members = [np.flatnonzero(nodes == u) for u in uniq]
    k = len(members[0])
    if len(uniq) == 1 or any(len(m) != k for m in members):
        return None
    src, dst, nbytes = [], [], []
    local_chunks = _chunks(size_bytes, elem_bytes, k)
    for m in members:  # intra-node ring reduce-scatter and all-gather: 2 (S - c[i+1]) per local rank
        if k > 1:
            i = np.arange(k)
            src.append(m)
            dst.append(m[(i + 1) % k])
            nbytes.append(2 * (size_bytes - local_chunks[(i + 1) % k]))
    num_nodes = len(members)
    for j in range(k):  # inter-node ring all-reduce of chunk j among the j-th ranks of each node
        ring = np.array([m[j] for m in members])
        sub = _chunks(int(local_chunks[j]), elem_bytes if local_chunks[j] % elem_bytes == 0 else 1, num_nodes)
        i = np.arange(num_nodes)
        src.append(ring)
        dst.append(ring[(i + 1) % num_nodes])
        nbytes.append(2 * int(local_chunks[j]) - sub[(i + 1) % num_nodes] - sub[(i + 2) % num_nodes])
    return np.concatenate(src), np.concatenate(dst), np.concatenate(nbytes).astype(np.int64)


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficMatrix:
    """Sparse per-GPU-pair traffic of one iteration, kept per parallelism axis.

    Entries are coalesced: each (src, dst, axis) appears once. ``bytes[k]`` is what ``src[k]`` sends to
    ``dst[k]`` for axis ``AXES[axis[k]]``.
    """

    world_size: int
    gpus_per_node: int
    src: np.ndarray
    dst: np.ndarray
    axis: np.ndarray
    """Index into :data:`commscope.commop.AXES`."""
    bytes: np.ndarray
    algorithm: str = "ring"
    view: Literal["logical", "wire"] = "logical"
    """``logical``: ops as called, decomposed by ``algorithm``; ``wire``: what the backend really ran."""

    # ----- totals -----
    def _axis_codes(self) -> list[int]:
        """The axis codes present, ascending (counted, not sorted: a matrix of 1M GPUs has tens of millions of entries)."""
        counts = np.bincount(self.axis, minlength=len(AXES)) if self.axis.size else np.zeros(0, dtype=np.int64)
        return np.flatnonzero(counts).tolist()

    @property
    def total_bytes(self) -> int:
        return int(self.bytes.sum())

    def bytes_by_axis(self) -> dict[str, int]:
        out = {a: 0 for a in AXES}
        for code in self._axis_codes():
            out[AXES[code]] = int(self.bytes[self.axis == code].sum())
        return out

    @property
    def is_intra_node(self) -> np.ndarray:
        return np.asarray((self.src // self.gpus_per_node) == (self.dst // self.gpus_per_node))

    def bytes_by_link(self) -> dict[str, int]:
        intra = self.is_intra_node
        return {"intra_node": int(self.bytes[intra].sum()), "inter_node": int(self.bytes[~intra].sum())}

    def bytes_by_axis_and_link(self) -> dict[str, dict[str, int]]:
        intra = self.is_intra_node
        out = {}
        for code in self._axis_codes():
            sel = self.axis == code
            out[AXES[code]] = {"intra_node": int(self.bytes[sel & intra].sum()), "inter_node": int(self.bytes[sel & ~intra].sum())}
        return out

    # ----- pairs -----
    def pairs(self, axis: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, bytes) summed over axes (or for one axis), one entry per GPU pair."""
        sel = slice(None) if axis is None else self.axis == _AXIS_CODE[axis]
        return _pairs(self.src[sel], self.dst[sel], self.bytes[sel], self.world_size)

    @property
    def num_pairs(self) -> int:
        return int(self.pairs()[0].size)

    @property
    def max_pair_bytes(self) -> int:
        b = self.pairs()[2]
        return int(b.max()) if b.size else 0

    def sent_by_rank(self) -> np.ndarray:
        """Bytes each rank sends (row sums), shape (world_size,)."""
        return np.bincount(self.src, weights=self.bytes.astype(np.float64), minlength=self.world_size).round().astype(np.int64)

    def received_by_rank(self) -> np.ndarray:
        """Bytes each rank receives (column sums), shape (world_size,)."""
        return np.bincount(self.dst, weights=self.bytes.astype(np.float64), minlength=self.world_size).round().astype(np.int64)

    def to_dense(self, axis: str | None = None) -> np.ndarray:
        """Dense (world_size, world_size) int64 matrix ``[src, dst]``; mind the memory above a few thousand GPUs."""
        out = np.zeros((self.world_size, self.world_size), dtype=np.int64)
        s, d, b = self.pairs(axis)
        out[s, d] = b
        return out

    @property
    def num_nodes(self) -> int:
        return -(-self.world_size // self.gpus_per_node)

    def node_matrix(self, axis: str | None = None) -> np.ndarray:
        """Dense (nodes, nodes) int64 matrix of bytes node src sends to node dst; intra-node traffic on the diagonal."""
        s, d, b = self.pairs(axis)
        n = self.num_nodes
        out = np.zeros(n * n, dtype=np.int64)
        np.add.at(out, (s // self.gpus_per_node) * n + d // self.gpus_per_node, b)
        return out.reshape(n, n)

    def axes_present(self) -> list[str]:
        return [AXES[c] for c in self._axis_codes()]

    def triplets(self) -> list[tuple[int, int, str, int]]:
        """(src, dst, axis, bytes) rows, sorted by src, dst, axis."""
        order = np.lexsort((self.axis, self.dst, self.src))
        return [(int(self.src[k]), int(self.dst[k]), AXES[self.axis[k]], int(self.bytes[k])) for k in order]

    def columns(self) -> dict[str, np.ndarray]:
        """The matrix as table columns ``src, dst, axis`` (names), ``bytes``, ``intra_node``, sorted by src, dst,
        axis: what :meth:`to_pandas`, :meth:`to_polars` and the Parquet writer (:mod:`commscope.io.tables`) hold."""
        order = np.lexsort((self.axis, self.dst, self.src))
        src, dst = self.src[order].astype(np.int64), self.dst[order].astype(np.int64)
        return {"src": src, "dst": dst, "axis": np.array(AXES, dtype=object)[self.axis[order]],
                "bytes": self.bytes[order].astype(np.int64),
                "intra_node": (src // self.gpus_per_node) == (dst // self.gpus_per_node)}

    def to_pandas(self) -> Any:
        """``src, dst, axis, bytes, intra_node`` as a pandas DataFrame, the matrix's scalars in ``attrs``
        (needs pandas: ``pip install 'commscope[pandas]'``)."""
        pd = _optional("pandas")
        frame = pd.DataFrame(self.columns())
        frame.attrs.update({"world_size": self.world_size, "gpus_per_node": self.gpus_per_node,
                            "algorithm": self.algorithm, "view": self.view})
        return frame

    def to_polars(self) -> Any:
        """``src, dst, axis, bytes, intra_node`` as a polars DataFrame (needs polars)."""
        cols: dict[str, Any] = dict(self.columns())
        cols["axis"] = list(cols["axis"])
        return _optional("polars").DataFrame(cols)


def _coalesce(src: np.ndarray, dst: np.ndarray, axis: np.ndarray | None, nbytes: np.ndarray,
              world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sum bytes over equal (src, dst[, axis]) keys, keeping int64 exactness. (In place where it can: at 1M GPUs
    each entry-sized temporary is ~100 MB of fresh pages.)"""
    key = src * world
    key += dst
    if axis is not None:
        key *= len(AXES)
        key += axis
    if key.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, empty
    if np.all(key[1:] >= key[:-1]):  # a coalesced matrix is sorted by (src, dst, axis): no sort for its pairs
        key_sorted, sorted_bytes = key, nbytes
    else:
        order = np.argsort(key, kind="stable")
        key_sorted, sorted_bytes = key[order], nbytes[order]
        del order, key
    first = np.empty(key_sorted.size, dtype=bool)
    first[0] = True
    np.not_equal(key_sorted[1:], key_sorted[:-1], out=first[1:])
    starts = np.flatnonzero(first)
    del first
    summed = np.add.reduceat(sorted_bytes, starts)
    uniq = key_sorted[starts]
    if axis is not None:
        uniq, ax = np.divmod(uniq, len(AXES))
    else:
        ax = np.zeros_like(uniq)
    src_out, dst_out = np.divmod(uniq, world)
    return src_out, dst_out, ax, summed


def _pairs(src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, world: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    s, d, _, b = _coalesce(src, dst, None, nbytes, world)
    return s, d, b


def _node_key(groups: np.ndarray, gpus_per_node: int) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Label each group row by its node pattern: the first-appearance ordinal of each position's node.

    Rows with equal labels decompose identically under the hierarchical algorithm.
    """
    nodes = groups // gpus_per_node
    # ordinal[i] = number of distinct nodes among positions < first position holding nodes[i]
    n = nodes.shape[1]
    first_pos = np.argmax(nodes[:, :, None] == nodes[:, None, :], axis=2)  # (G, n): first j with node j == node i
    is_first = first_pos == np.arange(n)
    ordinals = np.cumsum(is_first, axis=1) - 1
    ordinal_of = np.take_along_axis(ordinals, first_pos, axis=1)
    uniq, labels = np.unique(ordinal_of, axis=0, return_inverse=True)
    return labels.reshape(-1), [tuple(int(x) for x in row) for row in uniq]


def build_traffic(opsets: Iterable[OpSet], world_size: int, gpus_per_node: int, *, algorithm: str = "ring") -> TrafficMatrix:
    """Decompose op sets (from a Workload, or measured ops grouped likewise) into a TrafficMatrix.

    Op sets that run on the same group array (every all-to-all of a stage's MoE layers, every TP collective of a
    stage) are merged at the level of positions in the group first, (position i, position j, bytes), and expanded
    to GPU flows once: a routed MoE iteration at 131,072 GPUs then holds one set of flows per stage, not one per
    layer and micro-batch (the matrix is what is kept, not the flows).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: valid: {', '.join(ALGORITHMS)}")
    srcs, dsts, axes, sizes = [], [], [], []
    # (id of the group array, axis) -> (groups, [position src], [position dst], [bytes])
    merged: dict[tuple[int, int], tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list[np.ndarray]]] = {}

    def add(groups: np.ndarray, axis: str, src_pos: np.ndarray, dst_pos: np.ndarray, flow_bytes: np.ndarray) -> None:
        entry = merged.setdefault((id(groups), _AXIS_CODE[axis]), (groups, [], [], []))
        entry[1].append(src_pos)
        entry[2].append(dst_pos)
        entry[3].append(np.asarray(flow_bytes, dtype=np.int64))

    for s in opsets:
        n = s.group_size
        if s.op in _NO_FLOW_OPS or n < 2 or s.num_groups == 0:
            continue
        elem = dtype_bytes(s.dtype)
        weight = s.count
        if s.op == "all_to_all" and s.splits is not None:
            mat = s.splits
            pos = np.arange(n)
            ps, pd = np.meshgrid(pos, pos, indexing="ij")
            mask = ps != pd
            src_pos, dst_pos = ps[mask], pd[mask]
            if mat.ndim == 2:
                add(s.groups, s.axis, src_pos, dst_pos, mat[mask].astype(np.int64) * weight)
                continue
            srcs.append(s.groups[:, src_pos].ravel())
            dsts.append(s.groups[:, dst_pos].ravel())
            sizes.append((mat[:, mask] * weight).ravel().astype(np.int64))
            axes.append(np.full(srcs[-1].size, _AXIS_CODE[s.axis], dtype=np.int64))
            continue
        if algorithm == "hierarchical" and s.op == "all_reduce":
            labels, keys = _node_key(s.groups, gpus_per_node)
            parts: list[tuple[np.ndarray, tuple[int, ...] | None]] = [(s.groups[labels == i], key)
                                                                       for i, key in enumerate(keys)]
        else:
            parts = [(s.groups, None)]
        for groups, key in parts:
            src_pos, dst_pos, flow_bytes = _pattern(s.op, algorithm, n, s.size_bytes, elem, key)
            keep = flow_bytes > 0
            add(groups, s.axis, src_pos[keep], dst_pos[keep], flow_bytes[keep] * weight)
    for (_, axis_code), (groups, ps_list, pd_list, b_list) in merged.items():
        n = groups.shape[1]
        pos_key = np.concatenate(ps_list) * n + np.concatenate(pd_list)
        uniq, inverse = np.unique(pos_key, return_inverse=True)
        pos_bytes = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(pos_bytes, inverse, np.concatenate(b_list))
        src_pos, dst_pos = uniq // n, uniq % n
        srcs.append(groups[:, src_pos].ravel())
        dsts.append(groups[:, dst_pos].ravel())
        sizes.append(np.broadcast_to(pos_bytes, (groups.shape[0], pos_bytes.size)).ravel())
        axes.append(np.full(srcs[-1].size, axis_code, dtype=np.int64))
    if srcs:
        src, dst, ax, nbytes = (np.concatenate(x) for x in (srcs, dsts, axes, sizes))
    else:
        src = dst = ax = nbytes = np.empty(0, dtype=np.int64)
    del srcs, dsts, axes, sizes
    src, dst, ax, nbytes = _coalesce(src, dst, ax, nbytes.astype(np.int64, copy=False), world_size)
    keep = nbytes > 0
    if not keep.all():
        src, dst, ax, nbytes = src[keep], dst[keep], ax[keep], nbytes[keep]
    return TrafficMatrix(world_size=world_size, gpus_per_node=gpus_per_node, src=src, dst=dst, axis=ax, bytes=nbytes,
                         algorithm=algorithm)


def traffic_of(workload: Workload, gpus_per_node: int, *, algorithm: str = "ring") -> TrafficMatrix:
    """The traffic matrix of a :class:`~commscope.pattern.workload.base.Workload`."""
    return build_traffic(workload.opsets, workload.world_size, gpus_per_node, algorithm=algorithm)


def root_first(op: str, group: tuple[int, ...], root: int | None) -> tuple[int, ...]:
    """``group`` turned to start at ``root`` (a global rank), its ring order kept: the order in which
    :func:`build_traffic` decomposes a rooted collective ``op``, whose root it takes to be position 0.
    ``root_first("broadcast", (0, 1, 2, 3), 2) == (2, 3, 0, 1)``. ``group`` as it is for an op without a root, and
    where ``root`` is None (not recorded) or no member of the group."""
    if op not in ROOTED_OPS or root is None or not group or group[0] == root or root not in group:
        return group
    i = group.index(root)
    return group[i:] + group[:i]


def flows_of_op(op: CommOp, *, algorithm: str = "ring", gpus_per_node: int = 8) -> list[tuple[int, int, int]]:
    """(src, dst, bytes) flows of a single CommOp (x its count), for inspection and tests; a rooted collective's
    from (or to) the root it recorded (:func:`root_first`)."""
    from commscope.pattern.workload.base import OpSet

    if op.op in _NO_FLOW_OPS:
        return []
    groups = np.array([root_first(op.op, op.group, op_root(op))], dtype=np.int64)
    opset = OpSet(op=op.op, axis=op.axis, name=op.name, size_bytes=op.size_bytes, dtype=op.dtype,
                  phase=op.phase or "fwd", groups=groups, repeat=op.count)
    tm = build_traffic([opset], max(op.group) + 1, gpus_per_node, algorithm=algorithm)
    return [(s, d, b) for s, d, _, b in tm.triplets()]


def _optional(module: str) -> Any:
    """An optional extra's module (pandas, polars), imported when asked for; one clear line when it is missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{module} is not installed: pip install {module} (or commscope[{module}])") from None
