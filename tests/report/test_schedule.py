"""Pipeline schedules: the bubble formulas, the dependencies, and agreement with the estimate."""

from __future__ import annotations

import itertools
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest

import commscope.estimate.schedule as schedule_module
from commscope.errors import ConfigError
from commscope.estimate.schedule import SCHEDULES, pipeline_schedule, schedule_for, stage_order

CASES_1F1B = [(1, 4), (2, 1), (2, 8), (4, 4), (4, 8), (4, 16), (8, 8), (8, 32), (16, 16), (3, 7)]
CASES_INTERLEAVED = [(2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 16, 2), (4, 16, 4), (8, 16, 3), (8, 64, 2)]


@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize("p, m", CASES_1F1B)
def test_equal_stage_times_idle_fraction_is_p_minus_1_over_m_plus_p_minus_1(name, p, m):
    sched = pipeline_schedule(name, pp=p, num_micro_batches=m, fwd_s=1.0, bwd_s=2.0)
    assert sched.makespan_s == pytest.approx((m + p - 1) * 3.0)
    assert sched.idle_fraction == pytest.approx(float(Fraction(p - 1, m + p - 1)), abs=1e-12)
    # every stage idles (p - 1)(t_f + t_b): the bubble of the seed talk
    np.testing.assert_allclose(sched.idle_s(), (p - 1) * 3.0, atol=1e-9)


@pytest.mark.parametrize("p, m, v", CASES_INTERLEAVED)
def test_interleaving_divides_the_bubble_by_v(p, m, v):
    inter = pipeline_schedule("interleaved", pp=p, num_micro_batches=m, virtual_pipeline_size=v,
                              fwd_s=1.0 / v, bwd_s=2.0 / v)
    plain = pipeline_schedule("1f1b", pp=p, num_micro_batches=m, fwd_s=1.0, bwd_s=2.0)
    assert inter.makespan_s == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)
    assert inter.idle_fraction == pytest.approx(float(Fraction(p - 1, v * m + p - 1)), abs=1e-12)
    assert inter.idle_fraction < plain.idle_fraction
    assert inter.busy_s() == pytest.approx(plain.busy_s())  # the same work, less waiting


@pytest.mark.parametrize("name, p, m, v", [("1f1b", 4, 8, 1), ("gpipe", 4, 6, 1), ("interleaved", 4, 8, 2),
                                           ("interleaved", 2, 6, 3), ("1f1b", 5, 3, 1)])
def test_every_pass_runs_once_in_dependency_order_without_overlap(name, p, m, v):
    rng = np.random.default_rng(7)
    fwd = rng.uniform(0.5, 1.5, (p, v))
    bwd = rng.uniform(1.0, 3.0, (p, v))
    sched = pipeline_schedule(name, pp=p, num_micro_batches=m, virtual_pipeline_size=v, fwd_s=fwd, bwd_s=bwd, p2p_s=0.1)
    end = {}
    start = {}
    for s in sched.slots:
        key = (s.kind, s.stage, s.micro_batch, s.chunk)
        assert key not in end, key
        end[key], start[key] = s.t_end_s, s.t_start_s
        expected = (fwd if s.kind == "fwd" else bwd)[s.stage, s.chunk]
        assert s.duration_s == pytest.approx(expected)
    assert len(end) == 2 * p * m * v
    for (kind, stage, mb, chunk), t0 in start.items():
        if kind == "fwd" and stage > 0:
            assert t0 >= end[("fwd", stage - 1, mb, chunk)] + 0.1 - 1e-12
        if kind == "fwd" and stage == 0 and chunk > 0:
            assert t0 >= end[("fwd", p - 1, mb, chunk - 1)] + 0.1 - 1e-12
        if kind == "bwd":
            assert t0 >= end[("fwd", stage, mb, chunk)] - 1e-12
            if stage < p - 1:
                assert t0 >= end[("bwd", stage + 1, mb, chunk)] + 0.1 - 1e-12
    by_stage = defaultdict(list)
    for s in sched.slots:
        by_stage[s.stage].append((s.t_start_s, s.t_end_s))
    for spans in by_stage.values():
        spans.sort()
        for (_, e0), (s1, _) in itertools.pairwise(spans):
            assert s1 >= e0 - 1e-12
    # the gaps are the idle time
    gaps = defaultdict(float)
    for stage, t0, t1 in sched.bubbles():
        gaps[stage] += t1 - t0
    np.testing.assert_allclose([gaps[s] for s in range(p)], sched.idle_s(), atol=1e-9)


def test_1f1b_keeps_at_most_p_minus_s_micro_batches_in_flight():
    p, m = 4, 12
    for stage in range(p):
        in_flight = peak = 0
        for kind, _, _ in stage_order("1f1b", p, m, stage):
            in_flight += 1 if kind == "fwd" else -1
            peak = max(peak, in_flight)
        assert peak == p - stage
    gpipe_peak = max(np.cumsum([1 if k == "fwd" else -1 for k, _, _ in stage_order("gpipe", p, m, 0)]))
    assert gpipe_peak == m


def test_interleaved_order_is_megatrons():
    # p=4, v=2, m=8: stage 0 warms up with 2 (p-1) + (v-1) p = 10 forwards, groups of p micro-batches per chunk
    order = stage_order("interleaved", 4, 8, 0, 2)
    assert order[:10] == [("fwd", 0, 0), ("fwd", 1, 0), ("fwd", 2, 0), ("fwd", 3, 0),
                          ("fwd", 0, 1), ("fwd", 1, 1), ("fwd", 2, 1), ("fwd", 3, 1),
                          ("fwd", 4, 0), ("fwd", 5, 0)]
    assert order[10:12] == [("fwd", 6, 0), ("bwd", 0, 1)]  # backwards start with the last chunk
    last = stage_order("interleaved", 4, 8, 3, 2)
    assert sum(k == "fwd" for k, _, _ in last[:4]) == 4 and last[4] == ("fwd", 0, 1)
    assert len(order) == 2 * 8 * 2


def test_unequal_stages_the_slowest_sets_the_pace():
    p, m = 4, 16
    fwd = np.array([1.0, 1.0, 2.0, 1.0])
    sched = pipeline_schedule("1f1b", pp=p, num_micro_batches=m, fwd_s=fwd, bwd_s=2 * fwd)
    assert sched.makespan_s >= m * 6.0
    idle = sched.idle_s()
    assert idle[2] == idle.min()
    assert sched.idle_fraction > float(Fraction(p - 1, m + p - 1))


def test_p2p_delay_adds_two_hops_per_stage_boundary_for_one_micro_batch():
    sched = pipeline_schedule("1f1b", pp=4, num_micro_batches=1, fwd_s=1.0, bwd_s=2.0, p2p_s=0.25)
    assert sched.makespan_s == pytest.approx(4 * 3.0 + 2 * 3 * 0.25)


def test_to_dict_is_columnar_and_json_ready():
    import json

    d = pipeline_schedule("interleaved", pp=2, num_micro_batches=4, virtual_pipeline_size=2, fwd_s=1, bwd_s=2).to_dict()
    json.dumps(d)
    n = len(d["slots"]["stage"])
    assert n == 2 * 2 * 4 * 2
    assert all(len(col) == n for col in d["slots"].values())
    assert set(d["slots"]["kind"]) == {"fwd", "bwd"}
    assert d["idle_fraction"] == pytest.approx(1 / 9)


@pytest.mark.parametrize("kwargs, field", [
    (dict(name="zero-bubble"), "schedule"),
    (dict(name="interleaved", virtual_pipeline_size=2, num_micro_batches=6), "num_micro_batches"),
    (dict(name="interleaved", virtual_pipeline_size=1), "virtual_pipeline_size"),
    (dict(name="1f1b", virtual_pipeline_size=2), "virtual_pipeline_size"),
    (dict(name="1f1b", fwd_s=[1.0, 2.0]), "fwd_s"),
    (dict(name="1f1b", bwd_s=-1.0), "bwd_s"),
    (dict(name="1f1b", num_micro_batches=0), "num_micro_batches"),
    (dict(name="1f1b", p2p_s=-0.1), "p2p_s"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = dict(name="1f1b", pp=4, num_micro_batches=8, fwd_s=1.0, bwd_s=2.0)
    args.update(kwargs)
    name = args.pop("name")
    with pytest.raises(ConfigError) as info:
        pipeline_schedule(name, **args)
    assert info.value.field == field


@pytest.mark.parametrize("v, recompute", [(1, "none"), (2, "none"), (1, "full")])
def test_schedule_of_an_estimate_ends_at_its_iteration_time(v, recompute):
    from commscope.api import predict
    from commscope.estimate.iteration import estimate
    from commscope.spec.parallel import ParallelSpec

    par = ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4, virtual_pipeline_size=v,
                       recompute=recompute)
    pred = predict("gpt-3b", par, "dgx1-v100")
    est = estimate(pred)
    sched = schedule_for(par, est)
    assert sched.name == ("interleaved" if v > 1 else "1f1b")
    assert sched.makespan_s + est.tail_s == pytest.approx(est.iteration_time_s, rel=1e-9)
    # the slowest stage waits exactly the bubble: the fill and drain through the other stages
    assert sched.idle_s()[est.critical_stage] == pytest.approx(est.bubble_s, rel=1e-9)
    fwd = [s.duration_s for s in sched.slots if s.kind == "fwd"]
    bwd = [s.duration_s for s in sched.slots if s.kind == "bwd"]
    assert bwd[0] / fwd[0] == pytest.approx(3.0 if recompute == "full" else 2.0)


def test_public_names():
    assert set(schedule_module.__all__) <= set(dir(schedule_module))
    assert SCHEDULES == ("1f1b", "interleaved", "gpipe")
