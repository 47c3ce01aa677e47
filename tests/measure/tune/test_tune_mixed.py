"""The mixed backend on real gloo ranks: interleaved async ops of several groups and backends finish, and give
what a gloo-only run gives; DDP trains to the same weights.

The table (tune_tables.WINNERS) sends small all_reduces to recursive doubling, middle ones to gloo, large
ones to ring, and so on for every op, so one program exercises every algorithm next to gloo.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from commscope.measure.launch import spawn  # noqa: E402
from commscope.measure.tune.mixed import MIXED_BACKEND, TUNING_ENV, MixedProcessGroup, register  # noqa: E402
from commscope.measure.tune.files import write_table  # noqa: E402
from commscope.measure.tune.table import machine_here  # noqa: E402

from tune_tables import synthetic_table  # noqa: E402


@pytest.fixture(scope="module")
def tuning(tmp_path_factory):
    register()  # forked ranks inherit the registration
    path = tmp_path_factory.mktemp("tuning") / "tuning.json"
    write_table(synthetic_table(machine=machine_here()), path)
    return {TUNING_ENV: str(path)}


def _values(rank: int, numel: int, dtype, salt: int):
    if dtype.is_floating_point:
        return torch.randn(numel, generator=torch.Generator().manual_seed(97 * rank + salt), dtype=dtype)
    return (torch.arange(numel, dtype=dtype) * (rank + 1) + salt) % 1000


def _programs(groups: dict[str, object], rank: int, dtype):
    """Per group, the ops it runs in program order: (op name, size in bytes for routing, issue(async) -> outputs)."""
    return {gname: _program(gname, g, rank, dtype) for gname, g in groups.items()
            if g != dist.GroupMember.NON_GROUP_MEMBER}


def _program(gname: str, g, rank: int, dtype) -> list:
    n, me = dist.get_world_size(g), dist.get_rank(g)
    el = torch.tensor([], dtype=dtype).element_size()
    salt = len(gname)

    def all_reduce(numel):
        t = _values(rank, numel, dtype, salt)
        return [t], dist.all_reduce(t, group=g, async_op=True)

    def all_gather(numel):
        out = torch.empty(n * numel, dtype=dtype)
        return [out], dist.all_gather_single(out, _values(rank, numel, dtype, salt), group=g, async_op=True)

    def reduce_scatter(numel):
        out = torch.empty(numel, dtype=dtype)
        return [out], dist.reduce_scatter_single(out, _values(rank, n * numel, dtype, salt), group=g, async_op=True)

    def all_to_all(numel):
        out = torch.empty(n * numel, dtype=dtype)
        return [out], dist.all_to_all_single(out, _values(rank, n * numel, dtype, salt), group=g, async_op=True)

    def uneven():  # group rank i sends (i + j) % 3 + 1 rows of 2 to group rank j
        to = [(me + j) % 3 + 1 for j in range(n)]
        frm = [(j + me) % 3 + 1 for j in range(n)]
        out = torch.empty(sum(frm), 2, dtype=dtype)
        inp = _values(rank, 2 * sum(to), dtype, salt).view(-1, 2)
        return [out], dist.all_to_all_single(out, inp, frm, to, group=g, async_op=True)

    def broadcast(numel, root):
        t = _values(rank, numel, dtype, salt)
        return [t], dist.broadcast(t, group_src=root, group=g, async_op=True)

    def barrier():
        return [], dist.barrier(group=g, async_op=True)

    if n == 4:
        return [("all_reduce", 64 * el, lambda: all_reduce(64)),  # 512 B (int64, fp64): recursive doubling
                ("all_reduce", 1000 * el, lambda: all_reduce(1000)),  # 8 KB: gloo
                ("all_gather", 4 * 40 * el, lambda: all_gather(40)),  # 1.3 KB: recursive doubling
                ("all_reduce", 5000 * el, lambda: all_reduce(5000)),  # 40 KB: ring
                ("reduce_scatter", 4 * 100 * el, lambda: reduce_scatter(100)),  # 3.2 KB: ring
                ("all_to_all", 4 * 10 * el, lambda: all_to_all(10)),  # 320 B: bruck
                ("all_to_all", None, uneven),  # split sizes: native
                ("broadcast", 2000 * el, lambda: broadcast(2000, 1)),  # 16 KB: binomial
                ("barrier", None, barrier),
                ("all_to_all", 4 * 1000 * el, lambda: all_to_all(1000))]  # 32 KB: pairwise
    if n == 2:
        return [("all_reduce", 3000 * el, lambda: all_reduce(3000)),  # ring
                ("all_to_all", 2 * 8 * el, lambda: all_to_all(8)),  # bruck
                ("broadcast", 256 * el, lambda: broadcast(256, 1)),  # binomial
                ("reduce_scatter", 2 * 8 * el, lambda: reduce_scatter(8))]  # recursive halving
    # 3 ranks: measured at 4; power-of-two algorithms give way
    return [("all_reduce", 100 * el, lambda: all_reduce(100)),  # recursive doubling (any n)
            ("all_gather", 3 * 500 * el, lambda: all_gather(500)),  # recursive doubling -> gloo
            ("reduce_scatter", 3 * 10 * el, lambda: reduce_scatter(10)),  # recursive halving -> gloo
            ("all_to_all", 3 * 7 * el, lambda: all_to_all(7)),  # bruck
            ("all_gather", 3 * 10 * el, lambda: all_gather(10))]  # ring


def _run(groups: dict[str, object], rank: int, dtype):
    """Issue every group's ops asynchronously, interleaving groups in a rank-dependent order, then wait for all
    in an order that differs between ranks; return each group's outputs and where each op was routed."""
    progs = _programs(groups, rank, dtype)
    names = sorted(progs)
    names = names[rank % len(names):] + names[:rank % len(names)]  # each rank starts with another group
    cursors = {gname: 0 for gname in names}
    issued = []
    while any(cursors[g] < len(progs[g]) for g in names):
        for gname in names:
            k = cursors[gname]
            if k < len(progs[gname]):
                outs, work = progs[gname][k][2]()
                issued.append((gname, k, outs, work))
                cursors[gname] += 1
    for _, _, _, work in (reversed(issued) if rank % 2 else issued):
        work.wait()
    results = {(gname, k): [o.clone() for o in outs] for gname, k, outs, _ in issued}
    routes = {}
    for gname, prog in progs.items():
        pg = groups[gname]
        for k, (op, size, _) in enumerate(prog):
            if isinstance(pg, MixedProcessGroup):
                routes[gname, k] = (pg.router.backend_for(op, size, "cpu") or "gloo") if size is not None else "gloo"
    return results, routes


def _mixed_vs_gloo(rank, world):
    assert isinstance(dist.group.WORLD, MixedProcessGroup)
    sets = {"world": [0, 1, 2, 3], "pair01": [0, 1], "pair23": [2, 3], "triple": [1, 2, 3]}
    mixed = {name: (dist.group.WORLD if name == "world" else dist.new_group(ranks)) for name, ranks in sets.items()}
    gloo = {name: dist.new_group(ranks, backend="gloo") for name, ranks in sets.items()}
    out = {}
    for dtype in (torch.int64, torch.float64):
        got, routes = _run(mixed, rank, dtype)
        want, _ = _run(gloo, rank, dtype)
        assert got.keys() == want.keys()
        for key in got:
            for a, b in zip(got[key], want[key]):
                ok = torch.equal(a, b) if not dtype.is_floating_point else torch.allclose(a, b, rtol=1e-12, atol=1e-12)
                assert ok, (rank, dtype, key, routes.get(key))
        out[str(dtype)] = routes
    # an op the algorithm refuses (output one element too long) fails at wait(), on every rank, and the group
    # goes on working
    work = dist.all_gather_single(torch.empty(4 * 40 + 1, dtype=torch.int64), torch.zeros(40, dtype=torch.int64),
                                  async_op=True)
    with pytest.raises(ValueError, match="expected 4 x 40"):
        work.wait()
    t = torch.ones(64, dtype=torch.int64)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((64,), 4))
    return out


def test_interleaved_async_ops_of_several_groups_and_backends(tuning):
    results = spawn(_mixed_vs_gloo, 4, backend=MIXED_BACKEND, env=tuning, timeout_s=90)
    used = {backend for r in results for routes in r.values() for backend in routes.values()}
    # every algorithm ran beside gloo
    assert used == {"gloo", "ring", "recursive_doubling", "recursive_halving", "bruck", "pairwise", "binomial"}
    triple = {k: v for k, v in results[1]["torch.int64"].items() if k[0] == "triple"}
    assert triple[("triple", 1)] == "gloo" and triple[("triple", 2)] == "gloo"  # power-of-two ones gave way


def _ddp_and_fsdp2(rank, world, steps):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    gloo = dist.new_group(list(range(world)), backend="gloo")
    meshes = {"mixed": DeviceMesh.from_group(dist.group.WORLD, "cpu"), "gloo": DeviceMesh.from_group(gloo, "cpu")}

    def model(perturb: bool):
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 500),
                                torch.nn.Linear(500, 3))
        if perturb and rank == 1:  # DDP's first broadcast must make the replicas equal
            with torch.no_grad():
                for p in m.parameters():
                    p.add_(0.1)
        return m

    def train(wrapped, params):
        opt = torch.optim.SGD(params, lr=0.01)
        data = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            opt.zero_grad()
            wrapped(torch.randn(16, 40, generator=data)).square().mean().backward()
            opt.step()

    out = {}
    for name, pg in (("mixed", None), ("gloo", gloo)):
        m = model(perturb=True)
        train(torch.nn.parallel.DistributedDataParallel(m, process_group=pg, bucket_cap_mb=0.05), m.parameters())
        out["ddp", name] = [p.detach().numpy().copy() for p in m.parameters()]
        m = model(perturb=False)
        for layer in m:
            fully_shard(layer, mesh=meshes[name])
        fully_shard(m, mesh=meshes[name])
        train(m, m.parameters())
        out["fsdp2", name] = [p.full_tensor().detach().numpy().copy() for p in m.parameters()]
    routed = dist.group.WORLD.router
    routes = sorted({routed.backend_for("all_reduce", p.nbytes, "cpu") for p in out["ddp", "gloo"]})
    # numpy, not tensors: once FSDP2 has imported torch.multiprocessing, a tensor would travel to the parent as
    # a shared-memory handle that dies with this rank
    return out, routes


def test_ddp_and_fsdp2_with_the_mixed_backend_train_as_gloo_does(tuning):
    results = spawn(_ddp_and_fsdp2, 2, args=(3,), backend=MIXED_BACKEND, env=tuning, timeout_s=90)
    for out, routes in results:
        # 2 ranks: every float sum is a + b on both backends, so the weights agree bit for bit
        for kind in ("ddp", "fsdp2"):
            for a, b in zip(out[kind, "mixed"], out[kind, "gloo"]):
                assert np.isfinite(a).all() and np.array_equal(a, b), kind
        assert "ring" in routes or "recursive_doubling" in routes
    for a, b in zip(results[0][0]["ddp", "mixed"], results[1][0]["ddp", "mixed"]):
        assert np.array_equal(a, b)  # replicas stay identical


def test_the_worker_runs_ops_in_issue_order_and_hands_errors_to_the_waiter():
    from commscope.measure.tune.mixed import _Worker

    worker = _Worker("test")
    seen: list[int] = []
    t = torch.zeros(1)
    works = [worker.submit(lambda k=k: seen.append(k), [t]) for k in range(50)]
    failed = worker.submit(lambda: 1 / 0, [t])
    after = worker.submit(lambda: seen.append(50), [t])
    for w in works:
        w.wait()
    with pytest.raises(Exception, match="division by zero"):
        failed.wait()
    after.wait()
    assert seen == list(range(51))
    assert after.get_future().value()[0] is t
    worker.stop()
