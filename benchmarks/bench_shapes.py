"""Speed of the shape analysis (issue: co-design shapes).

Targets: the GEMM model times 100,000 GEMM shapes per second on one core (vectorised); `commscope shapes`
(analysis + search + estimates) for gpt-3b and llama3-70b in under 2 s; a 65-point hidden-size sweep in
under 5 s.

    python benchmarks/bench_shapes.py            # prints a JSON object
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from commscope.estimate.gpus import gpu_preset
from commscope.estimate.shapes import analyse_shapes, gemm_timing, suggest_shapes, sweep_shapes
from commscope.spec.files import load_cluster, load_model
from commscope.spec.parallel import ParallelSpec


def main() -> int:
    rng = np.random.default_rng(0)
    n = 100_000
    m, nn, k = (rng.integers(64, 16384, n) for _ in range(3))
    gpu = gpu_preset("a100")
    t0 = time.perf_counter()
    t = gemm_timing(gpu, m, nn, k, dtype="bf16")
    gemm_s = time.perf_counter() - t0
    row = {"gemms": n, "gemm_model_s": gemm_s, "gemms_per_s": n / gemm_s, "finite": bool(np.isfinite(t.time_s).all())}

    jobs = {
        "gpt-3b/dgx-a100": ("gpt-3b", "dgx-a100", ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4)),
        "llama3-70b/dgx-h100": ("llama3-70b", "dgx-h100",
                                ParallelSpec(tp=8, pp=8, dp=16, global_batch_size=1024, micro_batch_size=1)),
    }
    for label, (model_name, cluster_name, par) in jobs.items():
        model, cluster = load_model(model_name), load_cluster(cluster_name)
        t0 = time.perf_counter()
        report = analyse_shapes(model, par, cluster)
        s = suggest_shapes(model, par, cluster)
        row[label] = {"seconds": time.perf_counter() - t0, "gemm_efficiency": report.gemm_efficiency,
                      "candidates": s.num_candidates, "estimated": s.num_estimated,
                      "best_speedup": s.entries[0].iteration_speedup if s.entries else 1.0}
    model, cluster = load_model("gpt-3b"), load_cluster("dgx-a100")
    t0 = time.perf_counter()
    sweep = sweep_shapes(model, jobs["gpt-3b/dgx-a100"][2], cluster, list(range(2048, 6145, 64)), key="hidden")
    row["sweep_hidden_65"] = {"seconds": time.perf_counter() - t0, "valid": int(sweep.valid.sum())}
    print(json.dumps(row, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
