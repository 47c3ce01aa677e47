"""Chakra export and replay (issue 37): how close the replayed iteration comes to ``commscope estimate``, and what
exporting and replaying cost, for the jobs the issue ran through ASTRA-sim.

For each job: export the traces (:func:`commscope.io.chakra.export_chakra`), replay every rank
(:func:`commscope.io.chakra_replay.replay`: Chakra's semantics, one collective or send at a time per GPU as ASTRA-sim
518bd513 runs them, op times from the cluster's alpha-beta model) and print the simulated iteration beside the
estimate, with the seconds each step took on this machine and the nodes written. ``--unlimited`` adds a second replay
of traces with DP/ZeRO traffic on its own chain and no limit on communication in flight (the estimate's assumption
that NCCL runs it on separate streams), which separates what one network engine per GPU costs from what the trace's
structure does.

    python benchmarks/bench_chakra.py               # the issue's jobs (~5 min on 2 cores, a few GiB of memory)
    python benchmarks/bench_chakra.py --quick       # the small ones (~30 s)
    python benchmarks/bench_chakra.py --unlimited   # also the two-chain, no-limit replay
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace

from commscope.api import predict
from commscope.estimate.iteration import estimate
from commscope.io.chakra import export_chakra
from commscope.io.chakra_replay import bandwidth_timer, replay
from commscope.presets import cluster_preset, model_preset
from commscope.spec.parallel import ParallelSpec

#: (name, model, cluster, parallelism, quick): the issue's jobs; "512 ranks" is GPT-3 175B on 512 A100s.
JOBS = [
    ("1F1B tp2 pp2 dp2", "gpt-1.5b", "dgx-a100", dict(tp=2, pp=2, dp=2, global_batch_size=64, micro_batch_size=4), True),
    ("interleaved tp2 pp4 v2", "gpt-1.5b", "dgx-h100",
     dict(tp=2, pp=4, dp=1, virtual_pipeline_size=2, global_batch_size=16, micro_batch_size=2), True),
    ("cp tp2 pp2 cp2 dp2", "gpt-1.5b", "dgx-h100", dict(tp=2, pp=2, dp=2, cp=2, global_batch_size=16, micro_batch_size=2),
     True),
    ("sp tp2 pp2 dp2", "gpt-1.5b", "dgx-h100",
     dict(tp=2, pp=2, dp=2, sequence_parallel=True, global_batch_size=16, micro_batch_size=2), True),
    ("ZeRO-3 sp tp2 pp2 dp2", "gpt-1.5b", "dgx-h100",
     dict(tp=2, pp=2, dp=2, sequence_parallel=True, zero_stage=3, global_batch_size=16, micro_batch_size=2), True),
    ("MoE mixtral 4 layers pp2 ep4", "mixtral-8x7b:4", "dgx-h100",
     dict(pp=2, dp=4, ep=4, global_batch_size=16, micro_batch_size=1), True),
    ("dist. optimizer, all overlaps", "gpt-1.5b", "dgx-h100",
     dict(tp=2, pp=2, dp=2, sequence_parallel=True, tp_comm_overlap=True, distributed_optimizer=True,
          overlap_grad_reduce=True, overlap_param_gather=True, global_batch_size=16, micro_batch_size=2), True),
    ("1F1B tp8 pp4 dp2", "gpt3-13b", "dgx-a100", dict(tp=8, pp=4, dp=2, global_batch_size=64, micro_batch_size=1), False),
    ("interleaved tp8 pp4 dp2 v2 sp", "gpt3-13b", "dgx-h100",
     dict(tp=8, pp=4, dp=2, virtual_pipeline_size=2, sequence_parallel=True, global_batch_size=64, micro_batch_size=1),
     False),
    ("512 ranks tp8 pp16 dp4", "gpt3-175b", "dgx-a100", dict(tp=8, pp=16, dp=4, global_batch_size=128, micro_batch_size=1),
     False),
]


def _model(name: str):
    base, _, layers = name.partition(":")
    model = model_preset(base)
    return replace(model, name=f"{base}-{layers}l", num_layers=int(layers)) if layers else model


def run(name: str, model: str, cluster_name: str, kw: dict, unlimited: bool) -> dict:
    cluster = cluster_preset(cluster_name)
    pred = predict(_model(model), ParallelSpec(**kw), cluster)
    est = estimate(pred)
    row: dict = {"job": name, "ranks": pred.parallel.world_size, "estimate_ms": est.iteration_time_s * 1e3}
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        export = export_chakra(pred, est, out)
        t1 = time.perf_counter()
        res = replay(out, bandwidth_timer(cluster))
        t2 = time.perf_counter()
    row.update(nodes=sum(export.num_nodes), export_s=t1 - t0, replay_s=t2 - t1, finished=res.finished,
               simulated_ms=res.iteration_time_s * 1e3, diff=res.iteration_time_s / est.iteration_time_s - 1)
    if unlimited:
        with tempfile.TemporaryDirectory() as out:
            export_chakra(pred, est, out, comm_streams=2)
            free = replay(out, bandwidth_timer(cluster), max_comm_in_flight=None)
        row.update(unlimited_ms=free.iteration_time_s * 1e3, unlimited_diff=free.iteration_time_s / est.iteration_time_s - 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="only the small jobs")
    ap.add_argument("--unlimited", action="store_true", help="also replay two chains with no limit in flight")
    args = ap.parse_args()
    rows = []
    print(f"{'job':32s} {'ranks':>5s} {'nodes':>10s} {'export s':>9s} {'replay s':>9s} {'simulated':>11s} "
          f"{'estimate':>11s} {'diff':>7s}" + ("  unlimited   diff" if args.unlimited else ""))
    for name, model, cluster, kw, quick in JOBS:
        if args.quick and not quick:
            continue
        r = run(name, model, cluster, kw, args.unlimited)
        rows.append(r)
        line = (f"{r['job']:32s} {r['ranks']:5d} {r['nodes']:10,d} {r['export_s']:9.1f} {r['replay_s']:9.1f} "
                f"{r['simulated_ms']:8.2f} ms {r['estimate_ms']:8.2f} ms {r['diff']:+7.2%}")
        if not r["finished"]:
            line += "  DEADLOCK"
        if args.unlimited:
            line += f" {r['unlimited_ms']:8.2f} ms {r['unlimited_diff']:+7.2%}"
        print(line, flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
