"""How long `commscope fit` takes on a file of a million rows (issue 36: 88 CPU-s; the goal: at most 10 s).

Three files, written into a temporary folder first (not timed):

- ``bench-1M.json``: `commscope bench` JSON of 1,000,000 rows: all_reduce over 8 ranks at 28 sizes (8 B to 1 GiB),
  each size measured ~36,000 times (a long sweep, or many sweeps merged), times with 2% noise;
- ``bench-1M-distinct.json``: the same number of rows, each at its own size (1 KiB steps: a sweep of ``-f 1``);
- ``nccl-1M.txt``: nccl-tests output of one table of 1,000,000 data rows (the real A100 output's 25 rows, repeated;
  its header, device list and summary around them).

Each is fitted by ``python -m commscope.cli.main fit FILE --out FILE.toml`` in a fresh process (the interpreter,
the imports, reading, checking, fitting and writing the model and the table); wall time and the process's CPU
time (user + system, from getrusage) are printed, and one JSON line at the end.

    python benchmarks/bench_fit.py              # ~1 min on 2 cores (most of it writing the files)
    python benchmarks/bench_fit.py --rows 100000

Measured 2026-11-29 on the project's shared 2-core VM (load average 2.5-4 from other jobs), ``nice -n 5 python
benchmarks/bench_fit.py``, wall s / CPU s:

    file                          before (issue 36)   after
    bench JSON, 28 sizes            9.75 /  8.10      4.64 / 4.72
    bench JSON, distinct sizes     15.92 / 15.34      6.59 / 6.66
    nccl-tests output              80.03 / 45.76      5.67 / 5.68

Where the time went and what changed: nccl-tests lines are read a block of plain data rows at a time into columns
(commscope.io.nccl_tests_columns) and checked on all rows at once, bench JSON rows are checked as arrays, fit takes
columns (FitRows) instead of a FitPoint per row, and the residuals stay columns per curve until written. What is
left is mostly the standard library's json.loads (~2 s of a bench file), splitting 13 million tokens of nccl-tests
output, and writing a million residual rows into the TOML of the distinct-size file. The fitted TOML, the
warnings and the errors are byte for byte those of the code before (checked on these files, on damaged copies of
them, on every real log in ../shared/data/real-logs and 540 damaged and enlarged copies, and on the bench JSON the
tests write).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
A100 = ROOT.parent / "shared" / "data" / "real-logs" / "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"


def _bench_rows(rows: int, distinct: bool) -> dict:
    rng = random.Random(0)
    sizes = [2**k for k in range(3, 31)]
    out = []
    for i in range(rows):
        size = 1024 * (i + 1) if distinct else sizes[i % len(sizes)]
        t = (20e-6 + size * 2 * 7 / 8 / 100e9) * (1 + rng.uniform(-0.02, 0.02))
        out.append({"op": "all_reduce", "group_size": 8, "size_bytes": size, "time_s": t, "dtype": "float32",
                    "redop": "sum", "busbw_bytes_per_s": size * 2 * 7 / 8 / t, "wrong": 0})
    return {"meta": {"backend": "nccl", "world_size": 8}, "rows": out}


def _nccl_text(rows: int) -> str:
    lines = A100.read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() and line.split()[0].isdigit())
    last = max(i for i, line in enumerate(lines) if line.strip() and line.split()[0].isdigit())
    table = lines[first:last + 1]
    body = [table[i % len(table)] for i in range(rows)]
    return "\n".join(lines[:first] + body + lines[last + 1:]) + "\n"


def _time(argv: list[str]) -> tuple[float, float, int]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
    return wall, cpu, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-fit-") as tmp:
        files = {"bench JSON, 28 sizes": (Path(tmp) / "bench.json", lambda p: p.write_text(json.dumps(
                     _bench_rows(args.rows, False)))),
                 "bench JSON, distinct sizes": (Path(tmp) / "distinct.json", lambda p: p.write_text(json.dumps(
                     _bench_rows(args.rows, True)))),
                 "nccl-tests output": (Path(tmp) / "nccl.txt", lambda p: p.write_text(_nccl_text(args.rows)))}
        print(f"fit of {args.rows:,} rows (commscope fit FILE --out FILE.toml, a fresh process each)")
        print(f"{'file':<28}{'MB':>8}{'wall s':>9}{'CPU s':>9}  exit")
        for label, (path, write) in files.items():
            write(path)
            wall, cpu, code = _time([sys.executable, "-m", "commscope.cli.main", "fit", str(path), "--out",
                                     str(path.with_suffix(".toml"))])
            results[label] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "exit": code,
                              "mb": round(path.stat().st_size / 1e6, 1)}
            print(f"{label:<28}{path.stat().st_size / 1e6:>8.1f}{wall:>9.2f}{cpu:>9.2f}  {code}")
    print(json.dumps({"rows": args.rows, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
