"""Overhead of recording (issue: measure real runs).

Targets: under 20 us per recorded op, and under 5% of step time on the 8-rank 3D reference workload
(tp 2 x pp 2 x dp 2, sequence parallelism, FSDP2, 1F1B).

1. Per op: two gloo ranks run N small all-reduces (and N 64 KiB ones) on plain gloo, then through commscope's
   recording process group writing a log; the difference of the per-op medians is the recording cost.
2. Step time: the 3D reference training runs unrecorded and recorded, alternately, several rounds; the ratio
   of median step times (slowest rank per step) is the overhead a user pays.

    python benchmarks/bench_capture.py             # prints a table and a JSON line
    python benchmarks/bench_capture.py --quick     # fewer ops and steps (a smoke run)
    python benchmarks/bench_capture.py --backend nccl   # on a GPU machine
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from commscope.capture import pg as cpg
from commscope.launch import spawn


def _ops_rank(rank: int, world: int, n: int, numel: int, logdir: str | None, device: str) -> list[float]:
    import torch
    import torch.distributed as dist

    log = None
    if logdir is not None:
        from commscope.capture.recorder import RankLog

        log = RankLog(Path(logdir))
        cpg.set_sink(log)
    x = torch.ones(numel, device=device)
    for _ in range(20):  # warm up the connections
        dist.all_reduce(x)
    per_op = []
    for _ in range(5):  # five rounds of n ops; the median round is reported
        dist.barrier()
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(x)
        if device != "cpu":
            torch.cuda.synchronize()
        per_op.append((time.perf_counter() - t0) / n)
    if log is not None:
        log.close()
    return per_op


def bench_per_op(n: int, numel: int, backend: str, ranks: int = 2) -> dict:
    device = "cuda" if backend == "nccl" else "cpu"
    plain = spawn(_ops_rank, ranks, args=(n, numel, None, device), backend=backend, timeout_s=300)
    with tempfile.TemporaryDirectory() as d:
        cpg.register()
        recorded = spawn(_ops_rank, ranks, args=(n, numel, d, device), backend=cpg.BACKEND_NAME,
                         env={cpg.INNER_BACKEND_ENV: backend}, timeout_s=300)
    p = statistics.median(max(r[i] for r in plain) for i in range(len(plain[0])))
    q = statistics.median(max(r[i] for r in recorded) for i in range(len(recorded[0])))
    return {"ranks": ranks, "bytes": numel * 4, "ops": n, "plain_us": p * 1e6, "recorded_us": q * 1e6, "overhead_us": (q - p) * 1e6}


def bench_step_time(steps: int, rounds: int, backend: str) -> dict:
    from commscope.spec.parallel import ParallelSpec
    from commscope.workloads.gpt import RunConfig, reference_model, run

    model = reference_model()
    parallel = ParallelSpec(tp=2, pp=2, dp=2, sequence_parallel=True, micro_batch_size=2, global_batch_size=16,
                            framework="torch-fsdp2")
    plain, recorded, ops = [], [], 0
    for _ in range(rounds):  # alternate so that drifts of the machine hit both alike
        res = run(RunConfig(model=model, parallel=parallel, steps=steps), backend=backend)
        plain += [max(r["step_s"][i] for r in res) for i in range(steps)]
        with tempfile.TemporaryDirectory() as d:
            res = run(RunConfig(model=model, parallel=parallel, steps=steps, record=d), backend=backend)
        recorded += [max(r["step_s"][i] for r in res) for i in range(steps)]
        ops = max(r["ops"] for r in res)
    p, q = statistics.median(plain), statistics.median(recorded)
    return {"workload": "ref-gpt tp2 pp2 dp2 SP torch-fsdp2, 8 ranks", "steps": steps * rounds,
            "plain_step_ms": p * 1e3, "recorded_step_ms": q * 1e3, "ratio": q / p,
            "ops_per_rank_per_run": ops}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    args = ap.parse_args(argv)
    n, steps, rounds = (300, 3, 1) if args.quick else (2000, 5, 3)
    # one rank: the CPU cost recording adds to an op, free of the scheduling noise of several ranks on few
    # cores; two ranks: what a real collective sees (on a 2-core machine the noise is tens of microseconds)
    rows = [bench_per_op(n, 1, args.backend, 1), bench_per_op(n // 4, 16384, args.backend, 1),
            bench_per_op(n, 1, args.backend, 2), bench_per_op(n // 4, 16384, args.backend, 2)]
    print(f"{'ranks':>5}{'message':>10}{'plain us/op':>14}{'recorded us/op':>16}{'overhead us':>13}")
    for r in rows:
        print(f"{r['ranks']:>5}{r['bytes']:>9}B{r['plain_us']:>14.1f}{r['recorded_us']:>16.1f}{r['overhead_us']:>13.1f}")
    step = bench_step_time(steps, rounds, args.backend)
    print(f"\n{step['workload']}: step {step['plain_step_ms']:.1f} ms plain, {step['recorded_step_ms']:.1f} ms recorded "
          f"(ratio {step['ratio']:.3f}, {step['ops_per_rank_per_run']} ops per rank per run, {step['steps']} steps each)")
    print(json.dumps({"per_op": rows, "step": step, "backend": args.backend}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
