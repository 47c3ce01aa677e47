"""Overhead of recording (issue 17: under 5 us of CPU per op per rank on one rank, under 2% of the step time of
the 8-rank 3D reference workload: tp 2 x pp 2 x dp 2, sequence parallelism, FSDP2, 1F1B).

1. Per op: one and two gloo ranks run all-reduces (4 B and 64 KiB; blocking, ``dist.all_reduce(t)``, and issued then
   waited, ``async_op=True``, as DDP, FSDP2, TP and pipelining call ops) inside a training step, in blocks of N ops on
   the plain backend, on a 4-line Python process group that only forwards (the control), on commscope's recording
   process group with recording switched off (it forwards) and with it on (writing a log): one block per mode per
   round, in a random order, hundreds of rounds, in the same processes. The median over rounds of a paired
   difference is the cost per op, with a 95% bootstrap interval, and the one-rank 4 B rows are repeated in fresh
   processes: CPU time of the rank's process (all its threads: the backend's worker too) and of its own thread.
   "Pinned" rows put each rank and its backend's threads on one core of their own (``sched_setaffinity`` before the
   groups start their threads); "free" rows leave them where the OS puts them. On this 2-vCPU VM that is the other
   core, and then a 4 B op costs 17-19 us of the rank's thread against 7 pinned: the thread sleeps on the Work and is
   woken across cores (futex wake-ups, a third of the samples in ``perf``), and whether it sleeps turns on a
   microsecond of timing, so any change to the path, recording or a 4-line forwarder alike, moves the figure by
   -10 to +40 us from one process to the next. Pinned, the same figures agree across processes to a few tenths of
   a microsecond: that is what the recorder itself costs. One more row issues and waits the op through c10d's
   functional collectives (as DTensor and TP do): c10d then calls the process group from C++ and waits on the
   recorder's Work from C++, through pybind11's trampolines both ways.
   Beside it, commscope's own code alone (:func:`bench_python_only`: no backend, the best of 7 loops), and the same
   with the caches cold (:func:`bench_python_cold`), which is what an op costs inside a training step.
2. Step time of the 3D reference training, recording switched on and off step by step inside the same runs, in
   blocks of four steps on, off, off, on after the warm-up (a drift of the shared machine along a block weighs on
   both alike). Each block gives one paired ratio, (on + on) / (off + off) of the slowest rank's step times; the
   headline is the median block ratio over all runs, with a 95% bootstrap interval (blocks resampled within each
   run) and each run's own median. Independently, from what recording costs in CPU: each rank's own thread's CPU
   time per step, on minus off in the same blocks, and the ops it recorded per step; that CPU over the step time
   (one rank's added CPU, what the step sees if only the rank on the critical path counted) and 8 ranks' added
   CPU over the machine's cores (what it sees if the machine were CPU-bound) say what the direct measurement
   should find; ops per step x the one-rank cost per op of part 1 is a floor (there caches are warm: inside the
   8-rank job the same op costs several times more CPU).
   The "off" steps still go through the wrapper: what forwarding costs is part 1's "forward" column (and
   ``--whole-runs`` compares whole runs on the plain backend with recorded ones: what a user sees, but on 2 cores
   for 8 ranks those swing by +-10% from run to run).

    python benchmarks/bench_capture.py             # prints tables and a JSON line (~7 min on 2 cores)
    python benchmarks/bench_capture.py --quick     # fewer ops and steps (a smoke run, ~1 min)
    python benchmarks/bench_capture.py --whole-runs  # adds whole runs unrecorded vs recorded
    python benchmarks/bench_capture.py --step-only --runs 9   # only part 2, nine runs: to A/B a recorder change
    python benchmarks/bench_capture.py --backend nccl   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from commscope.measure.capture import pg as cpg
from commscope.measure.launch import spawn

_MODES = ("plain", "python", "forward", "recorded")
_CONTROL_BACKEND = "commscope_bench_fwd"
_CAN_PIN = hasattr(os, "sched_setaffinity")  # Linux: elsewhere the "pinned" rows run free and say so


class _PythonForwarder(dist.ProcessGroup):
    """The control: the least a Python process group can do, hand all_reduce to the backend. What it costs over the
    plain backend is what any Python backend pays (c10d calling Python, a Python frame, the backend's binding),
    recording or not; on a shared VM it also shows how far a process's memory layout and its thread's handshake with
    the backend's worker move a per-op figure (see bench_per_op)."""

    def __init__(self, inner, rank: int, size: int, name: str) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]
        self._inner = inner
        self._name = name

    def getBackendName(self) -> str:
        return _CONTROL_BACKEND

    @property
    def group_name(self) -> str:  # (as commscope's: functional collectives find the group by it)
        return self._name

    def allreduce(self, tensors, opts=None):
        return self._inner.allreduce(tensors, opts)


def _control_create(opts, pg_options=None):
    """The control over the same backend as commscope's (made by commscope's creator)."""
    return _PythonForwarder(cpg._create(opts).inner, opts.group_rank, opts.group_size, str(opts.group_id))


def _ops_rank(rank: int, world: int, n: int, numel: int, rounds: int, logdir: str, device: str,
              async_op: bool = False, seed: int = 0, pin: bool = False, funcol: bool = False) -> list[dict]:
    import torch
    import torch.distributed._functional_collectives as fc

    from commscope.measure.capture.recorder import RankLog

    if pin and _CAN_PIN:  # this rank and the backend threads its groups start (made below: they inherit it) on one core
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})

    log = RankLog(Path(logdir))
    log.step = 0  # records of a training step, as in a real job
    plain = dist.new_group(list(range(world)), backend=dist.get_backend())  # the backend itself, made alike
    groups = {"plain": plain, "python": dist.new_group(list(range(world)), backend=_CONTROL_BACKEND),
              "forward": dist.new_group(list(range(world)), backend=cpg.BACKEND_NAME)}  # the backend through commscope
    groups["recorded"] = groups["forward"]  # one group, recording switched on and off
    x = torch.ones(numel, device=device)
    cpg.set_sink(None)  # (warm-up unrecorded)
    for group in groups.values():
        for _ in range(20):  # warm up the connections
            dist.all_reduce(x, group=group)
    rng = random.Random(seed)  # every rank draws the same order: their collectives match
    tt = time.thread_time_ns
    out = []
    for _ in range(rounds):  # rounds of one block of n ops per mode, in a fresh random order each round
        row = {}
        order = list(_MODES)
        rng.shuffle(order)
        for mode in order:
            group = groups[mode]
            cpg.set_sink(log if mode == "recorded" else None)
            dist.barrier(group=plain)
            if device != "cpu":
                torch.cuda.synchronize()
            t0, c0, p0 = time.perf_counter_ns(), tt(), time.process_time_ns()
            if funcol:  # from C++: c10d's functional collectives (DTensor, TP) call the process group through the
                for _ in range(n):  # dispatcher, and wait on its Work from C++ (the recorder's wrapper reached back)
                    fc.wait_tensor(fc.all_reduce(x, "sum", group))
            elif async_op:  # as frameworks call: issue, then wait on the Work (the recorder's Work wrapper is in)
                for _ in range(n):
                    dist.all_reduce(x, group=group, async_op=True).wait()
            else:  # a blocking call: c10d waits at once (the recorder waits itself: no wrapper)
                for _ in range(n):
                    dist.all_reduce(x, group=group)
            if device != "cpu":
                torch.cuda.synchronize()
            row[mode] = ((time.perf_counter_ns() - t0) / n / 1e3, (tt() - c0) / n / 1e3,
                         (time.process_time_ns() - p0) / n / 1e3)
        out.append(row)
    cpg.set_sink(log)
    log.close()
    return out


def bench_per_op(n: int, numel: int, backend: str, ranks: int = 2, rounds: int = 200, async_op: bool = False,
                 processes: int = 1, pin: bool = False, funcol: bool = False) -> dict:
    """Per-op cost of all_reduce on the plain backend, through a 4-line Python process group (the control: what any
    Python backend costs), through commscope's with recording off (it forwards) and on (writing a log), in blocks of
    ``n`` ops, one block per mode per round in a random order, ``rounds`` rounds, in each of ``processes`` fresh
    processes of ``ranks`` ranks. Wall: the slowest rank; CPU: the ranks' own threads (mean over ranks), where what
    recording adds runs.

    Each figure is the median over all rounds of a paired difference within the round, with a 95% bootstrap
    interval (rounds resampled within their process), and the median of each process alone. ``pin``: each rank, and
    the threads its backend starts, on one core of its own. Unpinned, on this 2-vCPU VM, processes differ by more
    than the rounds of one process do: the thread's CPU for a gloo op depends on whether it sleeps until the
    backend's worker thread (on the other core) completes the op, which turns on a microsecond of timing (the control
    moved from -11 to +8 us against plain between processes); pinned, they agree to a few tenths of a microsecond.
    ``record_cpu_us``: recording's share (the same group, switched on and off); ``overhead_cpu_us``: recorded -
    plain; ``forward_cpu_us``: commscope's forwarding, ``python_cpu_us``: the control's, both against plain;
    ``*_proc_*``: the same in CPU of the rank's whole process. ``funcol``: the op issued and waited through c10d's
    functional collectives (as DTensor and TP do) instead of ``dist.all_reduce``: c10d then calls the Python process
    group from C++, and the Work's wait() from C++ too."""
    device = "cuda" if backend == "nccl" else "cpu"
    cpg.register()
    if _CONTROL_BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(_CONTROL_BACKEND, _control_create, extended_api=True, devices=["cpu", "cuda"])
    per_process = []
    for p in range(processes):
        with tempfile.TemporaryDirectory() as d:
            res = spawn(_ops_rank, ranks, args=(n, numel, rounds, d, device, async_op, p, pin, funcol), backend=backend,
                        env={cpg.INNER_BACKEND_ENV: backend}, timeout_s=600)
        per_process.append([{m: (max(r[i][m][0] for r in res), statistics.fmean(r[i][m][1] for r in res),
                                 statistics.fmean(r[i][m][2] for r in res)) for m in _MODES} for i in range(rounds)])

    def diffs(a: str, b: str | None, k: int) -> list[list[float]]:
        return [[row[a][k] - (row[b][k] if b else 0.0) for row in rows] for rows in per_process]

    out: dict[str, Any] = {"ranks": ranks, "bytes": numel * 4, "async": async_op or funcol, "funcol": funcol,
                           "ops": n * rounds * processes, "block_ops": n, "processes": processes,
                           "pinned": pin and _CAN_PIN}
    for name, a, b, k in (("plain_us", "plain", None, 0), ("recorded_us", "recorded", None, 0),
                          ("overhead_us", "recorded", "plain", 0), ("plain_cpu_us", "plain", None, 1),
                          ("overhead_cpu_us", "recorded", "plain", 1), ("record_cpu_us", "recorded", "forward", 1),
                          ("forward_cpu_us", "forward", "plain", 1), ("python_cpu_us", "python", "plain", 1),
                          ("plain_proc_us", "plain", None, 2), ("overhead_proc_us", "recorded", "plain", 2),
                          ("record_proc_us", "recorded", "forward", 2)):
        runs = diffs(a, b, k)
        out[name] = statistics.median([x for run in runs for x in run])
        if b is not None and k > 0:
            out[name.replace("_us", "_ci95")] = _bootstrap_median(runs, n=1000, seed=1)
            out[name.replace("_us", "_per_process")] = [statistics.median(run) for run in runs]
    return out


def bench_python_only(n: int = 50_000, repeats: int = 7) -> dict:
    """What commscope's own code costs per op, without a backend: a recording process group over a stand-in that
    hands back an already completed C++ Work, in this process. ``allreduce(...).wait()`` with recording off (the
    wrapper forwards) and on (a log being written), issued-then-waited and blocking; the best of ``repeats`` loops
    (the least disturbed by the machine: on a shared VM the backend's own op swings 3x with the host's load, and
    what recording adds with it)."""
    import timeit

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future

    from commscope.measure.capture.recorder import RankLog

    done = torch.futures.Future()
    done.set_result([])
    work = _create_work_from_future(done)

    class Backend:  # the backend's allreduce, as cheap as a call can be
        def allreduce(self, tensors, opts=None):
            return work

    x = torch.ones(1)
    asynchronous, blocking = dist.AllreduceOptions(), dist.AllreduceOptions()
    blocking.asyncOp = False
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        log = RankLog(Path(d))
        log.step = 0
        group = cpg.RecordingProcessGroup(Backend(), 0, 1, [0], "bench", "gloo", log)
        try:
            for name, sink, opts in (("forward_us", None, asynchronous), ("recorded_async_us", log, asynchronous),
                                     ("recorded_blocking_us", log, blocking)):
                group._sink = sink

                def loop(opts=opts):
                    for _ in range(n):
                        group.allreduce([x], opts).wait()
                out[name] = min(timeit.repeat(loop, number=1, repeat=repeats)) / n * 1e6
        finally:
            log.close()
    out["record_async_us"] = out["recorded_async_us"] - out["forward_us"]
    out["record_blocking_us"] = out["recorded_blocking_us"] - out["forward_us"]
    return out


def bench_python_cold(n: int = 2000, repeats: int = 5, sweep_mib: int = 64) -> dict:
    """:func:`bench_python_only` with the caches cold, as inside a training step: between two ops a ``sweep_mib``
    array is read (the job's own work evicts commscope's code and data the same way), and only the op itself is
    timed (the thread's CPU, ``thread_time_ns``); the least of ``repeats`` loops. Inside the 8-rank job recording
    costs several times its warm cost per op: this reproduces that in one process, so that a change to the recorder
    can be judged by it; for all_reduce and for all_gather_single (FSDP2's and sequence parallelism's op), each
    issued then waited. (Single figures swing by +-3 us from run to run on this VM: compare changes over repeats.)"""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import AllgatherOptions, _create_work_from_future

    from commscope.measure.capture.recorder import RankLog

    done = torch.futures.Future()
    done.set_result([])
    work = _create_work_from_future(done)

    class Backend:  # as a real backend, it reads the tensor it is handed
        def allreduce(self, tensors, opts=None):
            tensors[0].numel()
            return work

        def _allgather_base(self, output, input, opts=None):
            input.numel()
            return work

    x, gathered = torch.ones(1), torch.ones(2)
    ar_opts, ag_opts = dist.AllreduceOptions(), AllgatherOptions()
    junk = np.ones(sweep_mib * 2**20 // 8)

    def per_op(call) -> float:
        best = float("inf")
        for _ in range(repeats):
            total = 0
            for _ in range(n):
                junk.sum()
                c0 = time.thread_time_ns()
                call().wait()
                total += time.thread_time_ns() - c0
            best = min(best, total / n / 1e3)
        return best

    out: dict[str, float] = {"sweep_MiB": sweep_mib}
    with tempfile.TemporaryDirectory() as d:
        log = RankLog(Path(d))
        log.step = 0
        group = cpg.RecordingProcessGroup(Backend(), 0, 1, [0], "bench", "gloo", log)
        try:
            for name, call in (("all_reduce", lambda: group.allreduce([x], ar_opts)),
                               ("all_gather", lambda: group.all_gather_single(gathered, x, ag_opts))):
                group._sink = None
                out[f"{name}_forward_us"] = per_op(call)
                group._sink = log
                out[f"{name}_recorded_us"] = per_op(call)
                out[f"{name}_record_us"] = out[f"{name}_recorded_us"] - out[f"{name}_forward_us"]
        finally:
            log.close()
    out["forward_us"] = out["all_reduce_forward_us"]
    out["record_us"] = out["all_reduce_record_us"]
    return out


def _workload():
    from commscope.spec.parallel import ParallelSpec
    from commscope.trainings.gpt import reference_model

    return reference_model(), ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True, micro_batch_size=2,
                                           global_batch_size=16, framework="torch-fsdp2")


#: The first steps (warm-up: DTensor's shard distribution, pipelining's stage vote, FSDP2's lazy init) are recorded
#: and left out; then blocks of four steps, recorded in the phases below: on, off, off, on.
_WARMUP_STEPS = 2
_RECORDED_PHASES = (0, 3)


def _recorded(index: int) -> bool:
    return index < _WARMUP_STEPS or (index - _WARMUP_STEPS) % 4 in _RECORDED_PHASES


def _alternating_log(base):
    """A RankLog class that records only the steps :func:`_recorded` picks (the others run with recording switched
    off: the process groups hand ops straight to the backend), in the same processes, step after step; and notes
    the CPU time of the job's thread in each step (``cpu<rank>.json`` next to the rank's log)."""

    class AlternatingLog(base):
        cpu_s: dict[int, float]

        @base.step.setter
        def step(self, index):
            base.step.fset(self, index)
            cpg.set_sink(self if index is None or _recorded(index) else None)
            self._cpu0 = time.thread_time()

        def end_step(self) -> None:
            if self.step is not None and self._step_start_ns is not None:
                if not hasattr(self, "cpu_s"):
                    self.cpu_s = {}
                self.cpu_s[self.step] = time.thread_time() - self._cpu0
            super().end_step()

        def close(self) -> None:
            cpg.set_sink(self)  # the ops still in flight go out through this log
            super().close()
            import torch.distributed as dist

            if dist.is_initialized():
                (self.logdir / f"cpu{dist.get_rank():05d}.json").write_text(json.dumps(getattr(self, "cpu_s", {})))

    return AlternatingLog


def _blocks(values: list[float]) -> list[tuple[float, float]]:
    """(on, off) sums of each whole block of four steps after the warm-up."""
    out = []
    for b in range((len(values) - _WARMUP_STEPS) // 4):
        block = values[_WARMUP_STEPS + 4 * b: _WARMUP_STEPS + 4 * b + 4]
        out.append((block[0] + block[3], block[1] + block[2]))
    return out


def _bootstrap_median(runs: list[list[float]], n: int = 4000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the median of the pooled values, resampling each run's values within the run."""
    rng = random.Random(seed)
    meds = sorted(statistics.median([x for run in runs for x in rng.choices(run, k=len(run))]) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def _ops_per_step(logdir: Path, world: int, steps: int) -> list[float]:
    """Ops each rank recorded per recorded step after the warm-up (read back from its log)."""
    from commscope.io.oplog import read_ops_jsonl

    kept = [i for i in range(_WARMUP_STEPS, steps) if _recorded(i)]
    out = []
    for rank in range(world):
        ops = read_ops_jsonl(logdir / f"rank{rank:05d}.jsonl").ops
        out.append(sum(1 for o in ops if dict(o.extra).get("step") in kept) / len(kept))
    return out


def bench_step_interleaved(steps: int, runs: int, backend: str, cost_per_op_us: float | None = None,
                           cores: int | None = None) -> dict:
    """Step time with and without recording, step by step inside the same 8-rank runs (blocks on, off, off, on);
    and the bounds that the CPU recording costs (per step, and ``cost_per_op_us`` x ops per step) put on it."""
    from commscope.measure.capture import recorder
    from commscope.trainings.gpt import RunConfig, launch, train_rank

    model, parallel = _workload()
    world = parallel.world_size
    cores = cores or len(os.sched_getaffinity(0))
    base = recorder.RankLog
    recorder.RankLog = _alternating_log(base)  # rank_setup imports it at call time, in the forked ranks
    ratios: list[list[float]] = []  # per run, per block: slowest rank's (on + on) / (off + off)
    cpu_diff: list[float] = []  # per rank and block: CPU of the job's thread, (on + on - off - off) / 2, seconds
    off_s: list[float] = []  # per block: mean off-step time, seconds
    ops: list[float] = []
    try:
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as d:
                res = launch(train_rank, RunConfig(model=model, parallel=parallel, steps=steps, record=d),
                             timeout_s=600, backend=backend)
                slowest = [max(r["step_s"][i] for r in res) for i in range(steps)]
                blocks = _blocks(slowest)
                ratios.append([on / off for on, off in blocks])
                off_s += [off / 2 for _, off in blocks]
                for rank in range(world):
                    cpu = json.loads((Path(d) / f"cpu{rank:05d}.json").read_text())
                    cpu_diff += [(on - off) / 2 for on, off in _blocks([cpu[str(i)] for i in range(steps)])]
                ops += _ops_per_step(Path(d), world, steps)
    finally:
        recorder.RankLog = base
    pooled = [x for run in ratios for x in run]
    step_s = statistics.median(off_s)
    ops_step = statistics.fmean(ops)
    d_cpu = statistics.median(cpu_diff)
    serial = world / min(world, cores)  # every rank's extra CPU on the machine's cores, one after another
    out: dict[str, Any] = {
        "workload": "ref-gpt tp2 pp2 dp2 SP torch-fsdp2 1F1B, 8 ranks", "runs": runs, "steps_per_run": steps,
        "blocks": len(pooled), "off_step_ms": step_s * 1e3, "ratio_median": statistics.median(pooled),
        "ratio_ci95": _bootstrap_median(ratios), "ratio_mean": statistics.fmean(pooled),
        "run_medians": [statistics.median(r) for r in ratios], "block_ratio_range": [min(pooled), max(pooled)],
        "block_ratios": ratios,
        "ops_per_step_per_rank": ops_step, "ops_per_step_max_rank": max(ops), "cores": cores,
        "cpu_added_per_step_ms": d_cpu * 1e3, "cpu_added_per_op_us": d_cpu / ops_step * 1e6,
        "cpu_bound": [d_cpu / step_s, serial * d_cpu / step_s]}
    if cost_per_op_us is not None:
        per_step = ops_step * cost_per_op_us * 1e-6
        out["per_op_bound"] = [per_step / step_s, serial * per_step / step_s]
    return out


def bench_step_time(steps: int, rounds: int, backend: str) -> dict:
    """Whole runs on the plain backend and recorded, alternately (what a user compares)."""
    from commscope.trainings.gpt import RunConfig, run

    model, parallel = _workload()

    def cpu_s() -> float:  # CPU time of the ranks (forked children) so far
        use = resource.getrusage(resource.RUSAGE_CHILDREN)
        return use.ru_utime + use.ru_stime

    run(RunConfig(model=model, parallel=parallel, steps=1), backend=backend)  # a first run pays for cold caches
    plain, recorded, ratios, cpu = [], [], [], {"plain": 0.0, "recorded": 0.0}
    for _ in range(rounds):  # alternate so that drifts of the machine hit both alike
        c0 = cpu_s()
        res = run(RunConfig(model=model, parallel=parallel, steps=steps), backend=backend)
        cpu["plain"] += cpu_s() - c0
        plain += [max(r["step_s"][i] for r in res) for i in range(steps)]
        with tempfile.TemporaryDirectory() as d:
            c0 = cpu_s()
            res = run(RunConfig(model=model, parallel=parallel, steps=steps, record=d), backend=backend)
            cpu["recorded"] += cpu_s() - c0
        recorded += [max(r["step_s"][i] for r in res) for i in range(steps)]
        ratios.append(statistics.median(recorded[-steps:]) / statistics.median(plain[-steps:]))
    p, q = statistics.median(plain), statistics.median(recorded)
    return {"steps": steps * rounds, "plain_step_ms": p * 1e3, "recorded_step_ms": q * 1e3, "ratio": q / p,
            "round_ratios": ratios, "cpu_ratio": cpu["recorded"] / cpu["plain"]}


def _pct(x: float) -> str:
    return f"{x * 100:+.2f}%"


def _print_step(inter: dict, runs: int, blocks: int) -> None:
    lo, hi = inter["ratio_ci95"]
    print(f"\n{inter['workload']}: recording on and off step by step (on, off, off, on) in {runs} run(s) x "
          f"{blocks} blocks; {inter['off_step_ms']:.0f} ms per step off")
    print(f"  direct: median block ratio x{inter['ratio_median']:.4f} (95% bootstrap x{lo:.4f}-x{hi:.4f}; mean "
          f"x{inter['ratio_mean']:.4f}; run medians {', '.join(f'x{r:.4f}' for r in inter['run_medians'])}; blocks "
          f"x{inter['block_ratio_range'][0]:.3f}-x{inter['block_ratio_range'][1]:.3f})")
    print(f"  from CPU: +{inter['cpu_added_per_step_ms']:.3f} ms of the job thread's CPU per step per rank "
          f"({inter['ops_per_step_per_rank']:.0f} ops recorded per step per rank, "
          f"{inter['cpu_added_per_op_us']:.1f} us each in this job): {_pct(inter['cpu_bound'][0])} (one rank's "
          f"added CPU) to {_pct(inter['cpu_bound'][1])} (all 8 ranks' added CPU as a share of {inter['cores']} "
          "cores)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer ops and steps: a smoke run")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    ap.add_argument("--runs", type=int, default=None, help="8-rank runs of the step comparison (default 3)")
    ap.add_argument("--blocks", type=int, default=None, help="blocks of 4 steps per run (default 12)")
    ap.add_argument("--whole-runs", action="store_true", help="also compare whole runs, plain vs recorded")
    ap.add_argument("--step-only", action="store_true", help="only the 8-rank step comparison (to A/B a recorder change)")
    args = ap.parse_args(argv)
    n, op_rounds, procs = (50, 20, 2) if args.quick else (100, 200, 3)
    runs = args.runs or (1 if args.quick else 3)
    blocks = args.blocks or (2 if args.quick else 12)
    if args.step_only:
        inter = bench_step_interleaved(_WARMUP_STEPS + 4 * blocks, runs, args.backend)
        _print_step(inter, runs, blocks)
        print(json.dumps({"step_interleaved": inter, "backend": args.backend}))
        return 0
    # blocking all_reduce (dist.all_reduce(t)) and issue-then-wait (async_op=True, as DDP, FSDP2, TP and pipelining
    # use ops): one and two ranks, 4 B and 64 KiB; the one-rank 4 B rows (the target's) in several processes
    # blocking all_reduce (dist.all_reduce(t)) and issue-then-wait (async_op=True, as DDP, FSDP2, TP and pipelining
    # use ops); the one-rank 4 B rows (the target's) in several processes; "pinned": each rank and its backend's
    # threads on one core of its own, "free": where the OS puts them (see bench_per_op)
    specs = [(ranks, numel, pin) for ranks, numel, pin in ((1, 1, True), (1, 1, False), (1, 16384, True), (2, 1, True))]
    rows = {(async_op, *spec): bench_per_op(n if spec[1] == 1 else n // 4, spec[1], args.backend, spec[0], op_rounds,
                                            async_op, procs if spec[:2] == (1, 1) else 1, spec[2])
            for async_op in (False, True) for spec in specs}
    rows[("funcol", 1, 1, True)] = bench_per_op(n, 1, args.backend, ranks=1, rounds=op_rounds, processes=1,
                                                pin=True, funcol=True)
    print(f"per op: blocks of {n} ops (4 B; {n // 4} at 64 KiB), one per mode per round in a random order, {op_rounds} "
          "rounds per process; medians over rounds of the paired differences, [95% bootstrap], {per process}; "
          "wall: slowest rank; CPU: the rank's process (all its threads) and its own thread")
    print(f"{'call':>9}{'ranks':>6}{'cores':>7}{'message':>9}{'plain us':>10}{'recorded us':>13}"
          f"{'added CPU (recorded - plain)':>34}{'recording CPU (on - off)':>30}{'thread: added':>15}{'forward':>9}"
          f"{'control':>9}")

    def cpu(r: dict, key: str) -> str:
        lo, hi = r[f"{key}_ci95"]
        per = r[f"{key}_per_process"]
        spread = f" {{{min(per):.1f}..{max(per):.1f}}}" if len(per) > 1 else ""
        return f"{r[f'{key}_us']:.2f} [{lo:.1f}, {hi:.1f}]{spread}"

    for r in rows.values():
        call = "funcol" if r["funcol"] else "async" if r["async"] else "blocking"
        print(f"{call:>9}{r['ranks']:>6}{'pinned' if r['pinned'] else 'free':>7}"
              f"{r['bytes']:>8}B{r['plain_us']:>10.1f}{r['recorded_us']:>13.1f}{cpu(r, 'overhead_proc'):>34}"
              f"{cpu(r, 'record_proc'):>30}{r['overhead_cpu_us']:>15.2f}{r['forward_cpu_us']:>9.2f}"
              f"{r['python_cpu_us']:>9.2f}")
    py = bench_python_only(10_000 if args.quick else 50_000)
    print(f"commscope's own code per op (no backend; best of 7 loops): forwarding {py['forward_us']:.2f} us; recording "
          f"adds {py['record_async_us']:.2f} us issued then waited, {py['record_blocking_us']:.2f} us blocking")
    cold = bench_python_cold(500 if args.quick else 2000)
    print(f"same, caches cold ({cold['sweep_MiB']} MiB read between ops, as a training step's work does): forwarding "
          f"{cold['forward_us']:.1f} us; recording adds {cold['record_us']:.1f} us to an all_reduce, "
          f"{cold['all_gather_record_us']:.1f} us to an all_gather_single, issued then waited")
    one_rank, one_rank_async = rows[(False, 1, 1, True)], rows[(True, 1, 1, True)]
    free, free_async = rows[(False, 1, 1, False)], rows[(True, 1, 1, False)]
    inter = bench_step_interleaved(_WARMUP_STEPS + 4 * blocks, runs, args.backend,
                                   cost_per_op_us=one_rank_async["record_proc_us"])
    _print_step(inter, runs, blocks)
    lo, hi = inter["ratio_ci95"]
    print(f"  from the one-rank cost per async op ({one_rank_async['record_proc_us']:.2f} us, caches warm, x {inter['ops_per_step_per_rank']:.0f} "
          f"ops): {_pct(inter['per_op_bound'][0])} to {_pct(inter['per_op_bound'][1])} (a floor: in the job each op "
          "costs more)")
    step = None
    if args.whole_runs:
        step = bench_step_time(8 if not args.quick else 2, 3 if not args.quick else 1, args.backend)
        print(f"whole runs, plain {args.backend} vs recorded, alternating ({step['steps']} steps each): "
              f"{step['plain_step_ms']:.1f} ms vs {step['recorded_step_ms']:.1f} ms, ratio {step['ratio']:.3f} "
              f"(per round {', '.join(f'{r:.3f}' for r in step['round_ratios'])}; CPU time of the ranks "
              f"x{step['cpu_ratio']:.3f})")
    print("\n| measure | commscope | target |\n| --- | --- | --- |")
    where = "it and its backend's threads on one core" if one_rank["pinned"] else "threads free: no pinning here"
    print(f"| recording, one rank ({where}), 4 B all_reduce: CPU added per op, "
          f"recorded - plain backend | {cpu(one_rank, 'overhead_proc')} blocking, {cpu(one_rank_async, 'overhead_proc')} "
          "issued and waited | < 5 us |")
    print(f"| same, recording's share (on - off, one group) | {cpu(one_rank, 'record_proc')} blocking, "
          f"{cpu(one_rank_async, 'record_proc')} issued and waited | |")
    print(f"| same, threads where the OS puts them (on this VM: the backend's on the other core) | "
          f"{cpu(free, 'overhead_proc')} blocking, {cpu(free_async, 'overhead_proc')} issued and waited; recording's "
          f"share {cpu(free, 'record_proc')} / {cpu(free_async, 'record_proc')}; the control (a 4-line Python process "
          f"group) {free['python_cpu_us']:.2f} / {free_async['python_cpu_us']:.2f} (the rank's thread) | |")
    print(f"| same, commscope's own code alone (no backend) | {py['record_blocking_us']:.2f} us blocking, "
          f"{py['record_async_us']:.2f} us issued and waited | |")
    print(f"| same, caches cold (as inside a step) | {cold['record_us']:.1f} us issued and waited | |")
    fcr = rows[("funcol", 1, 1, True)]
    print(f"| same (one core), issued and waited from C++ (functional collectives: DTensor, TP) | "
          f"{cpu(fcr, 'overhead_proc')}, of which forwarding {fcr['forward_cpu_us']:.2f} (the control "
          f"{fcr['python_cpu_us']:.2f}, the rank's thread) and recording's share {cpu(fcr, 'record_proc')}, on a plain "
          f"op of {fcr['plain_proc_us']:.1f} us of CPU | |")
    two, two_async = rows[(False, 2, 1, True)], rows[(True, 2, 1, True)]
    print(f"| recording, two ranks (a core each), 4 B all_reduce: CPU added per op per rank, recorded - plain | "
          f"{cpu(two, 'overhead_proc')} blocking, {cpu(two_async, 'overhead_proc')} issued and waited | |")
    print(f"| recording, 8-rank 3D step, on/off step by step | x{inter['ratio_median']:.4f} median "
          f"(95%: x{lo:.4f}-x{hi:.4f}) | < x1.02 |")
    print(f"| same, from the CPU recording adds | {_pct(inter['cpu_bound'][0])} to {_pct(inter['cpu_bound'][1])} "
          f"| < 2% |")
    print(json.dumps({"per_op": list(rows.values()), "python_only": py, "python_cold": cold, "step_interleaved": inter, "step_runs": step, "backend": args.backend}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
