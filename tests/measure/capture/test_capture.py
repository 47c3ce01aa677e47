"""Recording real gloo ranks: every op of DDP, FSDP2, DTensor TP (+SP) and pipelining is seen, exactly."""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from commscope.measure.capture import pg as cpg  # noqa: E402
from commscope.measure.capture.recorder import RankLog  # noqa: E402
from commscope.io.oplog import read_ops_jsonl  # noqa: E402
from commscope.measure.launch import spawn  # noqa: E402

ENV = {cpg.INNER_BACKEND_ENV: "gloo"}


@pytest.fixture(scope="module", autouse=True)
def _registered():
    cpg.register()


def _with_log(logdir: str):
    log = RankLog(Path(logdir), batch=8)
    cpg.set_sink(log)
    return log


def _ops(logdir: Path, rank: int, *, timed: bool = True):
    log = read_ops_jsonl(logdir / f"rank{rank:05d}.jsonl")
    assert not log.problems, log.problems
    if timed:  # every op of a real run is seen complete: gloo's future-less works (reduce-scatter, p2p) too
        untimed = [o for o in log.ops if o.t_end_ns is None or o.t_end_ns < o.t_start_ns]
        assert not untimed, untimed[:3]
    return log


def _ddp(rank, world, logdir):
    log = _with_log(logdir)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        ddp(torch.randn(8, 16)).sum().backward()
        opt.step()
    log.close()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_ddp_reducer_all_reduces_are_recorded(tmp_path):
    param_bytes = spawn(_ddp, 2, args=(str(tmp_path),), backend="commscope", env=ENV, timeout_s=120)[0]
    for rank in range(2):
        ops = _ops(tmp_path, rank).ops
        grads = [o for o in ops if o.op == "all_reduce"]
        # DDP's C++ reducer: every gradient byte all-reduced once per step (2 steps)
        assert sum(o.size_bytes for o in grads) == 2 * param_bytes
        assert all(o.group == (0, 1) and o.rank == rank and o.dtype == "fp32" for o in grads)
        assert all(o.t_end_ns is not None and o.t_end_ns >= o.t_start_ns for o in grads)
        # setup: DDP broadcasts the parameters from rank 0 once
        assert sum(o.size_bytes for o in ops if o.op == "broadcast") >= param_bytes


def _fsdp(rank, world, logdir):
    from torch.distributed.fsdp import fully_shard

    log = _with_log(logdir)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    model(torch.randn(4, 16)).sum().backward()
    log.close()
    return [p.numel() for p in model.parameters()]


def test_fsdp2_gathers_and_reduce_scatters(tmp_path):
    spawn(_fsdp, 2, args=(str(tmp_path),), backend="commscope", env=ENV, timeout_s=120)
    ops = _ops(tmp_path, 0).ops
    layer_bytes = (16 * 16 + 16) * 4
    gathers = [o for o in ops if o.op == "all_gather"]
    scatters = [o for o in ops if o.op == "reduce_scatter"]
    # each layer: all-gather forward, again backward (reshard after forward), reduce-scatter its gradients
    assert [o.size_bytes for o in gathers] == [layer_bytes] * 4
    assert [o.size_bytes for o in scatters] == [layer_bytes] * 2
    assert all(o.backend_op == "all_reduce" for o in scatters)  # gloo runs reduce_scatter as all_reduce



def _coalesced_async(rank, world, logdir):
    """Rank 0 issues coalesced all-gathers and reduce-scatters (FSDP2's and DTensor's path) before rank 1 joins:
    the issue must return at once, as on the plain backend, and the results be those of the plain backend."""
    from datetime import timedelta

    from torch.distributed.distributed_c10d import _get_default_store

    log = _with_log(logdir)
    store = _get_default_store()
    group = dist.group.WORLD
    inputs = [torch.full((4,), float(rank + 1)), torch.full((2,), float(10 * (rank + 1)))]
    gathered = [torch.zeros(8), torch.zeros(4)]
    scattered = [torch.zeros(2), torch.zeros(1)]

    def issue():
        with dist._coalescing_manager(group, async_ops=True) as gathers:
            for out, inp in zip(gathered, inputs):
                dist.all_gather_single(out, inp, group=group)
        with dist._coalescing_manager(group, async_ops=True) as scatters:
            for out, inp in zip(scattered, inputs):
                dist.reduce_scatter_single(out, inp, group=group)
        return gathers, scatters

    if rank == 0:
        works = issue()
        store.set("issued", "1")  # only now may rank 1 join: a recorder that waited inside the issue hangs here
    else:
        store.wait(["issued"], timedelta(seconds=20))
        works = issue()
    for cm in works:
        cm.wait()
    log.close()
    return [t.tolist() for t in gathered + scattered]


def test_coalesced_gathers_and_reduce_scatters_stay_asynchronous(tmp_path):
    results = spawn(_coalesced_async, 2, args=(str(tmp_path),), backend="commscope", env=ENV, timeout_s=120)
    for rank in range(2):
        gathered_a, gathered_b, scattered_a, scattered_b = results[rank]
        assert gathered_a == [1.0] * 4 + [2.0] * 4 and gathered_b == [10.0] * 2 + [20.0] * 2
        assert scattered_a == [3.0, 3.0] and scattered_b == [30.0]
        ops = _ops(tmp_path, rank).ops
        assert [(o.op, o.size_bytes) for o in ops] == [("all_gather", 32), ("all_gather", 16),
                                                       ("reduce_scatter", 16), ("reduce_scatter", 8)]

def _let_go(rank, world, logdir):
    """On real gloo: an all_reduce waited on, a reduce-scatter and a send/recv let go of unwaited (their Works have
    no future; gloo's reduce-scatter Work never says it completed), then an all_reduce whose Work is followed only
    through its future, as DDP's buckets are."""
    import gc

    log = _with_log(logdir)
    x, out = torch.ones(4), torch.zeros(2)
    waited = dist.all_reduce(x, async_op=True)
    kinds = [type(waited).__name__]
    waited.wait()
    work = dist.reduce_scatter_single(out, x, async_op=True)
    kinds.append(type(work).__name__)
    work._inner.wait()  # the job lets go of it without our wait: its record goes out then
    peer = 1 - rank
    p2p = dist.isend(x, peer) if rank == 0 else dist.irecv(x, peer)
    kinds.append(type(p2p).__name__)
    p2p._inner.wait()
    del waited, work, p2p
    gc.collect()
    written_after_let_go = log.num_records
    fut = dist.all_reduce(x, async_op=True).get_future()
    fut.wait()
    log.step = 0  # a step mark looks at the ops in flight: the followed one is complete
    log.close()
    return kinds, written_after_let_go


def test_works_without_a_future_are_written_when_let_go_on_real_gloo(tmp_path):
    """The Work wrapper is picked once per op: only ops whose Works have no future (gloo's reduce-scatter, p2p) pay
    for the __del__ that writes a record nothing else would; the others are stamped by wait() or a later look."""
    results = spawn(_let_go, 2, args=(str(tmp_path),), backend="commscope", env=ENV, timeout_s=120)
    for rank, (kinds, written) in enumerate(results):
        assert kinds == ["_TimedWork", "_UnfollowedWork", "_UnfollowedWork"]
        assert written == 3  # the all_reduce, the reduce-scatter and the p2p op, before the followed one
        ops = _ops(tmp_path, rank, timed=False).ops
        assert [o.op for o in ops] == ["all_reduce", "reduce_scatter", "send" if rank == 0 else "recv", "all_reduce"]
        ends = [o.t_end_ns is not None and o.t_end_ns >= o.t_start_ns for o in ops]
        # gloo's reduce-scatter never says it completed: let go of, it has no end; the p2p Work says so
        assert ends == [True, False, True, True]


def _tp(rank, world, logdir, sequence_parallel):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    log = _with_log(logdir)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    block = torch.nn.ModuleDict({"norm": torch.nn.LayerNorm(16), "up": torch.nn.Linear(16, 32),
                                 "down": torch.nn.Linear(32, 16)})
    if sequence_parallel:
        plan = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
                "down": RowwiseParallel(output_layouts=Shard(1))}
    else:
        plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    parallelize_module(block, mesh, plan)
    x = torch.randn(2, 8, 16)
    if sequence_parallel:
        x = x.chunk(world, dim=1)[rank]
    setup_ops = log.num_records
    y = block["down"](torch.relu(block["up"](block["norm"](x))))
    y.sum().backward()
    log.close()
    return setup_ops


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_dtensor_tensor_parallel(tmp_path, sequence_parallel):
    setup = spawn(_tp, 2, args=(str(tmp_path), sequence_parallel), backend="commscope", env=ENV, timeout_s=120)[0]
    ops = _ops(tmp_path, 0).ops[setup:]
    act = 2 * 8 * 16 * 4  # (b, s, h) fp32
    kinds = sorted((o.op, o.size_bytes) for o in ops)
    if sequence_parallel:
        # forward: all-gather the sequence before up, reduce-scatter after down; backward: the conjugates
        assert kinds.count(("all_gather", act)) >= 2 and kinds.count(("reduce_scatter", act)) >= 2
    else:
        # forward all-reduce after the row-parallel layer; backward all-reduce of the column layer's input grad
        assert kinds.count(("all_reduce", act)) == 2


def _pipeline(rank, world, logdir, schedule_name):
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, Schedule1F1B

    log = _with_log(logdir)
    torch.manual_seed(0)
    stage_mod = torch.nn.Linear(16, 16)
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    sched = cls(stage, n_microbatches=4, loss_fn=lambda out, tgt: out.sum())
    x = torch.randn(8, 16)
    if rank == 0:
        sched.step(x)
    else:
        sched.step(target=torch.zeros(8, 16), losses=[])
    log.close()


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_pipelining_p2p(tmp_path, schedule):
    spawn(_pipeline, 2, args=(str(tmp_path), schedule), backend="commscope", env=ENV, timeout_s=120)
    mb_bytes = 2 * 16 * 4  # micro-batch of 2 rows of 16 fp32
    for rank, (send_peer, recv_peer) in ((0, (1, 1)), (1, (0, 0))):
        ops = _ops(tmp_path, rank).ops
        sends = [o for o in ops if o.op == "send" and o.size_bytes == mb_bytes]
        recvs = [o for o in ops if o.op == "recv" and o.size_bytes == mb_bytes]
        # 4 micro-batches: activations forward from stage 0, gradients back from stage 1
        assert len(sends) == 4 and len(recvs) == 4, [(o.op, o.size_bytes) for o in ops]
        assert {o.peer for o in sends} == {send_peer}
        assert all(o.t_end_ns is not None for o in sends + recvs)


def _rooted(rank, world, logdir):
    """Every rooted collective from (or into) a rank other than the group's first, one on a subgroup."""
    log = _with_log(logdir)
    dist.broadcast(torch.ones(1024), src=2)  # 4096 B each
    dist.reduce(torch.ones(1024), dst=1)
    out = [torch.zeros(256) for _ in range(world)] if rank == 2 else None
    dist.gather(torch.ones(256), out, dst=2)  # 1024 B from each rank
    parts = [torch.ones(512) for _ in range(world)] if rank == 1 else None
    dist.scatter(torch.zeros(512), parts, src=1)  # 2048 B to each rank
    pair = dist.new_group([1, 2])
    if rank in (1, 2):
        dist.broadcast(torch.ones(64), src=2, group=pair)  # 256 B; c10d hands the group's rank 1 to the backend
    log.close()


def test_rooted_collectives_keep_their_root_and_the_matrix_follows_it(tmp_path):
    """The recorder kept broadcast's and reduce's root, as a global rank, but not gather's and scatter's; the traffic
    matrix ignored every root and started each rooted op at its group's first rank (broadcast 0 -> 1 -> 2, gather
    into rank 0, ...). 3 gloo ranks: each record names its root's global rank, and `summarize` draws every op from
    (or into) it, ring order kept (broadcast from 2 over (0, 1, 2) runs 2 -> 0 -> 1)."""
    from commscope.cli.main import main

    spawn(_rooted, 3, args=(str(tmp_path / "logs"),), backend="commscope", env=ENV, timeout_s=120)
    for rank in range(3):
        ops = _ops(tmp_path / "logs", rank).ops
        roots = [(o.op, o.group, dict(o.extra).get("root")) for o in ops]
        pair = [("broadcast", (1, 2), 2)] if rank in (1, 2) else []
        assert roots == [("broadcast", (0, 1, 2), 2), ("reduce", (0, 1, 2), 1), ("gather", (0, 1, 2), 2),
                         ("scatter", (0, 1, 2), 1), *pair]
    out = tmp_path / "summary"
    assert main(["summarize", str(tmp_path / "logs"), "--out", str(out)]) == 0
    rows = [line.split(",") for line in (out / "measured_logical.csv").read_text().splitlines()[1:]]
    assert {(int(r[0]), int(r[1])): int(r[3]) for r in rows} == {
        (2, 0): 4096 + 4096,  # broadcast from 2, then reduce into 1: 2 -> 0 -> 1
        (0, 1): 4096 + 4096,
        (0, 2): 1024,  # gather into 2
        (1, 2): 1024 + 2048,  # gather into 2, scatter from 1
        (1, 0): 2048,  # scatter from 1
        (2, 1): 256,  # broadcast from 2 over (1, 2)
    }


def _user_job(rank, world, logdir, store_path, crash):
    """A user's script: record() first, then its own init_process_group('gloo')."""
    import commscope.measure.capture

    with commscope.measure.capture.record(logdir, batch=4, flush_s=60):
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
        assert isinstance(dist.group.WORLD, cpg.RecordingProcessGroup)
        t = torch.ones(256)
        for i in range(10):
            dist.all_reduce(t)
            if crash and rank == 1 and i == 6:
                os._exit(3)  # a crash: no flush, no cleanup
        dist.destroy_process_group()


def _run_user_job(tmp_path: Path, crash: bool):
    return _fork_ranks(_user_job, str(tmp_path / "logs"), str(tmp_path / "store"), crash)


def _fork_ranks(target, *args):
    """Exit codes of 2 forked ranks running ``target(rank, 2, *args)`` (a user's job, which starts its own group)."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=(r, 2, *args)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        if p.is_alive():
            p.kill()
    return [p.exitcode for p in procs]


def test_record_context_manager_wraps_a_users_gloo_job(tmp_path):
    codes = _run_user_job(tmp_path, crash=False)
    assert codes == [0, 0]
    for rank in range(2):
        log = _ops(tmp_path / "logs", rank)
        assert log.header.get("kind") == "measured" and log.header.get("rank") == rank
        assert [o.op for o in log.ops] == ["all_reduce"] * 10
        assert all(o.size_bytes == 1024 for o in log.ops)


def test_crashed_rank_keeps_its_flushed_batches(tmp_path):
    codes = _run_user_job(tmp_path, crash=True)
    assert codes[1] == 3
    log = read_ops_jsonl(tmp_path / "logs" / "rank00001.jsonl")
    # batches of 4 records: the 6 completed all-reduces before the crash keep at least one full batch
    assert 4 <= len(log.ops) <= 7
    # and a torn final line is reported, never fatal
    path = tmp_path / "logs" / "rank00001.jsonl"
    path.write_text(path.read_text() + '{"op": "all_re')
    torn = read_ops_jsonl(path)
    assert len(torn.ops) == len(log.ops) and any("truncated" in p for p in torn.problems)


class _LateWork:
    """A Work that completes only when the test says so."""

    def __init__(self, future: bool = True):
        self.fut = torch.futures.Future() if future else None
        self.done = False
        self.waited = False

    def get_future(self):
        if self.fut is None:
            raise RuntimeError("Work::getFuture not implemented")
        return self.fut

    def is_completed(self):
        return self.done

    def wait(self, timeout=None):
        self.waited = True
        return True


def _late_group(log):
    cpg.set_sink(log)
    return cpg.RecordingProcessGroup(None, 0, 1, [0], "g", "gloo", log)


def _issue(group, work, op="all_reduce"):
    group._start()
    return group._record(op, work, size_bytes=4, dtype="fp32", bytes_in=4, bytes_out=4)


def test_step_is_the_one_current_at_issue_not_at_completion(tmp_path):
    """DDP's last bucket can complete after the loop moved to the next step: it still belongs to its own."""
    log = RankLog(tmp_path, batch=1)
    group = _late_group(log)
    try:
        works = []
        for step in (None, 0):  # one op during setup, one in step 0, both completing later
            log.step = step
            works.append(_LateWork())
            _issue(group, works[-1])
        log.step = 1
        t_done = time.time_ns()
        for w in works:
            w.done = True
        log.step = 2  # a step mark looks at the ops in flight
        assert not cpg._INFLIGHT
        log.close()
    finally:
        cpg.set_sink(None)
    ops = _ops(tmp_path, 0).ops
    assert [dict(o.extra).get("step") for o in ops] == [None, 0]
    assert all(o.t_end_ns >= t_done for o in ops)  # stamped when seen complete, not when issued


class _FailingWork(_LateWork):
    def wait(self, timeout=None):
        raise RuntimeError("Connection closed by peer")


def test_a_blocking_op_is_waited_inside_and_its_record_kept_when_it_fails(tmp_path):
    """dist.all_reduce(t) (opts.asyncOp False): the process group waits on the backend's Work itself and hands that
    Work back (no wrapper); the record has its end. When the wait fails, the job sees the backend's error and the
    record still goes out, without an end."""
    log = RankLog(tmp_path, batch=1)
    group = _late_group(log)
    blocking = dist.AllreduceOptions()
    blocking.asyncOp = False
    try:
        log.step = 0
        ok = _LateWork()
        group._start()
        assert group._record("all_reduce", ok, 4, "fp32", 4, 4, opts=blocking) is ok and ok.waited
        group._start()
        with pytest.raises(RuntimeError, match="closed by peer"):
            group._record("all_reduce", _FailingWork(), 8, "fp32", 8, 8, opts=blocking)
        assert not cpg._INFLIGHT
        log.close()
    finally:
        cpg.set_sink(None)
    ops = _ops(tmp_path, 0, timed=False).ops
    assert [(o.size_bytes, o.t_end_ns is not None) for o in ops] == [(4, True), (8, False)]
    assert ops[0].t_end_ns >= ops[0].t_start_ns


def test_an_issued_op_whose_wait_fails_goes_out_without_an_end(tmp_path):
    """work = dist.all_reduce(t, async_op=True); work.wait() raises (a peer gone): the job sees the backend's error,
    and the record is written at once without an end, not stamped complete later (gloo marks a failed Work
    completed, and the next look at the ops in flight would have given it the time of that look)."""
    log = RankLog(tmp_path, batch=1)
    group = _late_group(log)
    try:
        log.step = 0
        failing = _FailingWork()
        failing.done = True  # what gloo says of a failed Work
        handle = _issue(group, failing)
        with pytest.raises(RuntimeError, match="closed by peer"):
            handle.wait()
        assert not cpg._INFLIGHT and log.num_records == 1
        log.close()
    finally:
        cpg.set_sink(None)
    (op,) = _ops(tmp_path, 0, timed=False).ops
    assert op.t_end_ns is None


class _Keeping(RankLog):
    """A log that keeps the named fields of every record it writes (recorder.record_fields)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict] = []

    def flush(self) -> None:
        from commscope.measure.capture.oprecord import record_fields

        self.seen += [record_fields(rec) for rec in list(self.buf) if isinstance(rec, list)]
        super().flush()


def test_all_reduce_records_as_every_op_does(tmp_path):
    """allreduce (the most frequent op) reads its tensor in its own frame, for speed: its record must be the one
    the shared path makes of the same op, field for field, and its line the same."""
    from commscope.measure.capture.recorder import _line

    class Inner:
        def allreduce(self, tensors, opts=None):
            work = _LateWork()
            work.done = True
            return work

    log = _Keeping(tmp_path, batch=1)
    cpg.set_sink(log)
    group = cpg.RecordingProcessGroup(Inner(), 1, 2, [3, 5], "g", "gloo", log)
    blocking = dist.AllreduceOptions()
    blocking.asyncOp = False
    try:
        for step in (None, 4):
            log.step = step
            for dtype, opts in ((torch.bfloat16, None), (torch.complex64, blocking)):
                x = torch.ones(3, dtype=dtype)
                handle = group.allreduce([x], opts)
                if opts is None:
                    handle.wait()
                group._start()
                group._record("all_reduce", _LateWork(), x.numel() * x.element_size(), cpg._dtype_name(x.dtype),
                              x.numel() * x.element_size(), x.numel() * x.element_size()).wait()
        log.close()
    finally:
        cpg.set_sink(None)
    seen = log.seen
    assert len(seen) == 8 and [rec["dtype"] for rec in seen] == ["bf16", "bf16", "complex64", "complex64"] * 2
    for fast, shared in zip(seen[::2], seen[1::2]):
        assert fast["seq"] + 1 == shared["seq"]
        fast = {**fast, "seq": shared["seq"], "t_start_ns": shared["t_start_ns"], "t_end_ns": shared["t_end_ns"]}
        assert fast == shared and _line(fast) == _line(shared)


def test_log_lines_are_the_commop_json(tmp_path):
    """The recorder writes its lines by hand (speed): they must be exactly json.dumps of the CommOp dict."""
    from commscope.measure.capture.recorder import _line, _to_commop_dict

    base = {"op": "all_reduce", "group": [0, 1], "rank": 1, "size_bytes": 4, "dtype": "fp32", "t_start_ns": 10,
            "backend": "gloo", "group_name": "0", "seq": 1, "bytes_in": 4, "bytes_out": 4}
    variants = [base, {**base, "t_end_ns": 20, "step": 3}, {**base, "step": None, "root": 0},
                {**base, "op": "send", "peer": 0, "group_name": 'we"ird\\name\n', "dtype": "torch.complex64"},
                {**base, "op": "all_to_all", "splits": [0, 8, 16], "backend_op": "all_to_all", "step": 0},
                {**base, "op": "reduce_scatter", "backend_op": "all_reduce", "t_end_ns": None}]
    for rec in variants:
        assert _line(rec) == json.dumps(_to_commop_dict(rec), separators=(",", ":"))


def test_completion_is_stamped_by_the_jobs_thread(tmp_path):
    """wait() returning stamps an op; the next op issued stamps those already complete; ops never seen
    complete are written at the end without a completion time; a future-less op let go of unwaited goes
    out at once (gloo's reduce-scatter works never report completion)."""
    log = RankLog(tmp_path, batch=1)
    group = _late_group(log)
    try:
        waited, followed, never, dropped = _LateWork(), _LateWork(), _LateWork(), _LateWork(future=False)
        handle = _issue(group, waited)
        assert isinstance(handle, torch.distributed.Work) and log.num_records == 0
        handle.wait()
        assert waited.waited and log.num_records == 1
        _issue(group, followed)
        followed.done = True
        _issue(group, never)  # issuing an op looks at those in flight: `followed` is complete
        assert log.num_records == 2
        handle = _issue(group, dropped, "reduce_scatter")  # (asked once per op whether its Works have a future)
        assert isinstance(handle, cpg._LetGo)
        del handle
        gc.collect()
        assert log.num_records == 3
        log.close()
    finally:
        cpg.set_sink(None)
    ops = _ops(tmp_path, 0, timed=False).ops
    assert [o.t_end_ns is not None for o in ops] == [True, True, False, False]
    assert [dict(o.extra)["seq"] for o in ops] == [1, 2, 4, 3]



def test_recorded_lines_are_those_of_the_records(tmp_path):
    """What a real recording process group writes (lines from its prepared forms) reads back as the records it
    handed the log, field for field."""
    log = _Keeping(tmp_path, batch=4)
    group = _late_group(log)
    try:
        for step in (None, 0, 1):
            log.step = step
            for size in (4, 1 << 33):
                work = _LateWork()
                work.done = True
                group._start()
                group._record("all_reduce", work, size, "bf16", size, 2 * size).wait()
        _issue(group, _LateWork())  # one never seen complete: no t_end_ns
        log.close()
    finally:
        cpg.set_sink(None)
    from commscope.measure.capture.recorder import _to_commop_dict

    seen = log.seen
    ops = _ops(tmp_path, 0, timed=False).ops
    assert len(ops) == len(seen) == 7
    for op, rec in zip(ops, seen):
        expected = _to_commop_dict(rec)
        assert {"op": op.op, "group": list(op.group), "size_bytes": op.size_bytes, "dtype": op.dtype, "rank": op.rank,
                "t_start_ns": op.t_start_ns, "t_end_ns": op.t_end_ns, "extra": dict(op.extra)} == {
            k: expected.get(k) for k in ("op", "group", "size_bytes", "dtype", "rank", "t_start_ns", "t_end_ns",
                                         "extra")}


def test_a_coalesced_batch_let_go_is_followed_when_its_work_has_a_future(tmp_path):
    """A coalesced batch of several ops (one Work): let go of unwaited, its records stay in flight when its Work has a
    future (something follows it; on NCCL, wait() returns before the GPU is done) and get their end when seen
    complete; without a future they go out at once, with an end only if the Work says it completed."""
    log = RankLog(tmp_path, batch=1)
    group = _late_group(log)
    members = [(8, "fp32", 8, 16, None), (4, "fp32", 4, 8, None)]
    try:
        log.step = 0
        followed, unfollowed = _LateWork(), _LateWork(future=False)
        group._start()
        handle = group._record_batch(log, "all_gather", followed, members)
        del handle
        gc.collect()
        assert log.num_records == 0 and len(cpg._INFLIGHT) == 2
        followed.done = True
        log.step = 1  # a step mark looks at the ops in flight
        assert log.num_records == 2 and not cpg._INFLIGHT
        group._start()
        handle = group._record_batch(log, "reduce_scatter", unfollowed, members)
        del handle
        gc.collect()
        assert log.num_records == 4 and not cpg._INFLIGHT
        log.close()
    finally:
        cpg.set_sink(None)
    ops = _ops(tmp_path, 0, timed=False).ops
    assert [(o.op, o.size_bytes, o.t_end_ns is not None) for o in ops] == [
        ("all_gather", 8, True), ("all_gather", 4, True), ("reduce_scatter", 8, False), ("reduce_scatter", 4, False)]


def _barrier(rank, world, logdir):
    log = _with_log(logdir)
    dist.all_reduce(torch.ones(16))
    dist.barrier()
    log.close()


def test_a_recorded_barrier_is_read_back(tmp_path):
    """The recorder writes a barrier with dtype 'none' (it moves no data), and every reader refused that record as
    of an unknown dtype: `summarize` of any job that called dist.barrier() printed a problem per rank and left the
    barrier out. 2 gloo ranks: each log reads back without a problem, barrier included."""
    spawn(_barrier, 2, args=(str(tmp_path),), backend="commscope", env=ENV, timeout_s=120)
    for rank in range(2):
        ops = _ops(tmp_path, rank).ops
        assert [(o.op, o.size_bytes) for o in ops] == [("all_reduce", 64), ("barrier", 0)]


def _second_job(rank, world, logdir, store_path, first_logs):
    """A user's script started at the same moment as another job recording into the same folder: the folder was
    empty when record() checked it, and the other job's logs landed there before this job's first write."""
    import shutil

    import commscope.measure.capture

    with commscope.measure.capture.record(logdir, batch=4, flush_s=60):
        dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
        if rank == 0:  # both ranks have checked the folder (init waited for both): the other job's logs land now
            for f in sorted(Path(first_logs).iterdir()):
                shutil.copy2(f, Path(logdir) / f.name)
        dist.barrier()  # held in the log's first batch, as the first ops of a job are
        t = torch.ones(256)
        for _ in range(10):
            dist.all_reduce(t)
        dist.destroy_process_group()


def test_a_job_refused_by_another_jobs_logs_leaves_no_failure_marker_in_them(tmp_path):
    """Two jobs recording into one folder at once through record(): the second is refused at its first write, as it
    must be, but it wrote failure.json into the first job's recording, so `summarize` reported the first job, which
    finished, as failed (issue 36's first case, by the Python API). The refused job now leaves the folder as it was."""
    assert _run_user_job(tmp_path / "first", crash=False) == [0, 0]
    first = tmp_path / "first" / "logs"
    shared = tmp_path / "shared"
    codes = _fork_ranks(_second_job, str(shared), str(tmp_path / "store"), str(first))
    assert all(code != 0 for code in codes)
    assert {p.name: p.read_bytes() for p in shared.iterdir()} == {p.name: p.read_bytes() for p in first.iterdir()}
