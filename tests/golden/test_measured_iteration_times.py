"""Golden validation: predicted vs measured iteration times of GPT models on A100 clusters.

Data: ../shared/data/measured_iteration_times.csv (vTrain, Bang et al. MICRO'24: Megatron-DeepSpeed,
1F1B, activation checkpointing on). The A100 preset's constants are kernel-level
(presets/gpus/a100.toml says where each comes from), never fitted to this table; what the table still differs by is
the ``megatron-deepspeed`` stack's efficiency (presets/stacks/), fitted once on these ten runs: the test prints the
default's error and the stack's, and holds the preset's value to the best fit.
Assumptions, stated because the file does not give them:
- vocabulary 50257 (GPT-2 tokenizer, Megatron's default for GPT), padded to 128 x tp; tied embeddings;
  learned positions; LayerNorm; biases; fp16 training with fp16 gradient all-reduce (Megatron-DeepSpeed's
  GPT recipes use --fp16; commscope reduces in fp32 only for bf16 models);
- recompute "yes" = full recomputation; no sequence parallelism (the column is empty); unfused attention
  (Megatron-DeepSpeed's GPT of 2022-23 without --use-flash-attn: --attention-backend unfused), whose fused softmax
  kernel runs only where b x heads/t is a multiple of 4: vtrain_multi_09 (t16, micro-batch 2: 6) runs PyTorch's fp32
  softmax (vTrain's own copy of the model, src/model/fused_softmax.py, has the same rule), 2.4 s of its 20.4 (it
  was predicted 11% fast without it);
- no gradient accumulation fusion: Megatron-DeepSpeed trains under DeepSpeed's engine, whose autograd accumulates
  each micro-batch's fp16 weight gradients into ``.grad`` with a separate add (Megatron's fused wgrad-accumulate
  kernel writes Megatron's own ``main_grad``, which that engine does not have; Megatron-LM itself had the fusion only
  from February 2022, with fp16 gradients only from September 2022, megatron/arguments.py): 6 bytes per parameter per micro-batch,
  0.01-0.2 s of these runs;
- cluster: the `dgx-a100` preset (A100, 8 GPUs per node) with the inter-node rate the vTrain testbed states:
  800 Gb/s per node (12.5 GB/s per GPU); tensor-parallel all_reduces inside a node timed from the testbed's own
  all_reduce measurements over 2, 4 and 8 of its A100s at 1 MiB-1 GiB (vTrain's trace/a100 tables, the vTrain
  A100 rows of shared/data/published_busbw.csv), as a user passes their nccl-tests sweep with
  ``estimate --bandwidth``; everything else (inter-node groups) from the preset's alpha-beta model. At the
  100 MB messages of these runs the testbed's NVLink reaches 172 (2 GPUs), 195 (4) and 208 GB/s (8), not the
  230 GB/s plateau the preset holds for 1 GiB and above: with the preset alone the error is 4.5% mean, 16.0%
  worst. The CSV's "intra 150 GB/s" is vTrain's simulator parameter, not a measurement (5.4% / 17.3% with it).
"""

from __future__ import annotations

import csv
from dataclasses import replace

from conftest import SHARED, requires_shared
from golden_table import Case, best_efficiency, predict, run_cases, with_stack

from commscope.estimate.bandwidth import AlphaBeta, MeasuredTable, TableRow
from commscope.spec.files import load_cluster
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.estimate.stacks import stack_preset
from commscope.units import GBIT

CSV = SHARED / "data" / "measured_iteration_times.csv"
BUSBW = SHARED / "data" / "published_busbw.csv"
STACK = "megatron-deepspeed"
MEAN_APE_LIMIT = 0.05  # with the stack: the target; reached: 4.6% (see the printed table)
#: The default alone (kernels x in-training effects, no stack): 6.5% mean, 18.5% worst.
DEFAULT_MEAN_APE_LIMIT = 0.08
# the target; reached: 13.3% with the stack, by vtrain_multi_07 (t4 p2, predicted 13% fast) against vtrain_multi_06 (t8 p1,
# 4% slow) and vtrain_multi_08 (t1 p8, 6% slow) at the same model, batch and work per GPU: 07 does less TP and DP
# communication than 06 and half its memory-bound work, yet measured 1.3 s slower; nothing in Megatron-DeepSpeed's
# pipeline engine found so far (serial p2p, tied-embedding all-reduce, partitioned activations) adds over 0.3 s
WORST_APE_LIMIT = 0.15


def _testbed_all_reduce() -> list[TableRow]:
    """The vTrain testbed's measured all_reduce bus bandwidth on A100 (2-8 GPUs inside one node)."""
    with BUSBW.open() as f:
        rows = [TableRow(op=r["collective"], group_size=int(r["n_gpus"]), size_bytes=int(r["size_bytes"]),
                         busbw_bytes_per_s=float(r["busbw_GBps"]) * 1e9, intra_node=True)
                for r in csv.DictReader(f) if r["source"].startswith("vTrain") and r["hardware"].startswith("A100")]
    assert {(r.op, r.group_size) for r in rows} == {("all_reduce", 2), ("all_reduce", 4), ("all_reduce", 8)}
    return rows


def _cases() -> list[Case]:
    measured = _testbed_all_reduce()
    preset = load_cluster("dgx-a100")
    cluster = replace(preset, inter_node=replace(preset.inter_node, bandwidth_bytes_per_s=800 * GBIT / 8,
                                                 source="vTrain testbed: 800 Gb/s per node"))
    out = []
    with CSV.open() as f:
        for case in csv.DictReader(f):
            h, layers, heads = int(case["hidden"]), int(case["layers"]), int(case["heads"])
            model = ModelSpec(name=case["model"], num_layers=layers, hidden_size=h, num_heads=heads,
                              seq_len=int(case["seq_len"]), vocab_size=int(case["vocab"] or 50257), dtype="fp16")
            parallel = ParallelSpec(tp=int(case["t"]), pp=int(case["p"]), dp=int(case["d"]),
                                    global_batch_size=int(case["global_batch"]),
                                    micro_batch_size=int(case["microbatch"]),
                                    recompute="full" if case["recompute"].startswith("yes") else "none",
                                    sequence_parallel=case["seq_parallel"].strip().lower() == "yes",
                                    attention="unfused", gradient_accumulation_fusion=False)
            assert parallel.world_size == int(case["gpus"])
            out.append(Case(case["case_id"], f"{case['model']} t{parallel.tp}p{parallel.pp}d{parallel.dp}",
                            predict(model, parallel, cluster), float(case["measured_iter_time_s"]),
                            MeasuredTable(rows=measured, source="vTrain testbed all_reduce",
                                          fallback=AlphaBeta(cluster))))
    return out


@requires_shared("data", "measured_iteration_times.csv")
def test_measured_iteration_times(capsys):
    cases = _cases()
    with capsys.disabled():
        _, default_mean, _ = run_cases(cases, "A100 (vTrain, Megatron-DeepSpeed), default (no stack): predicted vs measured")
        rows, mean, worst = run_cases(with_stack(cases, STACK), f"A100 (vTrain, Megatron-DeepSpeed), --stack {STACK}")
    assert len(rows) == 10
    assert all(est.compute_model == "gpu" for _, est, _ in rows)
    assert mean < MEAN_APE_LIMIT
    assert worst < WORST_APE_LIMIT
    assert default_mean < DEFAULT_MEAN_APE_LIMIT


@requires_shared("data", "measured_iteration_times.csv")
def test_the_stack_preset_is_the_tables_best_fit():
    """presets/stacks/megatron-deepspeed.toml holds the efficiency that fits this table best (steps of 0.01)."""
    best, _ = best_efficiency(_cases())
    assert stack_preset(STACK).compute_efficiency == best
