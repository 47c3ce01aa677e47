"""Synthetic routers: seeded, deterministic generators of a :class:`~commscope.moe.trace.RoutingTrace`.

Each generator gives, per iteration and MoE layer, the probability ``pi[x]`` that a token picks expert x
among its top-k (``sum_x pi[x] = top_k``, ``pi[x] <= 1``); every (micro-batch, layer, source rank) then
routes its T tokens by multinomial sampling of T x top_k assignments with probabilities ``pi / top_k``,
with no expert given more than T (a token picks an expert at most once). ``balanced`` is the exact even split.

==========================  ========================================================================================
spec                        routing
==========================  ========================================================================================
``uniform``                 every expert equally likely; only sampling noise
``balanced``                exact even split, T x top_k / E per expert (the assumption of every other tool)
``zipf:<s>``                expert popularity ~ 1 / rank^s (default s = 1.2), a random expert order per layer
``hot:<x>[:<f>]``           expert x is picked by a fraction f of the tokens (default 0.5), the others uniform
``drift[:<period>]``        a hot spot (half the traffic, a few experts wide) moving one expert every ``period``
                            iterations (default 10), from a random start per layer
``settle[:<tau>[:<s>]]``    learned-then-settling: Zipf with exponent s e^(-it / tau) (default s = 1.5, tau = 50
                            iterations), skewed early and more uniform as training goes on [seed-talk]
``fit:<trace>``             fitted to a recorded trace (:mod:`commscope.moe.fit`): its experts' popularity and
                            trend, their switching (AR(1) persistence and innovation) and the spread between
                            source ranks, replayed for any EP size, tokens per rank, experts and layers
                            (:func:`generate_fitted`; through :func:`routing_for_job`, which knows the job)
==========================  ========================================================================================

Determinism: iteration ``it`` draws from ``numpy.random.default_rng([seed, it])`` and the per-layer expert
orders from ``default_rng([seed, 2**32])``, so the same seed gives the same trace, and iteration ``it`` is
the same whether it is generated alone (``first_iteration=it``) or inside a longer run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from commscope.errors import ConfigError
from commscope.moe.fit import FittedRouting, carried_popularity, fit_routing
from commscope.moe.routing import balanced_counts, routed_tokens_per_rank
from commscope.moe.trace import RoutingTrace, load_trace

Kind = Literal["uniform", "balanced", "zipf", "hot", "drift", "settle"]

#: name -> the spec's syntax, for help texts and error messages.
GENERATORS: dict[str, str] = {
    "uniform": "uniform",
    "balanced": "balanced",
    "zipf": "zipf:<s>",
    "hot": "hot:<expert>[:<fraction>]",
    "drift": "drift[:<period>]",
    "settle": "settle[:<tau>[:<s>]]",
}
#: The spelling of a routing fitted to a recorded trace (:func:`generate_fitted`, through :func:`routing_for_job`).
FITTED = "fit:<trace>"
#: Largest trace (elements of counts) a generator builds: 10^8 int64 = 800 MB.
MAX_ELEMENTS = 100_000_000
_DRIFT_SHARE = 0.5  # share of the traffic in the drifting hot spot


@dataclass(frozen=True, slots=True, kw_only=True)
class RoutingSpec:
    """A synthetic routing, as parsed from ``zipf:1.2`` and the like (see the module docstring)."""

    kind: Kind
    zipf_exponent: float = 1.2
    """``zipf``: the exponent s of popularity ~ 1 / rank^s; ``settle``: the starting exponent."""
    hot_expert: int = 0
    """``hot``: the index of the hot expert."""
    hot_fraction: float = 0.5
    """``hot``: the fraction of tokens that pick the hot expert among their top-k, in (0, 1]."""
    drift_period: int = 10
    """``drift``: iterations per one-expert step of the hot spot."""
    settle_iterations: float = 50.0
    """``settle``: the time constant tau (iterations) of the exponent's decay."""

    @property
    def text(self) -> str:
        """The spec string that parses back to this spec."""
        if self.kind == "zipf":
            return f"zipf:{self.zipf_exponent:g}"
        if self.kind == "hot":
            return f"hot:{self.hot_expert}:{self.hot_fraction:g}"
        if self.kind == "drift":
            return f"drift:{self.drift_period}"
        if self.kind == "settle":
            return f"settle:{self.settle_iterations:g}:{self.zipf_exponent:g}"
        return self.kind


def _valid_text() -> str:
    return ("valid: " + ", ".join(GENERATORS.values()) + ", or a routing trace (.npz file or directory), or "
            f"{FITTED} (a routing fitted to a trace)")


def parse_routing(text: str) -> RoutingSpec:
    """``"zipf:1.2"`` -> RoutingSpec(kind="zipf", zipf_exponent=1.2); ConfigError naming the valid choices."""
    name, *params = str(text).strip().split(":")
    name = name.lower()
    if name == "fit":
        raise ConfigError("routing", text, "fit:<trace> is fitted to a recorded trace for a job: give it where a job "
                                           "is known (commscope moe simulate, traffic --routing; routing_for_job)")
    if name not in GENERATORS:
        raise ConfigError("routing", text, _valid_text())
    most = {"uniform": 0, "balanced": 0, "zipf": 1, "hot": 2, "drift": 1, "settle": 2}[name]
    if len(params) > most:
        raise ConfigError("routing", text, f"{name} takes at most {most} parameter(s): {GENERATORS[name]}")

    def number(i: int, kind: type, what: str, ok, rule: str):
        try:
            value = kind(params[i])
        except ValueError:
            raise ConfigError("routing", text, f"{what} must be {rule}: {GENERATORS[name]}") from None
        if not ok(value):
            raise ConfigError("routing", text, f"{what} must be {rule}: {GENERATORS[name]}")
        return value

    positive = (lambda v: np.isfinite(v) and v > 0)
    if name == "zipf" and params:
        return RoutingSpec(kind="zipf", zipf_exponent=number(0, float, "the exponent s", positive, "a number > 0"))
    if name == "hot":
        expert = number(0, int, "the expert", lambda v: v >= 0, "an expert index >= 0") if params else 0
        fraction = (number(1, float, "the fraction", lambda v: np.isfinite(v) and 0 < v <= 1, "in (0, 1]")
                    if len(params) > 1 else 0.5)
        return RoutingSpec(kind="hot", hot_expert=expert, hot_fraction=fraction)
    if name == "drift" and params:
        return RoutingSpec(kind="drift", drift_period=number(0, int, "the period", lambda v: v >= 1, "an integer >= 1"))
    if name == "settle" and params:
        tau = number(0, float, "tau", positive, "a number of iterations > 0")
        s = number(1, float, "the exponent s", positive, "a number > 0") if len(params) > 1 else 1.5
        return RoutingSpec(kind="settle", settle_iterations=tau, zipf_exponent=s)
    if name == "settle":
        return RoutingSpec(kind="settle", zipf_exponent=1.5)
    return RoutingSpec(kind=name)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------- probabilities


def inclusion_probabilities(popularity: np.ndarray, top_k: int) -> np.ndarray:
    """(..., E) popularity (any positive scale) -> probabilities ``pi`` that a token picks each expert among
    its top-k: ``pi = min(1, c x popularity)`` with c chosen so that ``sum pi = top_k`` (water-filling: an
    expert cannot take a token twice, so the most popular ones saturate at 1 and the rest share the remainder)."""
    p = np.asarray(popularity, dtype=np.float64)
    p = p / p.sum(axis=-1, keepdims=True)
    sat = np.zeros(p.shape, dtype=bool)
    pi = top_k * p
    for _ in range(top_k + 1):  # every round saturates one more expert; at most top_k can saturate
        free = np.where(sat, 0.0, p)
        left = top_k - sat.sum(axis=-1, keepdims=True)
        mass = free.sum(axis=-1, keepdims=True)
        pi = np.where(sat, 1.0, left * np.divide(free, mass, out=np.zeros_like(free), where=mass > 0))
        over = pi > 1.0 + 1e-12
        if not over.any():
            break
        sat |= over
    return np.minimum(pi, 1.0)


def _popularity(spec: RoutingSpec, it: int, ranks: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """(L, E) popularity at iteration ``it``; ``ranks[l, x]``: popularity rank of expert x in layer l."""
    L, E = ranks.shape
    if spec.kind == "zipf":
        return (ranks + 1.0) ** -spec.zipf_exponent
    if spec.kind == "settle":
        s = spec.zipf_exponent * np.exp(-it / spec.settle_iterations)
        return (ranks + 1.0) ** -s
    if spec.kind == "drift":
        centre = (starts + it / spec.drift_period) % E  # (L,)
        x = np.arange(E, dtype=np.float64)
        d = np.abs(x[None, :] - centre[:, None])
        d = np.minimum(d, E - d)  # circular distance
        width = max(1.0, E / 16)
        bump = np.exp(-0.5 * (d / width) ** 2)
        bump /= bump.sum(axis=1, keepdims=True)
        return _DRIFT_SHARE * bump + (1 - _DRIFT_SHARE) / E
    return np.ones((L, E))


def _hot_pi(spec: RoutingSpec, top_k: int, num_experts: int) -> np.ndarray:
    f, E = spec.hot_fraction, num_experts
    if spec.hot_expert >= E:
        raise ConfigError("routing", spec.text, f"the hot expert must be in 0..{E - 1} (num_experts={E})")
    if top_k == E and f < 1:  # f >= top_k - (E - 1) keeps every other expert's probability <= 1
        raise ConfigError("routing", spec.text, f"with top_k = num_experts = {E} every token picks every expert: "
                          "the fraction must be 1")
    pi = np.full(E, (top_k - f) / (E - 1) if E > 1 else 1.0)
    pi[spec.hot_expert] = f
    return pi


# ----------------------------------------------------------------------------------------------- sampling


def _sample(rng: np.random.Generator, pi: np.ndarray, shape: tuple[int, ...], tokens: int, top_k: int) -> np.ndarray:
    """Counts of shape ``shape + (E,)``: T x top_k assignments per row from ``pi`` (broadcast to the rows),
    no expert above T. Saturated experts (pi = 1) get exactly T; overflow of the others (rare) goes to the
    experts with the most room."""
    E = pi.shape[-1]
    pi = np.broadcast_to(pi, shape + (E,))
    sat = pi >= 1.0 - 1e-12
    free = np.where(sat, 0.0, pi)
    mass = free.sum(axis=-1)
    n = tokens * top_k - tokens * sat.sum(axis=-1)  # assignments left for the unsaturated experts
    pvals = np.divide(free, mass[..., None], out=np.zeros_like(free), where=mass[..., None] > 0)
    counts = rng.multinomial(np.where(mass > 0, n, 0), np.ascontiguousarray(pvals)).astype(np.int64)
    counts[sat] = tokens
    np.minimum(counts, tokens, out=counts)
    deficit = tokens * top_k - counts.sum(axis=-1)
    while (deficit > 0).any():
        room = tokens - counts
        j = room.argmax(axis=-1)[..., None]
        add = np.minimum(deficit[..., None], np.take_along_axis(room, j, axis=-1))
        np.put_along_axis(counts, j, np.take_along_axis(counts, j, axis=-1) + add, axis=-1)
        deficit = deficit - add[..., 0]
    return counts


def _checked_shape(*, iterations: int, ep: int, num_experts: int, top_k: int, tokens_per_rank: int,
                   micro_batches: int, num_layers: int, first_iteration: int) -> tuple[int, int, int, int, int]:
    """The trace's shape (iterations, micro_batches, layers, ep, experts), or a ConfigError naming the field."""
    for name, value, low in (("iterations", iterations, 1), ("ep", ep, 1), ("num_experts", num_experts, 1),
                             ("tokens_per_rank", tokens_per_rank, 1), ("micro_batches", micro_batches, 1),
                             ("num_layers", num_layers, 1), ("first_iteration", first_iteration, 0)):
        if not isinstance(value, (int, np.integer)) or value < low:
            raise ConfigError(name, value, f"must be an integer >= {low}")
    if not 1 <= top_k <= num_experts:
        raise ConfigError("top_k", top_k, f"must be in 1..num_experts={num_experts}")
    shape = (iterations, micro_batches, num_layers, ep, num_experts)
    size = int(np.prod(shape, dtype=np.float64))
    if size > MAX_ELEMENTS:
        raise ConfigError("iterations", iterations, f"{' x '.join(map(str, shape))} = {size:,} counts (iterations x "
                          f"micro-batches x layers x ep x experts) exceed {MAX_ELEMENTS:,}: simulate fewer iterations "
                          "or micro-batches")
    return shape


def generate(spec: RoutingSpec | str, *, iterations: int, ep: int, num_experts: int, top_k: int, tokens_per_rank: int,
             micro_batches: int = 1, num_layers: int = 1, seed: int = 0, first_iteration: int = 0,
             layer_ids: tuple[int, ...] | None = None, placement: np.ndarray | None = None) -> RoutingTrace:
    """A synthetic routing trace of iterations ``first_iteration ..`` (``iterations`` of them): counts of shape
    (iterations, micro_batches, num_layers, ep, num_experts); every row routes ``tokens_per_rank x top_k``
    assignments. Deterministic in ``seed`` (see the module docstring)."""
    if isinstance(spec, str):
        spec = parse_routing(spec)
    shape = _checked_shape(iterations=iterations, ep=ep, num_experts=num_experts, top_k=top_k,
                           tokens_per_rank=tokens_per_rank, micro_batches=micro_batches, num_layers=num_layers,
                           first_iteration=first_iteration)
    source = f"{spec.text}, seed {seed}"
    common: dict[str, Any] = dict(top_k=top_k, placement=placement, layer_ids=layer_ids, tokens_per_rank=tokens_per_rank, source=source,
                  first_iteration=first_iteration)
    if spec.kind == "balanced":
        counts = balanced_counts(shape[:3], ep, num_experts, tokens_per_rank, top_k)
        return RoutingTrace(counts=np.ascontiguousarray(counts), **common)
    order_rng = np.random.default_rng([seed, 2**32])
    ranks = np.stack([order_rng.permutation(num_experts) for _ in range(num_layers)])  # (L, E) popularity ranks
    starts = order_rng.uniform(0, num_experts, size=num_layers)
    counts = np.empty(shape, dtype=np.int64)
    static = spec.kind in ("uniform", "zipf", "hot")
    pi = None
    for i in range(iterations):
        it = first_iteration + i
        if pi is None or not static:
            if spec.kind == "hot":
                pi = np.broadcast_to(_hot_pi(spec, top_k, num_experts), (num_layers, num_experts))
            else:
                pi = inclusion_probabilities(_popularity(spec, it, ranks, starts), top_k)
        rng = np.random.default_rng([seed, it])
        counts[i] = _sample(rng, pi[None, :, None, :], (micro_batches, num_layers, ep), tokens_per_rank, top_k)
    return RoutingTrace(counts=counts, **common)


def generate_fitted(fitted: FittedRouting, *, iterations: int, ep: int, num_experts: int, top_k: int,
                    tokens_per_rank: int, micro_batches: int = 1, num_layers: int = 1, seed: int = 0,
                    first_iteration: int = 0, layer_ids: tuple[int, ...] | None = None,
                    placement: np.ndarray | None = None) -> RoutingTrace:
    """A trace for any job from a routing fitted to a recorded one (:mod:`commscope.moe.fit`).

    Layer j replays recorded layer ``j mod layers``; with another number of experts the popularity profile is
    carried by quantile to a seeded random expert order. At iteration t the log popularity is the fitted slow
    course at t (held at its end beyond the recorded iterations) plus the AR(1) deviation (started from its stationary distribution at
    iteration 0 and stepped with ``default_rng([seed, t, 1])``, so that an iteration is the same alone or
    inside a run), plus each source rank's own N(0, tau^2) offset; every (micro-batch, layer, rank) then routes
    its tokens as :func:`generate` does, with ``default_rng([seed, t])``.
    """
    shape = _checked_shape(iterations=iterations, ep=ep, num_experts=num_experts, top_k=top_k,
                           tokens_per_rank=tokens_per_rank, micro_batches=micro_batches, num_layers=num_layers,
                           first_iteration=first_iteration)
    source_layer = np.arange(num_layers) % fitted.num_layers
    order_rng = np.random.default_rng([seed, 2**32])
    orders = [order_rng.permutation(num_experts) for _ in range(num_layers)]
    course = np.stack([np.stack([carried_popularity(k[s], num_experts, o) for s, o in zip(source_layer, orders)])
                       for k in fitted.knot_log_popularity])  # (K, L, E) the slow course, carried to this job
    carried = replace(fitted, knot_log_popularity=course)
    phi = fitted.persistence[source_layer][:, None]
    sigma = fitted.innovation[source_layer][:, None]
    tau = fitted.rank_spread[source_layer][None, :, None, None]
    size = (num_layers, num_experts)
    deviation = sigma / np.sqrt(1 - phi**2) * np.random.default_rng([seed, 2**32 + 1]).standard_normal(size)
    counts = np.empty(shape, dtype=np.int64)
    for t in range(first_iteration + iterations):
        if t > 0:
            deviation = phi * deviation + sigma * np.random.default_rng([seed, t, 1]).standard_normal(size)
        if t < first_iteration:
            continue
        log_popularity = carried.log_popularity(t) + deviation  # (L, E)
        rng = np.random.default_rng([seed, t])
        offsets = tau * rng.standard_normal((micro_batches, num_layers, ep, num_experts))
        popularity = np.exp(log_popularity[None, :, None, :] + offsets)
        counts[t - first_iteration] = _sample(rng, inclusion_probabilities(popularity, top_k),
                                              (micro_batches, num_layers, ep), tokens_per_rank, top_k)
    return RoutingTrace(counts=counts, top_k=top_k, placement=placement, layer_ids=layer_ids,
                        tokens_per_rank=tokens_per_rank, source=f"{fitted.source}, seed {seed}",
                        first_iteration=first_iteration)


def routing_for_job(routing: str | RoutingTrace, model, parallel, *, iterations: int | None = 1, first_iteration: int = 0,
                    micro_batches: int | None = None, seed: int = 0) -> RoutingTrace:
    """The routing of ``model`` under ``parallel``: a generator spec (``zipf:1.2``), a trace path, or a trace.

    Generators route the workload's tokens per EP rank (b s / c, / t with sequence parallelism) through every
    MoE layer of the model, ``micro_batches`` per iteration (default: the iteration's). A trace is checked
    against the job (ep, experts) and cut to iterations ``first_iteration ..`` (``iterations=None``: all).
    """

    label = routing.source if isinstance(routing, RoutingTrace) else str(routing)
    if not model.is_moe:
        raise ConfigError("routing", label, f"needs an MoE model (num_experts > 0); {model.name} is dense")
    if parallel.ep < 2:
        raise ConfigError("routing", label, "needs expert parallelism (--ep > 1): with ep=1 no token leaves its rank")
    trace = routing if isinstance(routing, RoutingTrace) else None
    layer_ids = tuple(i for i in range(model.num_layers) if model.is_moe_layer(i))
    if trace is None and label.startswith("fit:"):
        return generate_fitted(fit_routing(load_trace(label[4:])), iterations=1 if iterations is None else iterations,
                               ep=parallel.ep, num_experts=model.num_experts, top_k=model.top_k,
                               tokens_per_rank=routed_tokens_per_rank(model, parallel),
                               micro_batches=micro_batches or parallel.num_micro_batches, num_layers=len(layer_ids),
                               seed=seed, first_iteration=first_iteration, layer_ids=layer_ids)
    if trace is None and (Path(label).exists() or label.endswith(".npz")):
        trace = load_trace(label)
    if trace is not None:
        if trace.ep != parallel.ep:
            raise ConfigError("ep", parallel.ep, f"the routing trace has {trace.ep} EP ranks", source=trace.source)
        if trace.num_experts != model.num_experts:
            raise ConfigError("num_experts", model.num_experts, f"the routing trace has {trace.num_experts} experts",
                              source=trace.source)
        stop = trace.iterations if iterations is None else first_iteration + iterations
        return trace if (first_iteration, stop) == (0, trace.iterations) else trace.take_iterations(first_iteration, stop)
    return generate(parse_routing(label), iterations=1 if iterations is None else iterations, ep=parallel.ep,
                    num_experts=model.num_experts, top_k=model.top_k,
                    tokens_per_rank=routed_tokens_per_rank(model, parallel),
                    micro_batches=micro_batches or parallel.num_micro_batches, num_layers=len(layer_ids), seed=seed,
                    first_iteration=first_iteration, layer_ids=layer_ids)


__all__ = ["FITTED", "GENERATORS", "MAX_ELEMENTS", "RoutingSpec", "generate", "generate_fitted", "inclusion_probabilities",
           "parse_routing", "routing_for_job"]
