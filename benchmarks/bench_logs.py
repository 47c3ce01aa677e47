"""`summarize` and `compare` over the logs of a large recorded job, read rank file by rank file.

Writes synthetic per-rank logs (gzip) with the recorder's own line writer (commscope.measure.capture.synthetic) under
/tmp, runs `commscope summarize` and `commscope compare` on them as a user would (subprocesses), and prints for
each its wall time, records per second and peak RSS (ru_maxrss of the child). The logs are deleted afterwards.

    python benchmarks/bench_logs.py                      # 4,096 ranks x 50,000 ops: ~200 million records
    python benchmarks/bench_logs.py --ranks 4096 --ops-per-rank 1000 --jobs 2
    python benchmarks/bench_logs.py --quick              # 64 ranks x 2,000 ops
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from commscope.measure.capture.synthetic import synthetic_parallel, write_synthetic_rank


def _write(args: tuple[str, int, int, int]) -> None:
    logdir, first, ranks, ops = args
    for r in range(first, min(ranks, first + 64)):
        write_synthetic_rank(logdir, r, ranks, ops)


def _run(cmd: list[str]) -> tuple[float, float, dict]:
    """Wall seconds, the peak RSS (GiB) of the children so far (ru_maxrss: the largest of them and their
    workers), and the command's JSON output."""
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    return wall, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, json.loads(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--ops-per-rank", type=int, default=50_000)
    ap.add_argument("--jobs", type=int, default=1, help="--jobs of summarize and compare (and writers)")
    ap.add_argument("--quick", action="store_true", help="64 ranks x 2,000 ops")
    args = ap.parse_args()
    if args.quick:
        args.ranks, args.ops_per_rank = 64, 2000
    tp, pp, dp = synthetic_parallel(args.ranks)
    logdir = Path(tempfile.mkdtemp(prefix="commscope-logs-", dir="/tmp"))
    try:
        t0 = time.perf_counter()
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            list(pool.map(_write, [(str(logdir), r, args.ranks, args.ops_per_rank) for r in range(0, args.ranks, 64)]))
        size = sum(f.stat().st_size for f in logdir.iterdir())
        print(f"wrote {args.ranks:,} ranks x ~{args.ops_per_rank:,} ops (tp {tp}, pp {pp}, dp {dp}) in "
              f"{time.perf_counter() - t0:.0f} s, {size / 2**30:.2f} GiB gzip, {logdir}")
        cli = [sys.executable, "-m", "commscope.cli.main"]
        par = ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp)]
        results: dict = {"ranks": args.ranks, "ops_per_rank": args.ops_per_rank, "jobs": args.jobs,
                         "gzip_GiB": size / 2**30}
        for name, cmd in (("summarize", [*cli, "summarize", str(logdir), *par, "--json", "--jobs", str(args.jobs)]),
                          ("compare", [*cli, "compare", str(logdir), "--model", "llama3-70b", *par,
                                       "--global-batch-size", str(dp * 8), "--json", "--jobs", str(args.jobs)])):
            wall, peak, result = _run(cmd)
            if name == "summarize":
                records = result["records"]
            print(f"{name:<10} {records:>13,} records  {wall:8.1f} s  {records / wall:>11,.0f} records/s  "
                  f"peak RSS {peak:.2f} GiB  (--jobs {args.jobs}, {os.cpu_count()} cores)")
            results[name] = {"records": records, "wall_s": wall, "records_per_s": records / wall, "peak_rss_GiB": peak}
        print(json.dumps(results))
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
