"""Speed of the MoE routing analysis (issue: MoE routing dynamics).

Target: analysing 1,000 iterations of routing for 64 experts over 64 EP ranks (generate the trace, turn it
into rank-to-rank matrices, compute every dynamics metric) takes seconds, not minutes.

    python benchmarks/bench_moe.py            # prints a table and a JSON line
"""

from __future__ import annotations

import json
import resource
import sys
import time

import numpy as np

from commscope.moe import generate, rank_tokens, routing_metrics


def bench_case(label: str, spec: str, *, iterations: int, ep: int, num_experts: int, num_layers: int,
               micro_batches: int = 1, top_k: int = 2, tokens_per_rank: int = 4096) -> dict:
    t0 = time.perf_counter()
    trace = generate(spec, iterations=iterations, ep=ep, num_experts=num_experts, top_k=top_k,
                     tokens_per_rank=tokens_per_rank, num_layers=num_layers, micro_batches=micro_batches, seed=0)
    t1 = time.perf_counter()
    tokens = rank_tokens(trace.counts, trace.placement, ep)  # (it, mb, layer, ep, ep)
    t2 = time.perf_counter()
    metrics = routing_metrics(trace)
    t3 = time.perf_counter()
    assert tokens.sum() == trace.counts.sum() == metrics.pair_tokens.sum()
    return {"case": label, "counts": int(trace.counts.size), "generate_s": t1 - t0, "rank_matrices_s": t2 - t1,
            "metrics_s": t3 - t2, "total_s": t3 - t0,
            "balance_error_mean": float(np.mean(metrics.balance_error)),
            "max_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> int:
    rows = [
        bench_case("1,000 iterations x 64 experts x 64 ranks, zipf:1.2", "zipf:1.2", iterations=1000, ep=64,
                   num_experts=64, num_layers=1),
        bench_case("1,000 iterations x 64 experts x 64 ranks, settle", "settle", iterations=1000, ep=64,
                   num_experts=64, num_layers=1),
        bench_case("deepseek-moe-16b shape: 200 iterations x 27 layers x 8 ranks x 64 experts, top-6, drift", "drift",
                   iterations=200, ep=8, num_experts=64, num_layers=27, top_k=6, tokens_per_rank=16384),
    ]
    for row in rows:
        print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(json.dumps(rows))
    ok = rows[0]["total_s"] < 10.0 and rows[1]["total_s"] < 10.0
    print("targets met" if ok else "TARGETS MISSED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
