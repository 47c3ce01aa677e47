"""Speed and memory of the pattern engine (issue: traffic).

Targets: the full traffic matrix of a 405B-class model on 16,384 GPUs (tp 8, pp 16, dp 128) in under 1 s
and 1 GiB; per-axis volumes of at least 10,000 configurations per second on one core.

    python benchmarks/bench_traffic.py            # prints a table and a JSON line
"""

from __future__ import annotations

import json
import resource
import sys
import time
import tracemalloc

import numpy as np

from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import traffic_of
from commscope.pattern.volumes import axis_volumes
from commscope.pattern.workload.dense import build_workload

# Llama-3.1-405B shape (Meta's config.json): 126 layers do not split evenly over 16 stages, so the first and
# last stage hold 7 layers and the others 8, as Meta's own 405B run did.
LLAMA_405B = ModelSpec(name="llama3-405b", num_layers=126, hidden_size=16384, num_heads=128, num_query_groups=8,
                       ffn_hidden_size=53248, vocab_size=128256, seq_len=8192, tied_embeddings=False,
                       position_embedding="rope", gated_mlp=True, bias=False, normalization="rmsnorm")
PARALLEL_16K = ParallelSpec(tp=8, pp=16, dp=128, global_batch_size=2048, micro_batch_size=1,
                            pipeline_layers=(7,) + (8,) * 14 + (7,), sequence_parallel=True)


def bench_full_matrix(repeats: int = 5) -> dict:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        tm = traffic_of(build_workload(LLAMA_405B, PARALLEL_16K), 8)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    tm = traffic_of(build_workload(LLAMA_405B, PARALLEL_16K), 8)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {"case": "llama3-405b, 16384 GPUs (tp8 pp16 dp128, sp), full matrix",
            "time_s_median": float(np.median(times)), "time_s_min": min(times),
            "peak_traced_MiB": peak / 2**20, "num_pairs": tm.num_pairs, "total_bytes": tm.total_bytes,
            "max_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def bench_volumes(n: int = 200_000) -> dict:
    rng = np.random.default_rng(0)
    tp = rng.choice([1, 2, 4, 8], n)
    pp = rng.choice([1, 2, 3, 6, 7, 9, 14, 18], n)
    dp = rng.choice([1, 2, 4, 8, 16, 32, 64], n)
    mb = rng.choice([1, 2, 4], n)
    t0 = time.perf_counter()
    vol = axis_volumes(LLAMA_405B, tp=tp, pp=pp, dp=dp, micro_batch_size=mb, global_batch_size=2048 * 4,
                       sequence_parallel=rng.random(n) < 0.5, zero_stage=rng.choice([0, 1, 3], n))
    dt = time.perf_counter() - t0
    assert vol["tp"].shape == (n,)
    return {"case": f"per-axis volumes of {n:,} configurations (vectorised)", "time_s": dt,
            "configs_per_s": n / dt}


def bench_workload_loop(n: int = 300) -> dict:
    model = ModelSpec(name="gpt-3b", num_layers=24, hidden_size=3072, num_heads=32, seq_len=1024)
    configs = [(tp, pp, dp) for tp in (1, 2, 4, 8) for pp in (1, 2, 3, 4, 6) for dp in (1, 2, 4, 8)]
    t0 = time.perf_counter()
    done = 0
    while done < n:
        for tp, pp, dp in configs:
            traffic_of(build_workload(model, ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=512, micro_batch_size=2)), 8)
            done += 1
    dt = time.perf_counter() - t0
    return {"case": "full workload + matrix per configuration (gpt-3b, <= 256 GPUs)", "configs_per_s": done / dt}


def main() -> int:
    rows = [bench_full_matrix(), bench_volumes(), bench_workload_loop()]
    for row in rows:
        print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(json.dumps(rows))
    ok = rows[0]["time_s_median"] < 1.0 and rows[0]["peak_traced_MiB"] < 1024 and rows[1]["configs_per_s"] >= 10_000
    print("targets met" if ok else "TARGETS MISSED", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
