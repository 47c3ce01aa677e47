"""MoE routing: the trace format, synthetic routers, expert counts -> rank-to-rank tokens, dynamics metrics.

The seed talk's second finding [seed-talk]: expert-parallel all-to-all traffic follows the router, changes
from iteration to iteration, yet is semi-predictable and grows more uniform as training goes on. This
package holds routing as data (:class:`RoutingTrace`), makes synthetic routings (:func:`generate`), turns
expert counts into the all-to-all's token matrix (:func:`rank_tokens`, :func:`apply_capacity`) and measures
the dynamics (:func:`routing_metrics`). Pictures are in :mod:`commscope.moe.plots` (extra ``plots``).
Only numpy and the standard library are imported here.
"""

from __future__ import annotations

from commscope.moe.generators import GENERATORS, RoutingSpec, generate, parse_routing, routing_for_job
from commscope.moe.metrics import RoutingMetrics, routing_metrics
from commscope.moe.routing import apply_capacity, balanced_routing, expert_capacity, rank_tokens
from commscope.moe.trace import RoutingTrace, contiguous_placement, load_trace, save_trace, write_rank_trace

__all__ = [
    "GENERATORS",
    "RoutingMetrics",
    "RoutingSpec",
    "RoutingTrace",
    "apply_capacity",
    "balanced_routing",
    "contiguous_placement",
    "expert_capacity",
    "generate",
    "load_trace",
    "parse_routing",
    "rank_tokens",
    "routing_for_job",
    "routing_metrics",
    "save_trace",
    "write_rank_trace",
]
