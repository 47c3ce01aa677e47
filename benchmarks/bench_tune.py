"""What mixing backends gains on a real training (issue: choose the best backend per op and size, MCR-DL).

1. Tune: ``commscope tune`` on this machine for the ops the workload sends (all_reduce, all_gather,
   reduce_scatter, broadcast) over the sizes it sends, on groups of 2 and of all ranks.
2. Train commscope's reference GPT (``commscope.trainings.gpt.train_rank``, preset ref-gpt) with PyTorch's
   own data parallelism, DDP and FSDP2, on:
   - ``gloo``: the only native backend of a CPU machine (NCCL joins on a GPU machine with a GPU per rank);
   - ``algorithms``: the mixed backend with a table holding only commscope's point-to-point algorithms
     (each op goes to the fastest of them at its size);
   - ``tuned mix``: the mixed backend with the whole table (each op to the fastest of all).
   Runs alternate, several rounds; a run's step time is the median over its steps of the slowest rank.

    python benchmarks/bench_tune.py              # prints a table and a JSON line
    python benchmarks/bench_tune.py --quick      # smaller sweep, fewer steps (a smoke run)

Reports step time per backend (median of the rounds), the ratio to gloo (below 1: faster) and the spread of
the rounds: a ratio inside the spread is no gain. No target: the gain depends on the machine, which is the
point of measuring it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from commscope.measure.bench.sweep import SweepConfig
from commscope.measure.launch import spawn
from commscope.spec.parallel import ParallelSpec
from commscope.measure.tune.mixed import MIXED_BACKEND, TUNING_ENV, register
from commscope.measure.tune.suite import TuneConfig, run_tuning
from commscope.measure.tune.files import write_table
from commscope.measure.tune.table import TuningTable
from commscope.trainings.gpt import RunConfig, reference_model, train_rank

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def only_algorithms(table: TuningTable) -> TuningTable:
    """The table without its native backends: the selection then picks the fastest algorithm at each size."""
    keep = tuple(c for c in table.candidates if c.kind == "p2p")
    names = {c.name for c in keep}
    return replace(table, candidates=keep, measurements=tuple(m for m in table.measurements if m.backend in names))


def train(cfg: RunConfig, backend: str, tuning: Path | None, timeout_s: float) -> float:
    """Median over steps of the slowest rank's step time, in seconds."""
    env = {TUNING_ENV: str(tuning)} if tuning is not None else {}
    results = spawn(train_rank, cfg.parallel.world_size, args=(cfg,), backend=backend, env=env, timeout_s=timeout_s)
    per_step = [max(r["step_s"][i] for r in results) for i in range(cfg.steps)]
    return statistics.median(per_step)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--table", type=Path, default=None, help="use this tuning table instead of measuring one")
    args = ap.parse_args(argv)
    rounds = args.rounds or (1 if args.quick else 3)
    steps = args.steps or (3 if args.quick else 10)
    register()
    with tempfile.TemporaryDirectory(prefix="commscope-bench-tune-") as tmp:
        t0 = time.perf_counter()
        if args.table is None:
            sweep = SweepConfig(ops=OPS, min_bytes=1 << 10, max_bytes=(1 << 20) if args.quick else (4 << 20),
                                step_factor=4, iters=10 if args.quick else 30, warmup_iters=3)
            table = run_tuning(TuneConfig(sweep=sweep), args.nproc, timeout_s=1800)
        else:
            from commscope.measure.tune.files import load_table

            table = load_table(args.table)
        tune_s = time.perf_counter() - t0
        full = write_table(table, Path(tmp) / "tuning.json")
        algos = write_table(only_algorithms(table), Path(tmp) / "algorithms.json")
        model = reference_model()
        rows = []
        for framework in ("torch-ddp", "torch-fsdp2"):
            parallel = ParallelSpec(tp=1, pp=1, dp=args.nproc, framework=framework, micro_batch_size=2,
                                    global_batch_size=2 * args.nproc)
            cfg = RunConfig(model=model, parallel=parallel, steps=steps, warmup=2)
            runs = {"gloo": ("gloo", None), "algorithms": (MIXED_BACKEND, algos), "tuned mix": (MIXED_BACKEND, full)}
            times: dict[str, list[float]] = {name: [] for name in runs}
            for _ in range(rounds):
                for name, (backend, tuning) in runs.items():
                    times[name].append(train(cfg, backend, tuning, timeout_s=600))
            base = statistics.median(times["gloo"])
            for name, ts in times.items():
                step = statistics.median(ts)
                rows.append({"workload": f"ref-gpt {framework} dp={args.nproc}", "backend": name,
                             "step_ms": step * 1e3, "ratio_to_gloo": step / base,
                             "runs_ms": [round(t * 1e3, 2) for t in ts]})
    print(f"tuning: {tune_s:.1f} s, {len(table.measurements)} measurements, {table.world_size} ranks, "
          f"device {table.machine.device}")
    from commscope.cli.tune_cmd import format_selection

    print("\n".join(format_selection(table)))
    print(f"{'workload':<28} {'backend':<11} {'step (ms)':>10} {'vs gloo':>8}   runs (ms, min-max)")
    for r in rows:
        print(f"{r['workload']:<28} {r['backend']:<11} {r['step_ms']:>10.1f} {r['ratio_to_gloo']:>8.3f}   "
              f"{min(r['runs_ms']):.1f}-{max(r['runs_ms']):.1f}")
    print(json.dumps({"tune_s": tune_s, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
