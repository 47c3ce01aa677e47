"""Golden validation: predicted vs measured iteration times of Megatron-core GPT on H100 (weak scaling).

Data: ../shared/data/measured_iteration_times_h100.csv, the Megatron-LM README's 2024 table (Megatron-core
r0.8, 1.7B-462B on 48-6,144 H100s); its iteration times are derived from the TFLOP/s per GPU it reports.
The H100 preset's constants come from kernels measured on the same silicon (an H200, shared/data/gpu), never
from this table; what the table still differs by is the ``megatron-core-2024`` stack's efficiency
(presets/stacks/), fitted once on these nine runs: the test prints the default's error and the stack's, and holds
the preset's value to the best fit.
The README states the flags --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap, "and
pipeline-parallel communication (enabled by default)" overlapped, vocabulary 131072, sequence 4096; the CSV
infers sequence parallelism (needed by --tp-comm-overlap) and the distributed optimizer (needed by
--overlap-param-gather). Assumed, as the table does not say:

- pipelined runs (p > 1) use the interleaved schedule with one layer per virtual stage: Megatron overlaps
  pipeline communication only in its interleaved schedule (--overlap-p2p-communication), the 119B and 462B runs
  hold a prime number of layers per stage (23 and 7), so one layer per virtual stage is the only interleaving
  they allow, and every pipelined run's micro-batch count is a multiple of p, as Megatron's interleaved
  schedule requires; micro-batch 1;
- unpipelined runs (p = 1) take each replica's 4 sequences as one micro-batch (no gradient accumulation): the
  16B (t4) and 32B (t8) runs differ by 5% although the 32B run's fp32 gradient reduce-scatter gets one NIC per
  GPU instead of two (0.52 s against 0.29 s of DP traffic); only a backward pass of the whole batch, not of a
  quarter of it, hides both (with 4 micro-batches of 1 the 32B run is predicted 33% slow);
- no recomputation, GPT-style blocks with RoPE, untied embeddings, a 4h GeLU MLP, bf16 with fp32 gradient
  reduction (Megatron's default for bf16), fused (flash) attention, and the `dgx-h100` preset's network
  (NVLink4 370 GB/s, one 400 Gb/s NIC per GPU).
"""

from __future__ import annotations

import csv

from conftest import SHARED, requires_shared
from golden_table import Case, best_efficiency, predict, run_cases, with_stack

from commscope.spec.files import load_cluster
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.estimate.stacks import stack_preset

CSV = SHARED / "data" / "measured_iteration_times_h100.csv"
STACK = "megatron-core-2024"
MEAN_APE_LIMIT = 0.05  # with the stack: the target; reached 3.1% (see the printed table)
WORST_APE_LIMIT = 0.15  # reached: 12.7% (70B)
#: The default alone (kernels x in-training effects, no stack) predicts every run fast: 17.1% mean, 23.0% worst.
DEFAULT_MEAN_APE = (0.10, 0.25)


def _yes(text: str) -> bool:
    return text.strip().lower() in ("yes", "true", "1")


def _cases() -> list[Case]:
    cluster = load_cluster("dgx-h100")
    out = []
    with CSV.open() as f:
        for r in csv.DictReader(f):
            model = ModelSpec(name=r["model"], num_layers=int(r["layers"]), hidden_size=int(r["hidden"]),
                              num_heads=int(r["heads"]), ffn_hidden_size=int(r["ffn_hidden"]), vocab_size=int(r["vocab"]),
                              seq_len=int(r["seq_len"]), dtype="bf16", tied_embeddings=False, position_embedding="rope")
            sp = _yes(r["seq_parallel"])
            tp, pp, dp, gbs = int(r["t"]), int(r["p"]), int(r["d"]), int(r["global_batch"])
            # the assumptions of the module docstring, where the table leaves a cell blank
            mbs = int(r["microbatch"] or (1 if pp > 1 else gbs // dp))
            vp = int(r["virtual_pp"] or (int(r["layers"]) // pp if pp > 1 else 1))
            parallel = ParallelSpec(tp=tp, pp=pp, dp=dp, cp=int(r["cp"] or 1), global_batch_size=gbs,
                                    micro_batch_size=mbs, virtual_pipeline_size=vp, sequence_parallel=sp,
                                    distributed_optimizer=_yes(r["dist_optimizer"]), overlap_grad_reduce=True,
                                    overlap_param_gather=True, tp_comm_overlap=sp and int(r["t"]) > 1,
                                    recompute="none" if not r["recompute"] else r["recompute"])
            out.append(Case(r["case_id"], f"{r['model']} t{parallel.tp}p{parallel.pp}d{parallel.dp}",
                            predict(model, parallel, cluster), float(r["measured_iter_time_s"])))
    return out


@requires_shared("data", "measured_iteration_times_h100.csv")
def test_megatron_h100_weak_scaling(capsys):
    cases = _cases()
    with capsys.disabled():
        _, default_mean, _ = run_cases(cases, "H100 (Megatron-LM README 2024), default (no stack): predicted vs measured")
        rows, mean, worst = run_cases(with_stack(cases, STACK), f"H100 (Megatron-LM README 2024), --stack {STACK}")
    assert len(rows) == 9
    # the overlaps the runs used are modelled: TP and DP communication is partly hidden, and reported as such
    assert all(est.hidden_s.get("dp", 0) > 0 for _, est, _ in rows)
    assert all(est.hidden_s.get("tp", 0) > 0 for case, est, _ in rows if case.prediction.parallel.tp > 1)
    # the in-training effects are named in the breakdown
    assert all(est.compute_breakdown_s["clock_s"] > 0 and est.compute_breakdown_s["stack_s"] > 0 for _, est, _ in rows)
    assert mean < MEAN_APE_LIMIT
    assert worst < WORST_APE_LIMIT
    assert DEFAULT_MEAN_APE[0] < default_mean < DEFAULT_MEAN_APE[1]


@requires_shared("data", "measured_iteration_times_h100.csv")
def test_the_stack_preset_is_the_tables_best_fit():
    """presets/stacks/megatron-core-2024.toml holds the efficiency that fits this table best (steps of 0.01)."""
    best, _ = best_efficiency(_cases())
    assert stack_preset(STACK).compute_efficiency == best
