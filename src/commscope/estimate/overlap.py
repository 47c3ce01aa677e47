"""What the frameworks' overlaps hide: the notes that name them, the two bucket recurrences both estimate paths
share, and the least hidden time an estimate reports.

Gradient buckets reduced during the last backward pass as they fill (``--overlap-grad-reduce``, PyTorch DDP and
FSDP2) end some time after that backward: :func:`_overlapped_buckets`. Parameter buckets all-gathered ahead of the
next forward (``--overlap-param-gather``) delay it when one arrives late for its layers: :func:`_late_gathers`.
Both work elementwise on arrays, so that the op-by-op path (:mod:`commscope.estimate.op_by_op`, one stage at a time)
and the closed form (:mod:`commscope.estimate.closed_form`, configurations x stages) run the same arithmetic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: Notes of the overlaps a job turned on, in the order they are reported: ``tp_comm_overlap``, ``overlap_p2p_comm``
#: (interleaved schedule only), ``overlap_grad_reduce``, ``overlap_param_gather``.
OVERLAP_NOTES = (
    "TP communication overlapped with the linear GEMMs of the same pass (--tp-comm-overlap)",
    ("pipeline sends/receives overlapped with the other model chunks' compute (interleaved schedule, "
     "--overlap-p2p-communication)"),
    "DP gradient buckets reduced during the last backward pass as they fill (--overlap-grad-reduce)",
    "parameter all-gathers overlapped with the next forward pass, bucket by bucket (--overlap-param-gather)",
)
#: Hidden time below a nanosecond is not reported: where nothing was hidden, what is left of the difference of
#: sums of op times (all - exposed) is ~1e-19 s of rounding, and estimate_many sums in another order.
HIDDEN_MIN_S = 1e-9


def _overlapped_buckets(times: Sequence[Any], window: Any) -> Any:
    """Time past the end of a backward pass of ``window`` seconds until gradient buckets ``times`` are reduced.

    Buckets are ready in order, bucket i when the share of backward that produced buckets 0..i has run
    (buckets hold equal parameters per second of backward); reductions run one at a time on their own stream.
    Elementwise on arrays (:mod:`commscope.estimate.many` passes one entry per configuration and stage; a bucket
    of 0 s changes nothing).
    """
    total = sum(times)
    done = ready_share = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in times:
            ready_share = ready_share + t / total
            done = np.maximum(done, window * ready_share) + t
        return np.where(total > 0, np.maximum(0.0, done - window), 0.0)


def _late_gathers(times: Sequence[Any], window: Any) -> Any:
    """Delay of a forward pass of ``window`` seconds whose parameter buckets (all-gathered one at a time from its
    start, in layer order) must each arrive before the forward reaches their layers (elementwise on arrays)."""
    total = sum(times)
    done = needed_share = late = 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in times:
            done = done + t
            late = np.maximum(late, done - window * needed_share)
            needed_share = needed_share + t / total
        return np.where(total > 0, np.maximum(0.0, late), 0.0)

