"""Runs CSVs the validate tests write: two small A100 runs, one with a time and one with TFLOP/s only."""

from __future__ import annotations

import csv

HEADER = ["case_id", "model", "layers", "hidden", "heads", "seq_len", "gpu", "gpus", "t", "p", "d", "global_batch",
          "microbatch", "recompute", "seq_parallel", "measured_iter_time_s", "measured_tflops_per_gpu", "source"]
ROWS = [
    ["a", "GPT small", "12", "1024", "16", "2048", "A100 SXM4", "8", "2", "1", "4", "64", "2", "yes", "no", "0.5", "",
     "lab notebook"],
    ["b", "GPT small", "12", "1024", "16", "2048", "A100 SXM4", "8", "1", "2", "4", "64", "", "", "", "", "120",
     "run 2"],
]


def write_runs(path, rows=ROWS, header=HEADER):
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path
