"""Synthetic routers: spec strings, shapes, conservation, determinism, and the behaviour each one promises."""

import numpy as np
import pytest

from commscope.errors import ConfigError
from commscope.moe import GENERATORS, generate, parse_routing, routing_metrics
from commscope.moe.generators import inclusion_probabilities

SHAPE = dict(iterations=6, ep=4, num_experts=8, top_k=2, tokens_per_rank=100, micro_batches=2, num_layers=3)


@pytest.mark.parametrize("text,expected", [
    ("uniform", "uniform"), ("balanced", "balanced"), ("zipf", "zipf:1.2"), ("zipf:0.8", "zipf:0.8"),
    ("hot", "hot:0:0.5"), ("hot:3", "hot:3:0.5"), ("HOT:3:0.9", "hot:3:0.9"), ("drift", "drift:10"),
    ("drift:4", "drift:4"), ("settle", "settle:50:1.5"), ("settle:20", "settle:20:1.5"), ("settle:20:2", "settle:20:2"),
])
def test_parse_routing_round_trips(text, expected):
    spec = parse_routing(text)
    assert spec.text == expected and parse_routing(spec.text) == spec


@pytest.mark.parametrize("text,pattern", [
    ("zebra", (r"routing='zebra': valid: uniform, balanced, zipf:<s>, hot:<expert>\[:<fraction>\], drift\[:<period>\], "
              r"settle\[:<tau>\[:<s>\]\], or a routing trace")),
    ("zipf:-1", r"routing='zipf:-1': the exponent s must be a number > 0: zipf:<s>"),
    ("zipf:abc", r"the exponent s must be a number > 0"),
    ("zipf:1:2", r"zipf takes at most 1 parameter\(s\)"),
    ("uniform:3", r"uniform takes at most 0 parameter\(s\)"),
    ("hot:-2", r"the expert must be an expert index >= 0"),
    ("hot:1:1.5", r"the fraction must be in \(0, 1\]"),
    ("drift:0", r"the period must be an integer >= 1"),
    ("drift:2.5", r"the period must be an integer >= 1"),
    ("settle:0", r"tau must be a number of iterations > 0"),
])
def test_parse_routing_errors_name_the_valid_choices(text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_routing(text)


@pytest.mark.parametrize("name", sorted(GENERATORS))
def test_every_generator_is_shaped_conserving_and_deterministic(name):
    spec = {"hot": "hot:5:0.7"}.get(name, name)
    a = generate(spec, seed=3, **SHAPE)
    b = generate(spec, seed=3, **SHAPE)
    assert a.counts.shape == (6, 2, 3, 4, 8)
    assert np.array_equal(a.counts, b.counts)
    assert (a.counts.sum(axis=-1) == 100 * 2).all()  # every rank routes T x top_k
    assert (a.counts <= 100).all() and (a.counts >= 0).all()  # no expert takes a token twice
    assert a.tokens_per_rank == 100 and a.top_k == 2
    if name != "balanced":
        assert not np.array_equal(a.counts, generate(spec, seed=4, **SHAPE).counts)


@pytest.mark.parametrize("name", ["uniform", "zipf", "drift", "settle"])
def test_an_iteration_is_the_same_alone_or_in_a_run(name):
    run = generate(name, seed=7, **SHAPE)
    alone = generate(name, seed=7, **{**SHAPE, "iterations": 1}, first_iteration=4)
    assert np.array_equal(run.counts[4], alone.counts[0])


def test_balanced_is_the_exact_even_split():
    trace = generate("balanced", **{**SHAPE, "tokens_per_rank": 101})
    per_expert = trace.counts.sum(axis=(0, 1, 2, 3)) / (6 * 2 * 3)
    assert per_expert.max() - per_expert.min() <= 1 and set(np.unique(trace.counts)) <= {25, 26}


def test_hot_expert_with_fraction_one_and_top1_takes_everything():
    trace = generate("hot:6:1", **{**SHAPE, "top_k": 1})
    assert (trace.counts[..., 6] == 100).all() and trace.counts.sum() == trace.counts[..., 6].sum()


def test_hot_expert_share():
    trace = generate("hot:2:0.6", **{**SHAPE, "tokens_per_rank": 5000, "iterations": 2})
    share = trace.counts[..., 2].sum() / (trace.counts.sum() / 2)  # fraction of tokens that picked expert 2
    assert share == pytest.approx(0.6, abs=0.01)


def test_impossible_hot_fraction_is_refused():
    with pytest.raises(ConfigError, match=r"with top_k = num_experts = 8 every token picks every expert: the fraction must be 1"):
        generate("hot:0:0.5", **{**SHAPE, "top_k": 8})
    with pytest.raises(ConfigError, match=r"the hot expert must be in 0..7"):
        generate("hot:8", **SHAPE)


def test_inclusion_probabilities_saturate_at_one():
    pi = inclusion_probabilities(np.array([100.0, 1, 1, 1, 1]), 2)
    assert pi[0] == 1.0 and pi.sum() == pytest.approx(2) and pi[1:] == pytest.approx(0.25)
    assert inclusion_probabilities(np.ones((3, 4)), 2) == pytest.approx(np.full((3, 4), 0.5))


def test_zipf_orders_experts_per_layer_and_keeps_them():
    trace = generate("zipf:1.5", **{**SHAPE, "tokens_per_rank": 2000, "top_k": 1})
    load = trace.counts.sum(axis=(1, 3))  # (it, layer, expert)
    hottest = load.argmax(axis=-1)
    assert (hottest == hottest[0]).all()  # the same expert stays hottest over iterations
    assert len(set(hottest[0].tolist())) > 1  # but differs between layers


def test_drift_moves_the_hot_spot():
    trace = generate("drift:1", **{**SHAPE, "num_layers": 1, "iterations": 8, "tokens_per_rank": 4000})
    hottest = trace.counts.sum(axis=(1, 2, 3)).argmax(axis=-1)
    steps = (np.diff(hottest) % 8)
    assert ((steps == 1) | (steps == 0) | (steps == 2)).all() and len(set(hottest.tolist())) >= 6


def test_settle_becomes_more_uniform():
    trace = generate("settle:10:2", **{**SHAPE, "iterations": 40, "tokens_per_rank": 2000})
    m = routing_metrics(trace)
    assert m.expert_entropy[-1] > 0.99 and m.expert_entropy[0] < 0.9
    assert m.uniformity_trend_per_iteration > 0


def test_size_guard():
    with pytest.raises(ConfigError, match="exceed 100,000,000: simulate fewer iterations"):
        generate("uniform", iterations=100_000, ep=64, num_experts=64, top_k=2, tokens_per_rank=10, num_layers=1)


def test_routing_generators_and_the_moe_workload_do_not_import_each_other():
    """Both use commscope.moe.routing and commscope.moe.trace; neither reaches into the other (no import circle),
    not even inside a function."""
    import ast
    from pathlib import Path

    import commscope

    root = Path(commscope.__file__).parent

    def imports(relative: str) -> set[str]:
        tree = ast.parse((root / relative).read_text())
        return {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}

    moe_modules = {f"commscope.moe.{p.stem}" for p in (root / "moe").glob("*.py")}
    assert not {m for m in imports("pattern/workload/moe.py") if m in moe_modules} - {"commscope.moe.routing",
                                                                             "commscope.moe.trace"}
    for path in (root / "moe").glob("*.py"):
        assert not any(m.startswith("commscope.pattern.workload") for m in imports(f"moe/{path.name}")), path.name
