"""Every point-to-point algorithm gives what gloo's own collective gives, on real ranks.

Integer data must match bit for bit (sums of integers are exact in any order); float data must match to
rounding (the algorithms reduce in another order than gloo) and be bit-identical across ranks.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from commscope.measure.launch import spawn  # noqa: E402
from commscope.measure.tune.algorithms import ALGORITHMS, GroupPeers, reduce_op_name  # noqa: E402

# odd element counts, fewer elements than ranks, and a zero-length buffer
COUNTS = (0, 1, 5, 33, 1001)
REDOPS = (dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX)


def _values(rank: int, numel: int, dtype, salt: int = 0):
    idx = torch.arange(numel, dtype=torch.int64)
    if dtype.is_floating_point:
        g = torch.Generator().manual_seed(1000 * rank + salt)
        return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)
    return ((13 * rank + 7 * idx + salt) % 5 + 1).to(dtype)  # small: products of 4 stay exact


def _same(got, want, dtype) -> bool:
    if dtype.is_floating_point:
        return torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    return torch.equal(got, want)


def _check_all(group) -> list[str]:
    """Run every algorithm on ``group`` against gloo on the same group; return what differed."""
    me = dist.get_rank(group)
    n = dist.get_world_size(group)
    peers = GroupPeers(group)
    bad: list[str] = []

    def expect(ok: bool, what: str) -> None:
        if not ok:
            bad.append(f"n={n} rank={me}: {what}")

    for dtype in (torch.int64, torch.float32):
        for c in COUNTS:
            for name, alg in ALGORITHMS["all_reduce"].items():
                for redop in REDOPS if dtype == torch.int64 else (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                    mine, ref = _values(me, c, dtype), _values(me, c, dtype)
                    alg.run(mine, peers, redop)
                    dist.all_reduce(ref, op=redop, group=group)
                    expect(_same(mine, ref, dtype), f"all_reduce {name} {reduce_op_name(redop)} {dtype} c={c}")
                    everyone = [torch.empty_like(mine) for _ in range(n)]
                    dist.all_gather(everyone, mine, group=group)
                    expect(all(torch.equal(e, mine) for e in everyone), f"all_reduce {name} differs across ranks")
            for name, alg in ALGORITHMS["all_gather"].items():
                if not alg.applies_to(n):
                    continue
                inp = _values(me, c, dtype)
                mine, ref = torch.empty(n * c, dtype=dtype), torch.empty(n * c, dtype=dtype)
                alg.run(mine, inp, peers)
                dist.all_gather_single(ref, inp, group=group)
                expect(torch.equal(mine, ref), f"all_gather {name} {dtype} c={c}")
            for name, alg in ALGORITHMS["reduce_scatter"].items():
                if not alg.applies_to(n):
                    continue
                inp = _values(me, n * c, dtype)
                keep = inp.clone()
                mine, ref = torch.empty(c, dtype=dtype), torch.empty(c, dtype=dtype)
                alg.run(mine, inp, peers, dist.ReduceOp.SUM)
                dist.reduce_scatter_single(ref, inp, group=group)
                expect(_same(mine, ref, dtype), f"reduce_scatter {name} {dtype} c={c}")
                expect(torch.equal(inp, keep), f"reduce_scatter {name} changed its input")
            for name, alg in ALGORITHMS["all_to_all"].items():
                inp = _values(me, n * c, dtype)
                mine, ref = torch.empty(n * c, dtype=dtype), torch.empty(n * c, dtype=dtype)
                alg.run(mine, inp, peers)
                dist.all_to_all_single(ref, inp, group=group)
                expect(torch.equal(mine, ref), f"all_to_all {name} even {dtype} c={c}")
            for name, alg in ALGORITHMS["broadcast"].items():
                for root in {0, n - 1}:
                    mine = _values(me, c, dtype, salt=root)
                    ref = mine.clone()
                    alg.run(mine, peers, root)
                    dist.broadcast(ref, group_src=root, group=group)
                    expect(torch.equal(mine, ref), f"broadcast {name} root={root} {dtype} c={c}")
    # uneven all_to_all: rank r sends (r + 2j) % 3 rows of 2 elements to rank j (some of them empty)
    rows_to = [(me + 2 * j) % 3 for j in range(n)]
    rows_from = [(j + 2 * me) % 3 for j in range(n)]
    inp = _values(me, 2 * sum(rows_to), torch.int64).view(-1, 2)
    mine = torch.empty(sum(rows_from), 2, dtype=torch.int64)
    ref = torch.empty_like(mine)
    ALGORITHMS["all_to_all"]["pairwise"].run(mine, inp, peers, rows_from, rows_to)
    dist.all_to_all_single(ref, inp, rows_from, rows_to, group=group)
    expect(torch.equal(mine, ref), "all_to_all pairwise uneven")
    return bad


def _world(rank, world):
    return _check_all(None)


def _subgroup(rank, world):
    # group ranks differ from global ranks: global 1, 2, 3 are group ranks 0, 1, 2
    sub = dist.new_group([1, 2, 3])
    pair = dist.new_group([0, 2])
    bad = _check_all(sub) if rank in (1, 2, 3) else []
    bad += _check_all(pair) if rank in (0, 2) else []
    return bad + _check_all(None)


@pytest.mark.parametrize("nproc", [2, 3])
def test_algorithms_match_gloo_on_the_world(nproc):
    for bad in spawn(_world, nproc, timeout_s=120):
        assert not bad, bad


def test_algorithms_match_gloo_on_subgroups_of_four():
    for bad in spawn(_subgroup, 4, timeout_s=120):
        assert not bad, bad


def test_registry_is_consistent():
    for op, algs in ALGORITHMS.items():
        for name, alg in algs.items():
            assert (alg.op, alg.name) == (op, name)
    assert ALGORITHMS["all_gather"]["recursive_doubling"].applies_to(4)
    assert not ALGORITHMS["all_gather"]["recursive_doubling"].applies_to(6)
    assert ALGORITHMS["all_reduce"]["recursive_doubling"].applies_to(6)
    assert reduce_op_name(dist.ReduceOp.AVG) is None
