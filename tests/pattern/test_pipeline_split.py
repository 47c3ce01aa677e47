"""The default split of the layers over pipeline stages when pp (x v) does not divide them (issue 33): balanced,
the lighter stages first and last, Megatron-core's split where it has one, and the same split in the workload's op
lists, the estimate (scalar and vectorised) and the memory model (scalar and vectorised)."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from estimates_alike import CLUSTER, assert_same

from commscope.api import predict
from commscope.estimate.iteration import estimate
from commscope.estimate.many import estimate_many
from commscope.pattern.layout import Layout
from commscope.estimate.memory import memory_per_gpu, memory_per_stage, total_memory_bytes
from commscope.presets import model_preset
from commscope.spec.files import load_cluster
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.workload.dense import build_workload
from commscope.pattern.workload.stages import pipeline_split, pipeline_split_note, stage_layers, virtual_stage_layers

SMALL = ModelSpec(name="small", num_layers=96, hidden_size=256, num_heads=8, seq_len=128, vocab_size=1000)


def _stage_totals(split: list[int], pp: int, v: int) -> list[int]:
    return [sum(split[c * pp + s] for c in range(v)) for s in range(pp)]


@st.composite
def splits(draw):
    """(num_layers, pp, v) with pp x v <= num_layers, often with pp x v not dividing the layers."""
    pp = draw(st.integers(1, 64))
    v = draw(st.sampled_from([1, 1, 2, 3, 4])) if pp > 1 else 1
    num_layers = draw(st.integers(pp * v, 4 * pp * v + 3))
    return num_layers, pp, v


@settings(max_examples=300, deadline=None)
@given(splits())
def test_the_default_split_is_balanced_with_the_lighter_stages_at_the_ends(case):
    num_layers, pp, v = case
    par = ParallelSpec(pp=pp, virtual_pipeline_size=v, global_batch_size=pp)
    model = replace(SMALL, num_layers=num_layers)
    split = pipeline_split(model, par)
    note = pipeline_split_note(model, par) or ""
    ranges = virtual_stage_layers(model, par)
    assert len(split) == pp * v and all(n >= 1 for n in split)
    # every layer on exactly one (virtual) stage, in order
    assert [layer for r in ranges for layer in r] == list(range(num_layers))
    stages = _stage_totals(split, pp, v)
    assert [sum(map(len, stage_layers(model, par, s))) for s in range(pp)] == stages
    # loads differ by one layer at most, per stage and per chunk
    assert max(stages) - min(stages) <= 1 and max(split) - min(split) <= 1
    # the first and last stages never heavier than a middle one; the last is always a light one
    middle = stages[1:-1]
    if middle:
        assert stages[0] <= min(middle) and stages[-1] <= min(middle)
    assert stages[-1] == min(stages)
    # the heavier stages sit after the lighter middle ones (where 1F1B keeps fewer micro-batches in flight)
    assert middle == sorted(middle)
    # Megatron-core's rule where it has one: the embedding and the loss (or the loss alone) counted as a layer each
    chunks = pp * v
    if num_layers % chunks == 0:
        assert split == [num_layers // chunks] * chunks
    elif (num_layers + 2) % chunks == 0:
        k = (num_layers + 2) // chunks
        assert split == [k - 1] + [k] * (chunks - 2) + [k - 1]
        assert "with --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split" in note
    elif (num_layers + 1) % chunks == 0:
        k = (num_layers + 1) // chunks
        assert split == [k] * (chunks - 1) + [k - 1]
        assert "with --account-for-loss-in-pipeline-split" in note


def test_gpt3_96_layers_on_64_stages_is_balanced_not_17_layers_at_the_ends():
    """The issue's case: 96 layers on pp = 64 were split 17, 1 x 62, 17 (an iteration of 215 s on 1,024 A100s);
    balanced, 32 stages of 1 and 32 of 2, the light ones first and last: 29.4 s."""
    model = model_preset("gpt3-175b")
    par = ParallelSpec(tp=8, pp=64, dp=2, global_batch_size=1536, micro_batch_size=1)
    assert pipeline_split(model, par) == [1] * 31 + [2] * 32 + [1]
    est = estimate(predict(model, par, load_cluster("dgx-a100")))
    note = next(n for n in est.notes if n.startswith("pipeline split"))
    assert note.startswith("pipeline split 1x31,2x32,1: pp=64 does not divide num_layers=96: 32 stages hold 1 layer "
                           "and 32 hold 2, the first and last among the lighter")
    assert len(stage_layers(model, par, est.critical_stage)[0]) == 2
    assert 25 < est.iteration_time_s < 35
    assert memory_per_gpu(model, par).total_bytes < 0.9 * 80 * 2**30


@pytest.mark.parametrize(("pp", "v", "num_layers"), [(8, 1, 22), (8, 1, 21), (8, 1, 19), (4, 2, 21), (4, 3, 22)])
def test_op_lists_estimates_and_memory_follow_the_split(pp, v, num_layers):
    """Per stage: the workload's TP ops run for the split's layers; the vectorised estimate and memory equal the
    scalar ones (whose stages read the same split)."""
    model = replace(SMALL, num_layers=num_layers)
    par = ParallelSpec(tp=2, pp=pp, dp=1, global_batch_size=2 * pp, virtual_pipeline_size=v)
    w = build_workload(model, par)
    stage_of = Layout(par).stage_of()
    per_stage: dict[int, set[int]] = {}
    for s in w.opsets:
        if s.axis == "tp" and s.layers:
            per_stage.setdefault(int(stage_of[s.groups[0, 0]]), set()).update(s.layers)
    want = {s: {layer for chunk in stage_layers(model, par, s) for layer in chunk} for s in range(pp)}
    assert per_stage == want
    scalar = estimate(predict(model, par, CLUSTER))
    assert_same(scalar.to_dict(), estimate_many(model, CLUSTER, [par])[0].to_dict())
    stages = memory_per_stage(model, par)
    vec = total_memory_bytes(model, tp=2, pp=pp, dp=1, global_batch_size=2 * pp, micro_batch_size=1,
                             virtual_pipeline_size=v)
    assert float(vec) == pytest.approx(max(s.total_bytes for s in stages), rel=1e-12)


def test_vectorised_memory_finds_the_first_heavier_stage():
    """With light middle stages before the heavier ones, the most loaded stage can be the first heavier one (stage
    31 of GPT-3 on pp = 64): the vectorised memory looks at it, as the scalar one does (it looked at stages 0, 1
    and the last only)."""
    model = model_preset("gpt3-175b")
    par = ParallelSpec(tp=8, pp=64, dp=2, global_batch_size=1536, micro_batch_size=1)
    peak = memory_per_gpu(model, par)
    assert peak.stage == 31
    vec = total_memory_bytes(model, tp=np.array([8, 8]), pp=np.array([64, 40]), dp=2,
                             global_batch_size=np.array([1536, 640]), micro_batch_size=1)
    assert vec[0] == pytest.approx(peak.total_bytes, rel=1e-12)
    other = memory_per_gpu(model, ParallelSpec(tp=8, pp=40, dp=2, global_batch_size=640))
    assert vec[1] == pytest.approx(other.total_bytes, rel=1e-12)
