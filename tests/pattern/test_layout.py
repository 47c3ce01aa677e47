import numpy as np
import pytest
from hypothesis import given, settings

from commscope.pattern.layout import GROUP_KINDS, Layout
from commscope.spec.parallel import ParallelSpec
from strategies import jobs


def test_megatron_worked_example():
    # (tp, pp, dp) = (2, 4, 4) on 32 GPUs, Megatron's default order: TP innermost, PP outermost.
    lay = Layout(ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4))
    assert lay.groups("tp")[:3].tolist() == [[0, 1], [2, 3], [4, 5]]
    assert lay.groups("dp")[:2].tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert lay.groups("pp")[:2].tolist() == [[0, 8, 16, 24], [1, 9, 17, 25]]
    assert lay.groups("emb")[:2].tolist() == [[0, 24], [1, 25]]
    assert lay.coords(13) == {"tp": 1, "cp": 0, "dp": 2, "pp": 1, "ep": 0, "expert_dp": 2}


def test_expert_parallel_folded_inside_dp():
    lay = Layout(ParallelSpec(tp=2, pp=2, dp=4, ep=2, global_batch_size=8))
    # EP groups: consecutive dp positions at fixed tp; expert-dp strides over them.
    assert lay.groups("ep")[:2].tolist() == [[0, 2], [1, 3]]
    assert lay.groups("expert-dp")[:2].tolist() == [[0, 4], [1, 5]]


def test_order_changes_the_mapping():
    lay = Layout(ParallelSpec(tp=2, dp=2, order="dp-tp-cp-ep-pp", global_batch_size=2))
    assert lay.groups("dp").tolist() == [[0, 1], [2, 3]]
    assert lay.groups("tp").tolist() == [[0, 2], [1, 3]]


@settings(max_examples=60, deadline=None)
@given(jobs(moe=None))
def test_every_axis_partitions_the_ranks(job):
    _, parallel = job
    lay = Layout(parallel)
    world = parallel.world_size
    for kind in GROUP_KINDS:
        groups = lay.groups(kind)
        if kind == "emb":
            assert groups.shape[0] == (0 if parallel.pp == 1 else world // parallel.pp)
            continue
        flat = np.sort(groups.ravel())
        assert flat.tolist() == list(range(world)), kind
    sizes = {"tp": parallel.tp, "pp": parallel.pp, "dp": parallel.dp, "cp": parallel.cp,
             "dp-cp": parallel.dp * parallel.cp, "ep": parallel.ep, "expert-dp": parallel.expert_dp}
    for kind, size in sizes.items():
        assert lay.groups(kind).shape[1] == size
    # coordinates agree with the groups: members of a TP group differ only in tp
    coords = lay.coordinate_arrays()
    for g in lay.groups("tp"):
        for axis in ("pp", "dp", "cp"):
            assert len(set(coords[axis][g].tolist())) == 1


def test_bad_rank():
    lay = Layout(ParallelSpec(tp=2, global_batch_size=2))
    with pytest.raises(ValueError, match="rank=5"):
        lay.coords(5)


@settings(max_examples=60, deadline=None)
@given(jobs(moe=None))
def test_first_stage_groups_are_stage_0s_and_the_others_move_by_the_stride(job):
    """What the closed-form estimate reads of a layout whose stages sit alike: stage 0's groups, and each stage's
    groups those plus s x stage_stride (pp outermost)."""
    _, parallel = job
    lay = Layout(parallel)
    stage = lay.stage_of()
    for kind in ("tp", "cp", "dp", "dp-cp", "ep", "expert-dp"):
        groups = lay.groups(kind)
        first = lay.first_stage_groups(kind)
        assert first.tolist() == groups[stage[groups[:, 0]] == 0].tolist(), kind
        if parallel.order.endswith("-pp"):
            for s in range(parallel.pp):
                on_s = groups[stage[groups[:, 0]] == s]
                assert (on_s == first + s * lay.stage_stride).all(), (kind, s)
    with pytest.raises(ValueError, match="first_stage_groups"):
        lay.first_stage_groups("pp")
