"""Piecewise straight lines through one curve of times against sizes, least squares on the relative error.

:func:`fit_curve` returns the pieces of one (op, group size) curve: each piece a line ``t = alpha + beta S`` with
alpha, beta >= 0, fitted with weights 1/t, the fewest pieces (up to ``max_pieces``) that miss no point by more
than the tolerance. Up to :data:`EXHAUSTIVE_SIZES` sizes every split is tried (dynamic programming); above it the
breaks are searched on a grid and then moved to their best place, from prefix sums. Only numpy; the criterion is
explained in :mod:`commscope.measure.bench.fit`, which turns the pieces into a fitted model.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence

import numpy as np

__all__ = ["EXHAUSTIVE_SIZES", "fit_curve"]


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
    """(alpha, beta, sse) minimising sum(((alpha + beta x) / y - 1)^2) with alpha, beta >= 0."""
    A = np.stack([1.0 / y, x / y], axis=1)  # (k, 2): residual_i = A_i . (alpha, beta) - 1
    ones = np.ones_like(y)
    cands = []
    sol, *_ = np.linalg.lstsq(A, ones, rcond=None)
    if sol[0] >= 0 and sol[1] >= 0:
        cands.append((float(sol[0]), float(sol[1])))
    c0 = A[:, 0] @ A[:, 0]
    cands.append((float(A[:, 0] @ ones / c0), 0.0))  # beta = 0: constant time
    c1 = A[:, 1] @ A[:, 1]
    cands.append((0.0, float(A[:, 1] @ ones / c1)))  # alpha = 0: through the origin
    best = None
    for a, b in cands:
        sse = float(np.sum((A @ np.array([a, b]) - 1.0) ** 2))
        if best is None or sse < best[2] - 1e-15:
            best = (a, b, sse)
    assert best is not None
    return best


#: Up to this many distinct sizes a curve's pieces may break at any size (every split is tried); beyond it, at
#: this many evenly spread sizes (a sweep of nccl-tests' -f 1 -i 1M, or a million rows of random sizes, would
#: otherwise cost k^2 lines and k^3 splits: a thousand sizes took minutes). Real sweeps (-f 2) have ~30 sizes.
EXHAUSTIVE_SIZES = 64


def _line_from_sums(s00: float, s01: float, s11: float, t0: float, t1: float, n: int) -> tuple[float, float, float]:
    """:func:`_line` from the sums of its normal equations (1/y^2, x/y^2, x^2/y^2, 1/y, x/y over the points, and
    their number): the same three candidates, and the sum of squares expanded from the sums."""
    def sse(a: float, b: float) -> float:
        return max(0.0, a * a * s00 + 2 * a * b * s01 + b * b * s11 - 2 * a * t0 - 2 * b * t1 + n)

    cands = []
    det = s00 * s11 - s01 * s01
    if det > 0:
        a, b = (t0 * s11 - t1 * s01) / det, (t1 * s00 - t0 * s01) / det
        if a >= 0 and b >= 0:
            cands.append((a, b))
    cands.append((t0 / s00, 0.0))  # beta = 0: constant time
    cands.append((0.0, t1 / s11))  # alpha = 0: through the origin
    return min(((a, b, sse(a, b)) for a, b in cands), key=lambda c: c[2])


def _sse_of_sums(s00: np.ndarray, s01: np.ndarray, s11: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                 n: np.ndarray) -> np.ndarray:
    """:func:`_line_from_sums`' sum of squares for arrays of pieces at once."""
    def sse(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, a * a * s00 + 2 * a * b * s01 + b * b * s11 - 2 * a * t0 - 2 * b * t1 + n)

    with np.errstate(divide="ignore", invalid="ignore"):
        det = s00 * s11 - s01 * s01
        a, b = (t0 * s11 - t1 * s01) / det, (t1 * s00 - t0 * s01) / det
        both = np.where((det > 0) & (a >= 0) & (b >= 0), sse(a, b), np.inf)
        zero = np.zeros_like(s00)
        out: np.ndarray = np.minimum(both, np.minimum(sse(t0 / s00, zero), sse(zero, t1 / s11)))
    return out


def _fewest_within(candidates: Iterable[list[tuple[int, int, float, float]]], x: np.ndarray, y: np.ndarray,
                   tolerance: float) -> list[tuple[int, int, float, float]]:
    """The first of ``candidates`` (fits of 1, 2, ... pieces) that misses no point by more than ``tolerance``,
    else the one that misses its worst point least."""
    best = None
    for segs in candidates:
        worst = max(float(np.max(np.abs((a + b * x[s:e + 1]) / y[s:e + 1] - 1))) for s, e, a, b in segs)
        if best is None or worst < best[0] - 1e-12:
            best = (worst, segs)
        if worst <= tolerance:
            return segs
    assert best is not None
    return best[1]


def _grid_pieces(x: np.ndarray, y: np.ndarray, *, max_pieces: int,
                 min_points: int) -> Iterator[list[tuple[int, int, float, float]]]:
    """:func:`fit_curve` for a curve of more than :data:`EXHAUSTIVE_SIZES` sizes: the pieces are chosen breaking
    only at :data:`EXHAUSTIVE_SIZES` evenly spread sizes, then each break is moved to the size between its
    neighbours that fits best (all of them tried at once); each piece's line from prefix sums, O(1) a piece. Yields
    the fit of 1, 2, ... ``max_pieces`` pieces."""
    k = len(x)
    inv = 1.0 / y
    cols = [inv * inv, x * inv * inv, (x * inv) ** 2, inv, x * inv]
    prefix = [np.concatenate([[0.0], np.cumsum(c)]) for c in cols]

    def line(s: int, e: int) -> tuple[float, float, float]:  # points s..e
        s00, s01, s11, t0, t1 = (float(p[e + 1] - p[s]) for p in prefix)
        return _line_from_sums(s00, s01, s11, t0, t1, e - s + 1)

    grid = sorted(set(np.linspace(0, k, EXHAUSTIVE_SIZES + 1).round().astype(int).tolist()))  # piece starts, and k
    g = len(grid) - 1
    m = max(2, min_points)
    for pieces in range(1, max(1, max_pieces) + 1):
        # dp[p][j]: least sse covering points 0..grid[j]-1 with p pieces, each from one grid position to another
        dp = [[math.inf] * (g + 1) for _ in range(pieces + 1)]
        back = [[-1] * (g + 1) for _ in range(pieces + 1)]
        dp[0][0] = 0.0
        for p in range(1, pieces + 1):
            for j in range(1, g + 1):
                for i in range(j):
                    if dp[p - 1][i] < math.inf and (pieces == 1 or grid[j] - grid[i] >= m):
                        v = dp[p - 1][i] + line(grid[i], grid[j] - 1)[2]
                        if v < dp[p][j]:
                            dp[p][j], back[p][j] = v, i
        if dp[pieces][g] == math.inf:
            break
        starts, j = [], g
        for p in range(pieces, 0, -1):
            starts.append(grid[back[p][j]])
            j = back[p][j]
        starts = sorted(starts) + [k]
        for _ in range(3):  # each break to its best place between its neighbours, a few rounds
            for i in range(1, len(starts) - 1):
                lo, hi = starts[i - 1] + m, starts[i + 1] - m
                if hi <= lo:
                    continue
                c = np.arange(lo, hi + 1)
                l00, l01, l11, l0, l1 = (p[c] - p[starts[i - 1]] for p in prefix)
                r00, r01, r11, r0, r1 = (p[starts[i + 1]] - p[c] for p in prefix)
                cost = (_sse_of_sums(l00, l01, l11, l0, l1, c - starts[i - 1])
                        + _sse_of_sums(r00, r01, r11, r0, r1, starts[i + 1] - c))
                starts[i] = int(c[int(np.argmin(cost))])
        yield [(s, e - 1, *line(s, e - 1)[:2]) for s, e in itertools.pairwise(starts)]


def fit_curve(sizes: Sequence[float], times: Sequence[float], *, tolerance: float = 0.1, max_pieces: int = 3,
              min_points: int = 3, plausible: Callable[[float], bool] | None = None) -> list[tuple[int, int, float, float]]:
    """Piecewise fit of one curve: ``[(first_index, last_index, alpha_s, beta_s_per_byte), ...]``.

    ``sizes`` ascending and distinct. With more than one piece, each covers at least ``min_points`` sizes
    (two points always fit a line exactly, so two-point pieces would chase noise) and, given ``plausible``, has
    a slope it accepts (a bus bandwidth some link could have); one piece over every size is always a candidate.
    See the module docstring for the criterion. A curve of more than :data:`EXHAUSTIVE_SIZES` sizes is split as
    :func:`_grid_pieces` says.
    """
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if len(x) < 2:
        raise ValueError("need at least 2 sizes")
    if len(x) > EXHAUSTIVE_SIZES:
        pieces: Iterator[list[tuple[int, int, float, float]]] = (
            segs for segs in _grid_pieces(x, y, max_pieces=max_pieces, min_points=min_points)
            if plausible is None or len(segs) == 1 or all(plausible(b) for *_, b in segs))
    else:
        pieces = _exhaustive_pieces(x, y, max_pieces=max_pieces, min_points=min_points, plausible=plausible)
    return _fewest_within(pieces, x, y, tolerance)


def _exhaustive_pieces(x: np.ndarray, y: np.ndarray, *, max_pieces: int, min_points: int,
                       plausible: Callable[[float], bool] | None = None) -> Iterator[list[tuple[int, int, float, float]]]:
    """The least-squares fits of 1, 2, ... ``max_pieces`` pieces, every split tried (dynamic programming); with more
    than one piece, only pieces whose slope ``plausible`` accepts."""
    k = len(x)
    cost: dict[tuple[int, int], tuple[float, float, float]] = {}
    split_cost: dict[tuple[int, int], float] = {}  # a piece's error when it is one of several: inf if implausible
    for i in range(k):
        for j in range(i + 1, k):
            cost[i, j] = _line(x[i:j + 1], y[i:j + 1])
            split_cost[i, j] = cost[i, j][2] if plausible is None or plausible(cost[i, j][1]) else math.inf
    m = max(2, min_points)
    for pieces in range(1, max(1, max_pieces) + 1):
        if pieces > 1 and m * pieces > k:
            break
        # dp[p][j]: least sse covering points 0..j with p pieces; back[p][j]: start of the last piece
        dp = [[math.inf] * k for _ in range(pieces + 1)]
        back = [[-1] * k for _ in range(pieces + 1)]
        for j in range(1, k):
            dp[1][j] = cost[0, j][2] if pieces == 1 else split_cost[0, j]
            back[1][j] = 0
        for p in range(2, pieces + 1):
            for j in range(m * p - 1, k):
                for s in range(m * (p - 1), j - m + 2):  # last piece is s..j (>= m points)
                    v = dp[p - 1][s - 1] + split_cost[s, j]
                    if v < dp[p][j]:
                        dp[p][j], back[p][j] = v, s
        if math.isinf(dp[pieces][k - 1]):
            continue  # no split into this many plausible pieces
        segs, j = [], k - 1
        for p in range(pieces, 0, -1):
            s = back[p][j]
            a, b, _ = cost[s, j]
            segs.append((s, j, a, b))
            j = s - 1
        segs.reverse()
        yield segs
