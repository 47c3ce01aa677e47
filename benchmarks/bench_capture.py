"""Overhead of recording (issue: measure real runs).

Targets: under 20 us per recorded op, and under 5% of step time on the 8-rank 3D reference workload
(tp 2 x pp 2 x dp 2, sequence parallelism, FSDP2, 1F1B).

1. Per op: one and two gloo ranks run rounds of N all-reduces (4 B and 64 KiB), alternately on the plain
   backend and on a group of commscope's recording backend (writing a log) in the same processes; the median
   over rounds of the difference is the recording cost per op.
2. Step time on the 3D reference training (slowest rank per step): recording switched on and off step by step
   inside the same runs, in the order on, off, off, on after two warm-up steps (the headline ratio: drifts of a
   shared machine hit both alike; the ratio of each run is printed too), and whole runs
   unrecorded (plain backend) and recorded, alternately (what a user compares; on 2 cores for 8 ranks these
   swing by +-10% from run to run, so the per-round ratios are printed too).

    python benchmarks/bench_capture.py             # prints a table and a JSON line
    python benchmarks/bench_capture.py --quick     # fewer ops and steps (a smoke run)
    python benchmarks/bench_capture.py --backend nccl   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from commscope.capture import pg as cpg
from commscope.launch import spawn


def _ops_rank(rank: int, world: int, n: int, numel: int, rounds: int, logdir: str, device: str) -> list[tuple]:
    import torch
    import torch.distributed as dist

    from commscope.capture.recorder import RankLog

    log = RankLog(Path(logdir))
    cpg.set_sink(log)
    plain = dist.new_group(list(range(world)), backend=dist.get_backend())  # the backend itself, made alike
    recorded = dist.new_group(list(range(world)), backend=cpg.BACKEND_NAME)  # the same backend, recorded
    x = torch.ones(numel, device=device)
    for group in (plain, recorded):
        for _ in range(20):  # warm up the connections
            dist.all_reduce(x, group=group)
    out = []
    for _ in range(rounds):  # alternate rounds of n ops, so that drifts of the machine hit both alike
        times = []
        for group in (plain, recorded):
            dist.barrier(group=plain)
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                dist.all_reduce(x, group=group)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) / n)
        out.append(tuple(times))
    log.close()
    return out


def bench_per_op(n: int, numel: int, backend: str, ranks: int = 2, rounds: int = 9) -> dict:
    """Per-op time of all_reduce on the plain backend and through commscope's recording process group, in the
    same processes, round after round; the overhead is the median over rounds of (recorded - plain)."""
    device = "cuda" if backend == "nccl" else "cpu"
    cpg.register()
    with tempfile.TemporaryDirectory() as d:
        res = spawn(_ops_rank, ranks, args=(n, numel, rounds, d, device), backend=backend,
                    env={cpg.INNER_BACKEND_ENV: backend}, timeout_s=300)
    rows = [(max(r[i][0] for r in res), max(r[i][1] for r in res)) for i in range(rounds)]  # slowest rank
    p = statistics.median(a for a, _ in rows)
    q = statistics.median(b for _, b in rows)
    diff = statistics.median(b - a for a, b in rows)
    return {"ranks": ranks, "bytes": numel * 4, "ops": n * rounds, "plain_us": p * 1e6, "recorded_us": q * 1e6,
            "overhead_us": diff * 1e6}


def _workload():
    from commscope.spec.parallel import ParallelSpec
    from commscope.workloads.gpt import reference_model

    return reference_model(), ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True, micro_batch_size=2,
                                           global_batch_size=16, framework="torch-fsdp2")


#: Steps 4k and 4k + 3 are recorded, 4k + 1 and 4k + 2 not (on, off, off, on): a machine that speeds up or slows
#: down along a run (caches warming, another job starting) then weighs on both alike, which plain alternation
#: (on, off, on, off) does not: its recorded steps always come first.
_RECORDED_PHASES = (0, 3)
#: The first steps (warm-up: DTensor's shard distribution, pipelining's stage vote, FSDP2's lazy init) are left out.
_WARMUP_STEPS = 2


def _recorded(index: int) -> bool:
    return index % 4 in _RECORDED_PHASES


def _alternating_log(base):
    """A RankLog class that records only the steps :func:`_recorded` picks: the others run with recording
    switched off (the process groups hand ops straight to the backend), in the same processes, step after step."""

    class AlternatingLog(base):
        @base.step.setter
        def step(self, index):
            base.step.fset(self, index)
            cpg.set_sink(self if index is None or _recorded(index) else None)

    return AlternatingLog


def bench_step_interleaved(steps: int, runs: int, backend: str) -> dict:
    """Step time with and without recording, alternating step by step inside the same 8-rank runs: drifts of a
    shared machine hit both alike (whole-run comparisons on 2 cores swing by +-10% from run to run)."""
    from commscope.capture import recorder
    from commscope.workloads.gpt import RunConfig, launch, train_rank

    model, parallel = _workload()
    base = recorder.RankLog
    recorder.RankLog = _alternating_log(base)  # rank_setup imports it at call time, in the forked ranks
    on, off, ratios = [], [], []
    try:
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as d:
                res = launch(train_rank, RunConfig(model=model, parallel=parallel, steps=steps, record=d),
                             timeout_s=600, backend=backend)
            slowest = [max(r["step_s"][i] for r in res) for i in range(steps)]
            run_on = [t for i, t in enumerate(slowest) if i >= _WARMUP_STEPS and _recorded(i)]
            run_off = [t for i, t in enumerate(slowest) if i >= _WARMUP_STEPS and not _recorded(i)]
            on += run_on
            off += run_off
            ratios.append(statistics.median(run_on) / statistics.median(run_off))
    finally:
        recorder.RankLog = base
    p, q = statistics.median(off), statistics.median(on)
    return {"workload": "ref-gpt tp2 pp2 dp2 SP torch-fsdp2, 8 ranks", "steps": len(on) + len(off),
            "off_step_ms": p * 1e3, "on_step_ms": q * 1e3, "ratio": q / p, "run_ratios": ratios}


def bench_step_time(steps: int, rounds: int, backend: str) -> dict:
    from commscope.workloads.gpt import RunConfig, run

    model, parallel = _workload()

    def cpu_s() -> float:  # CPU time of the ranks (forked children) so far
        use = resource.getrusage(resource.RUSAGE_CHILDREN)
        return use.ru_utime + use.ru_stime

    run(RunConfig(model=model, parallel=parallel, steps=1), backend=backend)  # a first run pays for cold caches
    plain, recorded, ops, ratios, cpu = [], [], 0, [], {"plain": 0.0, "recorded": 0.0}
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
        ops = max(r["ops"] for r in res)
        ratios.append(statistics.median(recorded[-steps:]) / statistics.median(plain[-steps:]))
    p, q = statistics.median(plain), statistics.median(recorded)
    return {"workload": "ref-gpt tp2 pp2 dp2 SP torch-fsdp2, 8 ranks", "steps": steps * rounds,
            "plain_step_ms": p * 1e3, "recorded_step_ms": q * 1e3, "ratio": q / p,
            # each round's recorded/unrecorded ratio: their range says how well the machine lets it be known
            "round_ratios": ratios,
            # CPU seconds of all ranks, whole runs (start-up included): steadier than wall time on few cores
            "cpu_ratio": cpu["recorded"] / cpu["plain"], "ops_per_rank_per_run": ops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    args = ap.parse_args(argv)
    n, op_rounds, steps, rounds = (200, 3, 4, 1) if args.quick else (1000, 9, 16, 3)
    # one rank: the CPU cost recording adds to an op, free of the scheduling noise of several ranks on few
    # cores; two ranks: what a real collective sees (on a 2-core machine the noise is tens of microseconds)
    rows = [bench_per_op(n if numel == 1 else n // 4, numel, args.backend, ranks, op_rounds)
            for ranks in (1, 2) for numel in (1, 16384)]
    print(f"{'ranks':>5}{'message':>10}{'plain us/op':>14}{'recorded us/op':>16}{'overhead us':>13}")
    for r in rows:
        print(f"{r['ranks']:>5}{r['bytes']:>9}B{r['plain_us']:>14.1f}{r['recorded_us']:>16.1f}{r['overhead_us']:>13.1f}")
    inter = bench_step_interleaved(steps, rounds, args.backend)
    print(f"\n{inter['workload']}, recording on and off step by step in the same runs ({inter['steps']} steps): "
          f"{inter['off_step_ms']:.1f} ms off, {inter['on_step_ms']:.1f} ms on, ratio {inter['ratio']:.3f} "
          f"(per run {', '.join(f'{r:.3f}' for r in inter['run_ratios'])})")
    step = bench_step_time(steps // 2, rounds, args.backend)
    print(f"whole runs, unrecorded (plain {args.backend}) vs recorded, alternating ({step['steps']} steps each): "
          f"{step['plain_step_ms']:.1f} ms vs {step['recorded_step_ms']:.1f} ms, ratio {step['ratio']:.3f} "
          f"(per round {', '.join(f'{r:.3f}' for r in step['round_ratios'])}; CPU time of the ranks "
          f"x{step['cpu_ratio']:.3f}; {step['ops_per_rank_per_run']} ops per rank per run)")
    print(json.dumps({"per_op": rows, "step_interleaved": inter, "step_runs": step, "backend": args.backend}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
