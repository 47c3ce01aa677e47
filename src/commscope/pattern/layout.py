"""Rank <-> parallel coordinates, and the process groups of every axis.

This is Megatron-core's ``RankGenerator`` (megatron/core/parallel_state.py) in array form. With the
order string ``tp-cp-ep-dp-pp`` (innermost first) the global rank of coordinates (t, c, d, p) is

    (1)  rank = t + T * (c + C * (d + D * p))

and the group of a set of axes is every rank that differs from another only in those axes, listed with
the innermost axis varying fastest. Worked example, (tp, pp, dp) = (2, 4, 4) on 32 GPUs: TP groups are
(0, 1), (2, 3), ...; DP groups (0, 2, 4, 6), (1, 3, 5, 7), ...; PP groups (0, 8, 16, 24), ...

Expert parallelism is folded inside data x context parallelism, as Megatron-core's
``expert_decoder_rank_generator`` does: the same ranks are read a second time with sizes
(tp, ep, expert_dp = dp x cp / ep, pp) and cp = 1, so

    (2)  rank = t + T * (e + E * (x + X * p))

EP groups are consecutive blocks of a dp x cp slice; expert-data-parallel groups stride over them.
The physical GPU of global rank r is r itself (node r // gpus_per_node): the order string is the mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from commscope.spec.parallel import ParallelSpec

#: Axes whose groups a Layout returns. ``dp-cp`` is the gradient-reduction group of dense parameters;
#: ``expert-dp`` that of expert parameters; ``emb`` the first/last-stage embedding-sync pairs.
GROUP_KINDS = ("tp", "pp", "dp", "cp", "dp-cp", "ep", "expert-dp", "emb")


def _groups(sizes: dict[str, int], order: list[str], members: tuple[str, ...]) -> np.ndarray:
    """Groups of ``members`` for a rank space with axis ``sizes`` laid out by ``order`` (innermost first).

    Returns an int array (num_groups, group_size) with rank ids; row order and in-row order follow
    Megatron: the innermost axis varies fastest.
    """
    outer_first = list(reversed(order))
    world = math.prod(sizes[a] for a in order)
    grid = np.arange(world, dtype=np.int64).reshape([sizes[a] for a in outer_first])
    fixed = [i for i, a in enumerate(outer_first) if a not in members]
    varying = [i for i, a in enumerate(outer_first) if a in members]
    group_size = math.prod(sizes[outer_first[i]] for i in varying)
    return grid.transpose(fixed + varying).reshape(-1, group_size)


@dataclass(frozen=True, slots=True)
class Layout:
    """The mapping of one ParallelSpec onto ranks 0..world_size-1."""

    parallel: ParallelSpec

    @property
    def world_size(self) -> int:
        return self.parallel.world_size

    @property
    def _order(self) -> list[str]:
        return self.parallel.order.split("-")

    @property
    def _dense_sizes(self) -> dict[str, int]:
        p = self.parallel
        return {"tp": p.tp, "cp": p.cp, "ep": 1, "dp": p.dp, "pp": p.pp}

    @property
    def _expert_sizes(self) -> dict[str, int]:
        p = self.parallel
        return {"tp": p.tp, "cp": 1, "ep": p.ep, "dp": p.expert_dp, "pp": p.pp}

    def groups(self, kind: str) -> np.ndarray:
        """Process groups of ``kind`` (one of GROUP_KINDS) as an int64 array (num_groups, group_size).

        Every rank is in exactly one group of each kind, except ``emb``, which holds only the first and
        last pipeline stage (and is empty when pp == 1).
        """
        if kind not in GROUP_KINDS:
            raise ValueError(f"unknown group kind {kind!r}; valid: {', '.join(GROUP_KINDS)}")
        groups = _build_groups(self, kind)
        groups.setflags(write=False)
        return groups

    def first_stage_groups(self, kind: str) -> np.ndarray:
        """The groups of ``kind`` (an axis other than pp) on pipeline stage 0, in the order :meth:`groups` lists them.
        With pp the outermost axis of the order they are the layout's groups with pp = 1, and those of stage s are
        these plus s x :attr:`stage_stride`."""
        if kind in ("pp", "emb") or kind not in GROUP_KINDS:
            raise ValueError(f"first_stage_groups: {kind!r} is not a group kind within one stage")
        if self._order[-1] != "pp":
            groups = self.groups(kind)
            first: np.ndarray = groups[groups[:, 0] // self.stage_stride % self.parallel.pp == 0]
            return first
        members = {"dp-cp": ("dp", "cp"), "expert-dp": ("dp",)}.get(kind, (kind,))
        sizes = self._expert_sizes if kind in ("ep", "expert-dp") else self._dense_sizes
        return _groups({**sizes, "pp": 1}, self._order, members)

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank``: tp, cp, dp, pp (dense) and ep, expert_dp (expert mesh)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank} is outside 0..{self.world_size - 1}")
        dense = self.coordinate_arrays()
        return {k: int(v[rank]) for k, v in dense.items()}

    def coordinate_arrays(self) -> dict[str, np.ndarray]:
        """Per-rank coordinate arrays, each of shape (world_size,)."""
        return _coords(self)

    def stage_of(self) -> np.ndarray:
        """Pipeline stage of every rank, shape (world_size,): equation (1) read backwards for pp alone."""
        return (np.arange(self.world_size, dtype=np.int64) // self.stage_stride) % self.parallel.pp

    @property
    def stage_stride(self) -> int:
        """Ranks between consecutive pipeline stages: the product of the sizes of the axes inside pp in the order
        (rank r is on stage (r // stage_stride) mod pp)."""
        sizes, order = self._dense_sizes, self._order
        return math.prod(sizes[a] for a in order[:order.index("pp")])

    def order_string(self) -> str:
        return self.parallel.order


def _coords(layout: Layout) -> dict[str, np.ndarray]:
    """Read equation (1) and (2) backwards: coordinate = (rank // stride) % size."""
    ranks = np.arange(layout.world_size, dtype=np.int64)
    out: dict[str, np.ndarray] = {}
    for sizes, wanted in ((layout._dense_sizes, {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp"}),
                          (layout._expert_sizes, {"ep": "ep", "dp": "expert_dp"})):
        stride = 1
        for axis in layout._order:
            if axis in wanted:
                out[wanted[axis]] = (ranks // stride) % sizes[axis]
            stride *= sizes[axis]
    return out


def _build_groups(layout: Layout, kind: str) -> np.ndarray:
    order = layout._order
    if kind in ("tp", "pp", "dp", "cp"):
        return _groups(layout._dense_sizes, order, (kind,))
    if kind == "dp-cp":
        return _groups(layout._dense_sizes, order, ("dp", "cp"))
    if kind == "ep":
        return _groups(layout._expert_sizes, order, ("ep",))
    if kind == "expert-dp":
        return _groups(layout._expert_sizes, order, ("dp",))
    # emb: first and last stage of every pipeline
    pp_groups = _groups(layout._dense_sizes, order, ("pp",))
    if layout.parallel.pp == 1:
        return np.empty((0, 2), dtype=np.int64)
    return pp_groups[:, [0, -1]]


def rank_order_table(layout: Layout) -> list[dict[str, int]]:
    """One row per rank with its coordinates, for printing and files."""
    arrays = layout.coordinate_arrays()
    return [{"rank": r, **{k: int(v[r]) for k, v in arrays.items()}} for r in range(layout.world_size)]
