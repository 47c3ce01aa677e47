"""The planner: every configuration it returns is valid, fits and is ranked by the exact estimate."""

import numpy as np
import pytest

from commscope.errors import ConfigError
from commscope.estimate.plan import PlanSpace, candidates, plan, screen_time_s, valid_mask
from commscope.spec.files import load_cluster, load_model
from commscope.pattern.workload.dense import check_job


def test_plan_llama_on_h100():
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100")
    result = plan(model, cluster, 256, 512, top=5, refine=16)
    assert 0 < len(result.entries) <= 5
    times = [e.estimate.iteration_time_s for e in result.entries]
    assert times == sorted(times)
    for e in result.entries:
        p = e.parallel
        check_job(model, p)  # raises if invalid
        assert p.world_size == 256
        assert e.memory_bytes <= 0.9 * cluster.memory_bytes
        assert e.reason.startswith("largest cost")
    assert result.num_candidates >= result.num_valid >= result.num_fit > 0


def test_vectorised_validity_agrees_with_check_job():
    model, cluster = load_model("gpt-3b"), load_cluster("dgx-a100")
    c = candidates(model, 48, cluster, 96, PlanSpace(cp_sizes=(1, 2)))
    ok = valid_mask(model, c)
    from commscope.spec.parallel import ParallelSpec

    checked = 0
    for i in range(0, c["tp"].size, 7):
        try:
            p = ParallelSpec(tp=int(c["tp"][i]), pp=int(c["pp"][i]), dp=int(c["dp"][i]), cp=int(c["cp"][i]),
                             micro_batch_size=int(c["mb"][i]), global_batch_size=96,
                             virtual_pipeline_size=int(c["v"][i]), sequence_parallel=bool(c["sp"][i]))
            check_job(model, p)
            # one spelling per job: no SP on one TP rank, only the plainest ZeRO choice on one replica
            valid = not (c["sp"][i] and c["tp"][i] == 1) and not (c["dp"][i] * c["cp"][i] == 1 and c["zero_choice"][i])
        except (ConfigError, ZeroDivisionError):
            valid = False
        assert bool(ok[i]) == valid, {k: int(v[i]) for k, v in c.items()}
        checked += 1
    assert checked > 100


def test_screen_is_vectorised_and_positive():
    model, cluster = load_model("gpt3-13b"), load_cluster("dgx-a100")
    c = candidates(model, 1024, cluster, 1024, PlanSpace(cp_sizes=(1, 2, 4)))
    ok = valid_mask(model, c)
    c = {k: v[ok] for k, v in c.items()}
    t = screen_time_s(model, cluster, c)
    assert t.shape == c["tp"].shape and np.all(t > 0) and np.all(np.isfinite(t))


def test_nothing_fits_is_a_clear_error():
    model, cluster = load_model("llama3-405b"), load_cluster("rtx3090-pcie")
    with pytest.raises(ConfigError, match="fits in"):
        plan(model, cluster, 8, 64)


def test_plan_ranks_every_candidate_that_fits_op_by_op():
    """No top-k: the plan's best is the fastest scalar estimate over every configuration that fits."""
    from commscope.api import predict
    from commscope.estimate.iteration import estimate

    model, cluster = load_model("gpt3-1.3b"), load_cluster("dgx-a100")
    space = PlanSpace(micro_batch_sizes=(1, 4), virtual_pipeline_sizes=(1, 2), recompute=("none", "full"))
    result = plan(model, cluster, 16, 64, top=1000, space=space)
    assert len(result.entries) == result.num_fit
    scalar = sorted(estimate(predict(model, e.parallel, cluster)).iteration_time_s for e in result.entries)
    assert [e.estimate.iteration_time_s for e in result.entries] == pytest.approx(scalar, rel=1e-12)
    screened = plan(model, cluster, 16, 64, top=1, space=space, refine=1)
    assert result.entries[0].estimate.iteration_time_s <= screened.entries[0].estimate.iteration_time_s


def test_plan_weighs_uneven_splits_with_their_real_memory():
    """pp (x v) that does not divide the layers is planned with the split the estimate uses (lighter first and last
    stages, or chunks), and its memory is the scalar model's for that split: the most loaded stage, not L // pp
    layers on the first and last."""
    from commscope.estimate.memory import memory_per_gpu
    from commscope.spec.model import ModelSpec

    model = ModelSpec(name="odd", num_layers=30, hidden_size=2048, num_heads=16, seq_len=2048, vocab_size=50257)
    cluster = load_cluster("dgx-a100")
    space = PlanSpace(micro_batch_sizes=(1,), virtual_pipeline_sizes=(1, 2), recompute=("none",))
    result = plan(model, cluster, 32, 64, top=1000, space=space)
    uneven = [e for e in result.entries if model.num_layers % (e.parallel.pp * e.parallel.virtual_pipeline_size)]
    assert {e.parallel.virtual_pipeline_size for e in uneven} == {1, 2}
    for e in result.entries:
        assert e.memory_bytes == pytest.approx(memory_per_gpu(model, e.parallel).total_bytes, rel=1e-12)


@pytest.mark.parametrize(("model", "cluster", "gpus", "space", "fragment"), [
    ("gpt-1.5b", "dgx1-v100", 32, PlanSpace(micro_batch_sizes=(3,)),
     "micro-batch-sizes='3': no candidate: the global batch 512 is not divisible by 3 x dp for any dp"),
    ("gpt-1.5b", "dgx1-v100", 32, PlanSpace(ep_sizes=(2,)), "ep-sizes='2': gpt-1.5b is dense (no experts)"),
    ("mixtral-8x7b", "dgx-h100", 64, PlanSpace(ep_sizes=(3,)), "ep-sizes='3': ep must divide num_experts=8"),
    ("mixtral-8x7b", "dgx-h100", 64, PlanSpace(ep_sizes=(16,)), "ep-sizes='16': ep must divide num_experts=8"),
    ("mixtral-8x7b", "dgx-h100", 4, PlanSpace(ep_sizes=(8,)), "ep-sizes='8': ep must divide dp x cp, which can be 1,2,4"),
    ("gpt-1.5b", "dgx1-v100", 8, PlanSpace(cp_sizes=(3,)), "cp-sizes='3': cp must divide gpus=8"),
    ("gpt-1.5b", "dgx1-v100", 1, PlanSpace(virtual_pipeline_sizes=(2,)), "virtual-pipeline-sizes='2'"),
    ("gpt-1.5b", "dgx1-v100", 100_000_000, PlanSpace(), "gpus=100000000: no valid configuration: every split"),
    ("gpt-1.5b", "dgx1-v100", 97, PlanSpace(), "gpus=97: no valid configuration: the global batch 512 is not divisible"),
])
def test_no_valid_configuration_names_the_knob_and_why(model, cluster, gpus, space, fragment):
    """Once numpy's 'zero-size array to reduction operation maximum' from the memory model; now the rule that rules
    out the last candidate, in terms of the knob that was given."""
    with pytest.raises(ConfigError) as info:
        plan(load_model(model), load_cluster(cluster), gpus, 512, space=space)
    assert fragment in str(info.value)


def test_a_knob_is_refused_only_when_none_of_its_values_is_valid():
    """micro-batch 3 fits no dp of a batch of 512 and ep 2 no dense model: alone they are refused, beside a valid
    value they are dropped and the plan runs."""
    model, cluster = load_model("gpt-1.5b"), load_cluster("dgx1-v100")
    for bad, mixed in (((3,), (3, 4)), ((2,), (1, 2))):
        knob = "micro_batch_sizes" if bad == (3,) else "ep_sizes"
        with pytest.raises(ConfigError, match="no candidate|dense"):
            plan(model, cluster, 32, 512, space=PlanSpace(**{knob: bad}))
        result = plan(model, cluster, 32, 512, top=3, space=PlanSpace(**{knob: mixed}))
        assert result.entries and all(e.parallel.micro_batch_size != 3 and e.parallel.ep == 1 for e in result.entries)


def test_one_row_per_job_when_zero_has_nothing_to_shard():
    """With dp x cp = 1 ZeRO stage 0, the distributed optimizer and ZeRO 3 are the same job: one row, stage 0 (they
    were three rows with the same time and memory). With dp > 1 all three remain."""
    model, cluster = load_model("gpt-1.5b"), load_cluster("dgx1-v100")
    for gpus, batch in ((7, 512), (32, 7)):
        result = plan(model, cluster, gpus, batch, top=1000)
        jobs = [(e.parallel.tp, e.parallel.pp, e.parallel.micro_batch_size, e.parallel.virtual_pipeline_size,
                 e.parallel.sequence_parallel, e.parallel.recompute) for e in result.entries]
        assert all(e.parallel.dp * e.parallel.cp == 1 for e in result.entries)
        assert len(jobs) == len(set(jobs)) == result.num_valid
        assert {(e.parallel.zero_stage, e.parallel.distributed_optimizer) for e in result.entries} == {(0, False)}
    zeros = {(e.parallel.zero_stage, e.parallel.distributed_optimizer)
             for e in plan(model, cluster, 16, 512, top=1000).entries if e.parallel.dp > 1}
    assert zeros == {(0, False), (1, True), (3, False)}
