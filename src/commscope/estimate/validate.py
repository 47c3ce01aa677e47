"""Check the model against measured runs: a CSV of training runs -> predicted vs measured iteration time.

A user's cluster logs iteration times (or TFLOP/s per GPU) for a few jobs; :func:`read_runs` turns each row of
such a CSV into the specs commscope predicts from, and :func:`validate` predicts each run with
:func:`commscope.api.predict` and :func:`commscope.estimate.estimate` and reports the error
``predicted / measured - 1`` per run, its mean absolute value and the worst run.

The file, one run per row; column names in either spelling of each group, case ignored (``-`` and spaces read
as ``_``)::

    case_id|name|run          a label (default: "row N")
    model                     a label, or a model preset / model file when the shape columns are blank
    layers|num_layers, hidden|hidden_size, heads|num_heads|num_attention_heads      the shape
    ffn_hidden|ffn_hidden_size (4h), num_query_groups (heads), vocab|vocab_size (50257), seq_len|seq_length
    t|tp, p|pp, d|dp, cp, ep  parallel sizes (1 when blank; d may come from gpus)
    gpus                      checked to equal t x p x d x cp, or gives d when that is blank
    global_batch|global_batch_size, microbatch|micro_batch_size (1), virtual_pp|virtual_pipeline_size (1)
    recompute                 yes.../full -> full, selective, no/none/blank -> none
    seq_parallel|sequence_parallel, dist_optimizer|distributed_optimizer, tp_comm_overlap,
    overlap_grad_reduce, overlap_param_gather, overlap_p2p_comm, scatter_gather_tensors_in_pipeline,
    gradient_accumulation_fusion, tied_embeddings, gated_mlp                    yes/no/true/false/1/0
    gpu|gpu_type              GPU model text, matched to a cluster preset (a100 -> dgx-a100, h100 -> dgx-h100,
                              v100 -> dgx1-v100, rtx3090 -> rtx3090-pcie) by the aliases of commscope.estimate.gpus
    cluster                   a cluster preset or cluster file (wins over gpu); gpus_per_node overrides it
    intra_node_GBps, inter_node_GBps      link tier bandwidths, GB/s per GPU (override the cluster's)
    dtype (bf16), attention (flash|unfused), fp8_format, framework, position_embedding, normalization
    stack                     a software stack preset (`commscope presets`: megatron-core-2024, megatron-deepspeed)
    grad_reduce_dtype (fp32 for bf16 models), zero_stage, schedule, order, grad_bucket_size, pipeline_layers
                              (7;8;8;7), decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers:
                              every other knob the estimate has
    head_dim, bias, make_vocab_size_divisible_by, num_experts, top_k, moe_layer_freq, moe_ffn_hidden_size,
    num_shared_experts, first_k_dense_layers, capacity_factor      the rest of the model's shape
    measured_iter_time_s|iteration_time_s      the measurement, seconds per iteration; or, when blank,
    measured_tflops_per_gpu   time = the iteration's hardware FLOPs (Megatron's count, recomputation
                              included: :func:`commscope.estimate.flops.iteration_flops`) / (TFLOP/s x GPUs)

Other columns (source, notes, status, mfu, ...) are kept as text in :attr:`Run.extra` and named (the command
says which columns it did not read, so that a misspelt knob is never silently ignored). A blank cell means "the
default": ``defaults`` (a command's flags) first, then the spec's own default; every such assumption is stated
in :attr:`Run.notes`. Every bad cell raises :class:`~commscope.errors.ConfigError` naming the file, the row
(1-based data row and line), the case, the column, the value and what would be valid:
``runs.csv row 3 (line 4, case 'b'): t='two': expected a positive integer``.

Worked example: the H100 row ``mlm_h100_weak_1.7B`` of Megatron-LM's weak-scaling table (t=1, p=1, d=48,
global batch 192 x 4096 tokens, 408.8 TFLOP/s per GPU) measures 0.452 s; 72 B s l h^2 (1 + s/6h + V/12lh) =
8.87e15 FLOP over 48 GPUs at 408.8 TFLOP/s gives the same 0.452 s.

This module predicts and compares (:func:`validate`); reading the file is :mod:`commscope.estimate.validate_runs`,
its cells read by the column table of :mod:`commscope.estimate.validate_columns`, whose names are importable from
here as before.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.estimate.validate_columns import COLUMNS
from commscope.estimate.validate_runs import Run, _at, read_runs
from commscope.spec.cluster import ClusterSpec

__all__ = ["COLUMNS", "TERMS", "Run", "Validation", "ValidationRow", "read_runs", "validate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """One run: measured and predicted seconds per iteration, and the prediction's terms (exposed seconds)."""

    case_id: str
    model: str
    cluster: str
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    measured_s: float
    predicted_s: float
    error: float
    """predicted / measured - 1: +0.10 is a prediction 10% too slow."""
    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    cp_s: float
    ep_s: float
    emb_s: float
    bubble_s: float
    optimizer_s: float
    hidden_s: dict[str, float] = field(default_factory=dict)
    """Communication per axis hidden under compute (not in the terms)."""
    notes: tuple[str, ...] = ()
    """The run's assumptions, then the estimate's notes."""

    @property
    def abs_error(self) -> float:
        return abs(self.error)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["abs_error"] = self.abs_error
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    """Predicted against measured over a set of runs."""

    rows: tuple[ValidationRow, ...]
    mean_abs_error: float
    """Mean of |predicted / measured - 1|."""
    worst_abs_error: float
    worst_case: str
    """case_id of the run with the largest |error|."""

    @property
    def mean_error(self) -> float:
        """Mean signed error: > 0 when the model predicts too slow on average."""
        return sum(r.error for r in self.rows) / len(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"num_runs": len(self.rows), "mean_abs_error": self.mean_abs_error, "mean_error": self.mean_error,
                "worst_abs_error": self.worst_abs_error, "worst_case": self.worst_case,
                "rows": [r.to_dict() for r in self.rows]}


def _bandwidth_for(bandwidth: Any, cluster: ClusterSpec) -> Any:
    """A bandwidth model for one run: a file read with the run's cluster as fallback, a model as is, or None."""
    if bandwidth is None:
        return None
    if isinstance(bandwidth, (str, os.PathLike)):
        from commscope.estimate.bandwidth import AlphaBeta
        from commscope.io.bandwidth_file import read_bandwidth

        return read_bandwidth(Path(bandwidth), fallback=AlphaBeta(cluster))
    return bandwidth


def validate(runs: Iterable[Run], *, bandwidth: Any = None) -> Validation:
    """Predict every run (:func:`commscope.api.predict`, then :func:`commscope.estimate.estimate`) and compare.

    ``bandwidth``: None (each cluster's alpha-beta model), a measured table or fit file (read once per run with
    that run's cluster as the fallback for ops it lacks, as ``commscope estimate --bandwidth`` does), or a
    bandwidth model used as is.
    """
    from commscope.api import predict
    from commscope.estimate.iteration import estimate

    rows = []
    for run in runs:
        try:
            prediction = predict(run.model, run.parallel, run.cluster)
            est = estimate(prediction, bandwidth=_bandwidth_for(bandwidth, run.cluster))
        except ConfigError as exc:
            raise _at(exc, run.where or run.case_id) from None
        measured = run.measured_iteration_time_s
        par = run.parallel
        rows.append(ValidationRow(
            case_id=run.case_id, model=run.model.name, cluster=run.cluster.name, tp=par.tp, pp=par.pp, dp=par.dp,
            cp=par.cp, ep=par.ep, measured_s=measured, predicted_s=est.iteration_time_s,
            error=est.iteration_time_s / measured - 1, compute_s=est.compute_s, tp_s=est.tp_s, pp_s=est.pp_s,
            dp_s=est.dp_s, cp_s=est.cp_s, ep_s=est.ep_s, emb_s=est.emb_s, bubble_s=est.bubble_s,
            optimizer_s=est.optimizer_s, hidden_s=dict(est.hidden_s), notes=run.notes + tuple(est.notes)))
    if not rows:
        raise ConfigError("runs", 0, "no runs to validate")
    worst = max(rows, key=lambda r: r.abs_error)
    return Validation(rows=tuple(rows), mean_abs_error=sum(r.abs_error for r in rows) / len(rows),
                      worst_abs_error=worst.abs_error, worst_case=worst.case_id)


#: The terms of a row, in the order a table shows them: (field, short label).
TERMS: tuple[tuple[str, str], ...] = (("compute_s", "compute"), ("tp_s", "tp"), ("pp_s", "pp"), ("dp_s", "dp"),
                                      ("cp_s", "cp"), ("ep_s", "ep"), ("emb_s", "emb"), ("bubble_s", "bubble"),
                                      ("optimizer_s", "optim"))
