"""Speed at the scales users run (issue 17): one row per target, commscope's figure and, where installed, a peer's.

Rows:

1. op-level estimates (predict + refined estimate, the result of ``estimate(predict(...))``) of GPT-3 175B on
   1,024 A100s through :func:`commscope.estimate_many.estimate_many`: every valid configuration of a sweep
   (tp, pp, micro-batch, virtual stages, SP, recomputation, ZeRO), and t8 p16 d8 / t8 p8 d16 alone; per CPU
   second of this one process. The scalar path (one ``estimate(predict(...))`` per configuration) for reference,
   and llm-analysis (``pip install llm-analysis``; a coarser model) on the same job when it is installed.
2. ``plan --model llama3-70b --gpus 512`` (the README example): every configuration that fits ranked op by op.
3. routed MoE traffic (mixtral, ep 8, ``--routing zipf:1.2``) at 131,072 GPUs (1,048,576 with ``--large``):
   wall time and peak memory of a fresh process.
4. recording: CPU added per op on one rank (4 B all_reduce issued then waited; the rank and its backend's threads on
   one core, in 3 fresh processes: ``bench_capture.bench_per_op``); the 8-rank step is ``bench_capture.py``'s.
5. start-up: ``commscope --help``, ``commscope traffic --help``; CPU of a 4-rank ``bench --backend gloo``.

    python benchmarks/bench_scale.py            # prints a table and a JSON line (~2 min on 2 cores)
    python benchmarks/bench_scale.py --large    # adds 1,048,576 GPUs (~10 s, ~1.5 GiB more)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from commscope.api import predict
from commscope.estimate import estimate
from commscope.estimate_many import estimate_many
from commscope.plan import RECOMPUTE_CODES, PlanSpace, candidates, plan, valid_mask
from commscope.spec.files import load_cluster, load_model
from commscope.spec.parallel import ParallelSpec

PY = sys.executable
CLI = [PY, "-m", "commscope.cli.main"]


def _rate(fn, min_s: float = 2.0) -> tuple[float, float]:
    """(calls per wall second, calls per CPU second) of ``fn`` run for at least ``min_s``."""
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < min_s:
        n += fn()
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0)


def _gpt3_sweep() -> list[ParallelSpec]:
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100")
    c = candidates(model, 1024, cluster, 1536, PlanSpace(micro_batch_sizes=(1, 2, 4, 8)))
    c = {k: v[valid_mask(model, c)] for k, v in c.items()}
    return [ParallelSpec(tp=int(c["tp"][i]), pp=int(c["pp"][i]), dp=int(c["dp"][i]), micro_batch_size=int(c["mb"][i]),
                         global_batch_size=1536, virtual_pipeline_size=int(c["v"][i]), sequence_parallel=bool(c["sp"][i]),
                         recompute=RECOMPUTE_CODES[int(c["recompute"][i])], zero_stage=int(c["zero"][i]),
                         distributed_optimizer=bool(c["dist_opt"][i])) for i in range(c["tp"].size)]


def _llm_analysis_rate(tp: int, pp: int, dp: int) -> float | None:
    """Configurations per CPU second of llm-analysis's training estimate of the same job, or None."""
    try:
        from llm_analysis.analysis import LLMAnalysis, ParallelismConfig
        from llm_analysis.config import (
            get_dtype_config_by_name,
            get_gpu_config_by_name,
            get_model_config_by_name,
        )
    except ImportError:
        return None
    logging.disable(logging.CRITICAL)
    cfg = (get_model_config_by_name("megatron-lm-175b"), get_gpu_config_by_name("a100-sxm-80gb"),
           get_dtype_config_by_name("w16a16e16"))

    def one() -> int:
        a = LLMAnalysis(*cfg, ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp), flops_efficiency=0.5,
                        hbm_memory_efficiency=0.9)
        a.training(global_batch_size=1536, seq_len=2048, batch_size_per_gpu=1)
        return 1

    return _rate(one)[1]


def bench_estimates() -> list[dict[str, Any]]:
    model, cluster = load_model("gpt3-175b"), load_cluster("dgx-a100")
    rows = []
    sweep = _gpt3_sweep()
    wall, cpu = _rate(lambda: len(estimate_many(model, cluster, _gpt3_sweep())), min_s=3.0)
    rows.append({"row": f"op-level estimate, GPT-3 175B on 1,024 GPUs, sweep of {len(sweep):,} configurations "
                        "(ParallelSpec construction included)", "configs_per_cpu_s": cpu, "configs_per_s": wall})
    for tp, pp, dp in ((8, 16, 8), (8, 8, 16)):
        par = ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=1536, sequence_parallel=True)
        wall, cpu = _rate(lambda par=par: len(estimate_many(model, cluster, [par] * 1000)))
        _, scalar_cpu = _rate(lambda par=par: bool(estimate(predict(model, par, cluster))) or 1)
        peer = _llm_analysis_rate(tp, pp, dp)
        rows.append({"row": f"op-level estimate, t{tp} p{pp} d{dp} (1,000 in one call)", "configs_per_cpu_s": cpu,
                     "configs_per_s": wall, "scalar_configs_per_cpu_s": scalar_cpu,
                     "llm_analysis_configs_per_cpu_s": peer, "ratio_to_llm_analysis": cpu / peer if peer else None})
    return rows


def bench_plan() -> dict[str, Any]:
    model, cluster = load_model("llama3-70b"), load_cluster("dgx-h100")
    times, result = [], None
    for _ in range(3):
        t0 = time.perf_counter()
        result = plan(model, cluster, 512, 1024, top=10)
        times.append(time.perf_counter() - t0)
    cmd = [*CLI, "plan", "--model", "llama3-70b", "--gpus", "512", "--cluster", "dgx-h100", "--global-batch-size",
           "1024", "--top", "10", "--json"]
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
    assert result is not None
    return {"row": f"plan llama3-70b on 512 GPUs: all {result.num_fit} that fit ranked op by op",
            "plan_s_median": statistics.median(times), "plan_s_spread": [min(times), max(times)],
            "command_s_median": statistics.median(walls), "command_s_spread": [min(walls), max(walls)]}


_MOE = """
import resource, sys, time
t0 = time.perf_counter()
from commscope import ParallelSpec, predict
from commscope.moe.generators import routing_for_job
from commscope.spec.files import load_model
gpus, spec = int(sys.argv[1]), sys.argv[2]
model = load_model("mixtral-8x7b")
par = ParallelSpec(tp=2, pp=4, dp=gpus // 8, ep=8, global_batch_size=gpus)
routing = None if spec == "balanced" else routing_for_job(spec, model, par)
summary = predict(model, par, "dgx-h100", routing=routing).summary()
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, summary["num_pairs"])
"""


def bench_moe(gpus: int, routing: str = "zipf:1.2") -> dict[str, Any]:
    out = subprocess.run([PY, "-c", _MOE, str(gpus), routing], check=True, capture_output=True, text=True).stdout.split()
    return {"row": f"MoE traffic, mixtral ep 8, {routing} routing, {gpus:,} GPUs (fresh process, imports included)",
            "time_s": float(out[0]), "peak_rss_GiB": int(out[1]) / 2**30, "num_pairs": int(out[2])}


def bench_recording() -> dict[str, Any]:
    """One rank (it and its backend's threads on one core: see bench_capture.bench_per_op), 4 B all_reduce, issued
    then waited as frameworks call, in 3 fresh processes: CPU of the rank's process added per op, recorded - plain."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_capture import bench_per_op

    r = bench_per_op(100, 1, "gloo", ranks=1, rounds=200, async_op=True, processes=3, pin=True)
    return {"row": "recording, one rank (one core), 4 B all_reduce issued then waited: CPU added per op, recorded - plain "
                   "(3 processes x 200 rounds)",
            "overhead_us_median": r["overhead_proc_us"], "overhead_us_ci95": r["overhead_proc_ci95"],
            "overhead_us_per_process": r["overhead_proc_per_process"], "plain_us": r["plain_proc_us"]}


def bench_logs(ranks: int = 4096, ops_per_rank: int = 200) -> dict[str, Any]:
    """summarize and compare over synthetic logs of ``ranks`` ranks, rank file by rank file (benchmarks/bench_logs.py;
    its default is the full 4,096 ranks x 50,000 ops)."""
    out = subprocess.run([PY, str(Path(__file__).parent / "bench_logs.py"), "--ranks", str(ranks), "--ops-per-rank",
                          str(ops_per_rank), "--jobs", str(min(2, os.cpu_count() or 1))],
                         check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"row": f"summarize / compare over recorded logs, {ranks:,} ranks x ~{ops_per_rank:,} ops (streamed rank by rank)",
            **{f"{name}_{key}": r[name][key] for name in ("summarize", "compare")
               for key in ("records", "wall_s", "records_per_s", "peak_rss_GiB")}}


def bench_startup() -> dict[str, Any]:
    def wall(cmd: list[str], n: int = 5) -> float:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    base = wall([PY, "-c", "pass"])
    cpu = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([*CLI, "bench", "--nproc", "4", "--backend", "gloo", "-b", "8", "-e", "8", "-n", "2", "-w",
                            "1", "--ops", "all_reduce", "--out", str(Path(d) / "bench.json")], check=True, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return {"row": "start-up", "python_s": base, "help_s": wall([*CLI, "--help"]),
            "traffic_help_s": wall([*CLI, "traffic", "--help"]),
            "bench_4_ranks_cpu_s_median": statistics.median(cpu), "bench_4_ranks_cpu_s_spread": [min(cpu), max(cpu)]}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(map(_fmt, v)) + "]"
    return str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large", action="store_true", help="also 1,048,576 GPUs of routed MoE traffic")
    args = ap.parse_args(argv)
    rows: list[dict[str, Any]] = [*bench_estimates(), bench_plan(), bench_moe(131072), bench_moe(131072, "balanced")]
    if args.large:
        rows.append(bench_moe(1048576))
    rows += [bench_recording(), bench_logs(), bench_startup()]
    for r in rows:
        print(r["row"])
        print("    " + ", ".join(f"{k}={_fmt(v)}" for k, v in r.items() if k != "row"))
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
