"""Throughput of `commscope plan` (issue: estimate). Target: a sweep of 100,000 configurations in seconds.

    python benchmarks/bench_plan.py
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from commscope.estimate.memory import total_memory_bytes
from commscope.estimate.plan import (
    RECOMPUTE_CODES,
    PlanSpace,
    candidates,
    plan,
    screen_time_s,
    valid_mask,
)
from commscope.spec.files import load_cluster, load_model


def main() -> int:
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100")
    space = PlanSpace(micro_batch_sizes=(1, 2, 4, 8, 16, 32), virtual_pipeline_sizes=(1, 2, 3, 4, 5), cp_sizes=(1, 2, 4, 8),
                      max_tp=64)
    t0 = time.perf_counter()
    c = candidates(model, 8192, cluster, 4096, space)
    n = c["tp"].size
    ok = valid_mask(model, c)
    c = {k: v[ok] for k, v in c.items()}
    mem = total_memory_bytes(model, tp=c["tp"], pp=c["pp"], dp=c["dp"], cp=c["cp"], ep=c["ep"], micro_batch_size=c["mb"],
                             global_batch_size=c["gb"], virtual_pipeline_size=c["v"], sequence_parallel=c["sp"].astype(bool),
                             recompute=np.array(RECOMPUTE_CODES, dtype=object)[c["recompute"]], zero_stage=c["zero"],
                             distributed_optimizer=c["dist_opt"])
    t = screen_time_s(model, cluster, c)
    screen_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    result = plan(model, cluster, 8192, 4096, top=10, space=space)  # every candidate that fits, op by op
    plan_s = time.perf_counter() - t1
    row = {"candidates": int(n), "valid": int(ok.sum()), "screen_s": screen_s, "configs_per_s": n / screen_s,
           "plan_end_to_end_s": plan_s, "fit": result.num_fit, "ranked_per_s": result.num_fit / result.rank_s, "best_iteration_s": result.entries[0].estimate.iteration_time_s,
           "finite": bool(np.isfinite(t).all() and np.isfinite(mem).all())}
    print(json.dumps(row, indent=2))
    return 0 if n >= 100_000 and plan_s < 30 else 1


if __name__ == "__main__":
    sys.exit(main())
