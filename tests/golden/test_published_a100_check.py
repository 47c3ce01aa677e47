"""A check the A100 preset was not fitted on: Megatron-LM runs of Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", arXiv:2205.05198 [korthikanti-2022]): GPT 22B-1T on 8-512 A100 80GB
with sequence parallelism and selective recomputation, the paper's "present work" iteration times.

The four figures are the paper's; each agrees with the model-FLOPs utilisation the paper reports for it
(41.5%, 51.4%, 56.0%, 56.3%: 72 B s l h^2 (1 + s/6h + V/12lh) / (GPUs x 312 TFLOP/s x time)), which this
test checks too, so a mistyped figure fails here instead of moving the model. Shapes and runs as the paper's
tables give them: sequence 2048, vocabulary 51200, t = 8, one sequence per micro-batch, a global batch of one
sequence per GPU; Megatron-LM of 2022, so unfused attention (its fused softmax kernel) and 16-bit training;
gradient accumulation fusion on, which the paper does not state (Megatron-LM has had it since February 2022, then
only with fp32 gradient accumulation, --accumulate-allreduce-grads-in-fp32; these runs do 4-512 micro-batches each,
and with a separate fp16 add per micro-batch instead the check gives 11.1% mean, 13.1% worst: every run 10-13%
slow); the `dgx-a100` preset's network (Selene: DGX A100, 8 HDR NICs per node).

Why it is here: the A100 preset's GEMM fraction was 0.72 after the vTrain fit, which made these runs 11-12%
slow (their GEMMs of h = 6144-25600 at 0.60-0.68 of peak, where Megatron-LM reaches 0.70-0.77). The preset now
sets that fraction from the GEMM rates such runs reach and fits only the memory-bound efficiency on the vTrain
runs (presets/gpus/a100.toml); this test keeps the large-model side of the A100 model honest.
"""

from __future__ import annotations

import pytest
from golden_table import Case, predict, run_cases

from commscope.spec.files import load_cluster
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

# (label, layers, hidden, heads, pp, GPUs, global batch, iteration s, MFU): the paper's Table 2 shapes and its
# end-to-end "present work" times with their model-FLOPs utilisation
RUNS = [
    ("GPT 22B", 48, 6144, 64, 1, 8, 4, 1.10, 0.415),
    ("GPT 175B", 96, 12288, 96, 8, 64, 64, 13.75, 0.514),
    ("GPT 530B", 105, 20480, 128, 35, 280, 280, 37.83, 0.560),
    ("GPT 1T", 128, 25600, 160, 64, 512, 512, 71.49, 0.563),
]
MEAN_APE_LIMIT = 0.08  # reached: 4.7% (a check, not a fit: see the module docstring)
WORST_APE_LIMIT = 0.12  # reached: 8.7% (the 22B run on one node)


def _cases() -> list[Case]:
    cluster = load_cluster("dgx-a100")
    out = []
    for label, layers, h, heads, pp, gpus, batch, time_s, mfu in RUNS:
        s, vocab = 2048, 51200
        flop = 72 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (12 * layers * h))
        assert flop / (gpus * 312e12 * time_s) == pytest.approx(mfu, abs=0.002), label  # the paper's own MFU
        model = ModelSpec(name=label, num_layers=layers, hidden_size=h, num_heads=heads, seq_len=s, vocab_size=vocab,
                          dtype="fp16")
        parallel = ParallelSpec(tp=8, pp=pp, dp=gpus // (8 * pp), micro_batch_size=1, global_batch_size=batch,
                                sequence_parallel=True, recompute="selective", attention="unfused")
        out.append(Case(label.replace(" ", "_"), f"{label} t8p{pp}", predict(model, parallel, cluster), time_s))
    return out


def test_korthikanti_2022_runs(capsys):
    with capsys.disabled():
        rows, mean, worst = run_cases(_cases(), "A100 check (Korthikanti et al. 2022, not fitted): predicted vs measured")
    assert len(rows) == 4
    assert mean < MEAN_APE_LIMIT
    assert worst < WORST_APE_LIMIT
