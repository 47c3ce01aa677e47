"""Expert counts -> the all-to-all's rank-to-rank token matrix: placement, capacity and token dropping.

Orientation: ``tokens[..., i, j]`` is the number of tokens EP rank ``i`` (row, sender) dispatches to EP rank
``j`` (column, the rank hosting the experts): the sum of ``counts[..., i, x]`` over the experts x that
``placement`` puts on rank j. The diagonal holds tokens whose expert lives on their own rank; they never
touch the network. The combine all-to-all sends the same tokens back, the transposed matrix.

Capacity and token dropping (Megatron-core's ``--moe-expert-capacity-factor`` [megatron-core], GShard's
group-local expert capacity [gshard-2020]). Each source rank applies the capacity to its OWN tokens, in its
router, before the dispatch; dropped assignments are never sent:

    C_r = ceil(capacity_factor x A_r / E)        A_r = sum_x counts[r, x] = T_r x top_k assignments of rank r
    kept[r, x] = min(counts[r, x], C_r),         dropped[r, x] = counts[r, x] - kept[r, x]

This is Megatron-core's ``topk_softmax_with_capacity``, which calls ``get_capacity(num_tokens * topk,
num_experts, capacity_factor)`` on the rank's local tokens (and drops by probability or position; which
tokens go does not change how many). Worked example: T = 4096 tokens, top_k 2, E = 8 experts, capacity
factor 1.0 gives C = ceil(1.0 x 8192 / 8) = 1024; an expert chosen by 1,500 of the rank's tokens keeps 1,024
and 476 are dropped. Capacity on the receiving side (per expert over all ranks) is not modelled.

No expert is chosen more than A_r times by rank r, so a factor of E or more keeps every assignment: the
capacity is computed with the factor clipped at E (C_r <= A_r), and a factor of 1e300 drops nothing instead of
overflowing the integer cast. A factor that is not a finite number > 0 is refused (:func:`check_capacity_factor`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from commscope.errors import ConfigError

if TYPE_CHECKING:
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec


def routed_tokens_per_rank(model: ModelSpec, parallel: ParallelSpec) -> int:
    """Tokens each EP rank routes per micro-batch and MoE layer: b s / c, divided by t with sequence parallelism."""
    tokens = parallel.micro_batch_size * model.seq_len // parallel.cp
    return tokens // parallel.tp if parallel.sequence_parallel and parallel.tp > 1 else tokens


def balanced_counts(shape: tuple[int, ...], ep: int, num_experts: int, tokens: int, top_k: int) -> np.ndarray:
    """Counts of shape ``shape + (ep, num_experts)`` for the exact even split: T top_k / E per expert; the
    remainder goes to consecutive experts, each rank continuing where the previous one stopped, so that experts'
    totals differ by at most one per rank cycle."""
    base, rest = divmod(tokens * top_k, num_experts)
    x = np.arange(num_experts)
    r = np.arange(ep)[:, None]
    row = base + ((x[None, :] - r * rest) % num_experts < rest)  # (ep, E): rank r's extras follow rank r-1's
    return np.ascontiguousarray(np.broadcast_to(row, shape + (ep, num_experts)), dtype=np.int64)


def balanced_routing(tokens: int, top_k: int, ep: int) -> np.ndarray:
    """(ep, ep) token counts when every rank spreads tokens x top_k evenly over the EP ranks
    (the first ``tokens x top_k mod ep`` ranks get one more)."""
    total = tokens * top_k
    base, rest = divmod(total, ep)
    row = np.array([base + (1 if j < rest else 0) for j in range(ep)], dtype=np.int64)
    return np.tile(row, (ep, 1))


def check_capacity_factor(capacity_factor: Any, field: str = "capacity_factor") -> None:
    """Refuse a capacity factor that is not a finite number > 0 (``None``, no dropping, passes)."""
    if capacity_factor is None:
        return
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float, np.integer, np.floating)) \
            or not (math.isfinite(capacity_factor) and capacity_factor > 0):
        raise ConfigError(field, capacity_factor, "must be a finite number > 0, e.g. 1.0 or 1.25 (leave it out: no "
                                                  "token is dropped)")


def expert_capacity(assignments: np.ndarray | int, num_experts: int, capacity_factor: float) -> np.ndarray:
    """Tokens one expert accepts from a rank that made ``assignments`` = T x top_k assignments:
    ``ceil(capacity_factor x assignments / num_experts)`` (Megatron-core's get_capacity), at most ``assignments``
    (a factor of ``num_experts`` or more keeps every assignment; see the module docstring)."""
    check_capacity_factor(capacity_factor)
    a = np.asarray(assignments, dtype=np.int64)
    factor = min(float(capacity_factor), float(num_experts))  # clipped: the float stays <= A (1 + eps), no overflow
    return np.minimum(np.ceil(a / num_experts * factor).astype(np.int64), a)


def apply_capacity(counts: np.ndarray, capacity_factor: float | None) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, dropped)`` counts of shape (..., experts) after each source rank's capacity (see the module
    docstring); ``capacity_factor=None`` drops nothing."""
    counts = np.asarray(counts, dtype=np.int64)
    if capacity_factor is None:
        return counts, np.zeros_like(counts)
    cap = expert_capacity(counts.sum(axis=-1, keepdims=True), counts.shape[-1], capacity_factor)
    kept = np.minimum(counts, cap)
    return kept, counts - kept


def rank_tokens(counts: np.ndarray, placement: np.ndarray, ep: int) -> np.ndarray:
    """(..., experts) token counts -> (..., ep): the tokens going to each EP rank under ``placement``.

    Applied to counts of shape (..., ep, experts) this is the all-to-all's (..., ep, ep) matrix
    ``tokens[..., i, j]`` (row i sends to column j). Contiguous equal blocks (the default placement) take a
    reshape and a sum; any other placement a one-hot product in float64 (exact below 2**53 tokens).
    """
    counts = np.asarray(counts, dtype=np.int64)
    placement = np.asarray(placement, dtype=np.int64)
    experts = counts.shape[-1]
    if experts % ep == 0 and np.array_equal(placement, np.arange(experts) // (experts // ep)):
        return counts.reshape(*counts.shape[:-1], ep, experts // ep).sum(axis=-1)
    onehot = np.zeros((experts, ep), dtype=np.float64)
    onehot[np.arange(experts), placement] = 1.0
    return np.rint(counts.astype(np.float64) @ onehot).astype(np.int64)


__all__ = ["apply_capacity", "balanced_counts", "balanced_routing", "check_capacity_factor", "expert_capacity",
           "rank_tokens",
           "routed_tokens_per_rank"]
