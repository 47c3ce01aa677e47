"""Shape sweeps: the predicted GEMM and end-to-end throughput of a job as one shape quantity varies.

:func:`sweep_shapes` varies one of :data:`SWEEP_KEYS` (hidden size, heads, FFN, layers, sequence, micro-batch,
vocabulary) over given values, skips (and says why) the values that make an invalid job, and predicts the GEMM
efficiency and TFLOP/s of the rest with the tile/wave model and their iteration with
:func:`commscope.estimate.estimate`: the co-design paper's throughput curves. Part of
:mod:`commscope.estimate.shapes`, which re-exports its names.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.estimate.gpus import GpuSpec, gpu_for_cluster
from commscope.estimate.shapes_report import _gemm_efficiency
from commscope.estimate.shapes_rules import _broken
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import Attention, ParallelSpec
from commscope.units import TFLOP


#: Sweepable quantities and what varies with them.
SWEEP_KEYS: dict[str, str] = {
    "hidden": "hidden_size (heads kept, so the head size changes; FFN kept at the same ratio to h)",
    "heads": "num_heads (h kept, so the head size changes; query groups kept in proportion)",
    "ffn": "ffn_hidden_size",
    "layers": "num_layers",
    "seq": "seq_len",
    "micro_batch": "micro_batch_size",
    "vocab": "vocab_size (padded as make_vocab_size_divisible_by says)",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepResult:
    """Predicted throughput of a job as one shape quantity varies (arrays over ``values``; NaN where skipped)."""

    key: str
    values: np.ndarray
    valid: np.ndarray
    gemm_efficiency: np.ndarray
    gemm_tflops_per_gpu: np.ndarray
    """Achieved TFLOP/s of the GEMMs of a micro-batch (the co-design paper's y axis)."""
    model_tflops_per_gpu: np.ndarray
    """Model FLOPs per second per GPU of the whole iteration (MFU x peak; communication and bubble included)."""
    iteration_time_s: np.ndarray
    tokens_per_s: np.ndarray
    num_parameters: np.ndarray
    broken_rules: tuple[tuple[str, ...], ...]
    skipped: tuple[str, ...]
    """Why each skipped value was skipped."""
    model: str
    gpu: str

    def to_dict(self) -> dict[str, Any]:
        def clean(a: np.ndarray) -> list[Any]:
            return [None if (isinstance(x, float) and math.isnan(x)) else x for x in a.tolist()]

        return {"key": self.key, "model": self.model, "gpu": self.gpu, "values": self.values.tolist(),
                "valid": self.valid.tolist(), "gemm_efficiency": clean(self.gemm_efficiency),
                "gemm_tflops_per_gpu": clean(self.gemm_tflops_per_gpu),
                "model_tflops_per_gpu": clean(self.model_tflops_per_gpu),
                "iteration_time_s": clean(self.iteration_time_s), "tokens_per_s": clean(self.tokens_per_s),
                "num_parameters": clean(self.num_parameters), "broken_rules": [list(r) for r in self.broken_rules],
                "skipped": list(self.skipped)}


def _sweep_job(model: ModelSpec, parallel: ParallelSpec, key: str, value: int) -> tuple[ModelSpec, ParallelSpec]:
    if key == "hidden":
        if value % model.num_heads:
            raise ConfigError("hidden", value, f"not divisible by num_heads={model.num_heads}")
        f = round(model.ffn / model.hidden_size * value / parallel.tp) * parallel.tp
        return dataclasses.replace(model, hidden_size=value, head_dim=None, ffn_hidden_size=f), parallel
    if key == "heads":
        ratio = model.num_heads // model.kv_heads
        if value % ratio:
            raise ConfigError("heads", value, f"not a multiple of the query-group ratio {ratio}")
        groups = None if model.num_query_groups is None else value // ratio
        return dataclasses.replace(model, num_heads=value, head_dim=None, num_query_groups=groups), parallel
    if key == "ffn":
        return dataclasses.replace(model, ffn_hidden_size=value), parallel
    if key == "layers":
        return dataclasses.replace(model, num_layers=value), parallel
    if key == "seq":
        return dataclasses.replace(model, seq_len=value), parallel
    if key == "micro_batch":
        return model, dataclasses.replace(parallel, micro_batch_size=value)
    if key == "vocab":
        return dataclasses.replace(model, vocab_size=value), parallel
    raise ConfigError("sweep", key, f"valid keys: {', '.join(SWEEP_KEYS)}")


def sweep_shapes(model: ModelSpec, parallel: ParallelSpec, cluster: ClusterSpec, values: Sequence[int], *,
                 key: str = "hidden", gpu: GpuSpec | None = None, attention: Attention = "flash",
                 bandwidth: Any = None) -> SweepResult:
    """Predicted GEMM and end-to-end throughput of the job for each value of ``key`` (see :data:`SWEEP_KEYS`).

    Values that make an invalid job (heads that do not divide h, tp that does not divide the heads, ...) are
    skipped and said why.
    """
    from commscope.api import predict
    from commscope.estimate.iteration import estimate
    from commscope.pattern.workload.dense import check_job

    if key not in SWEEP_KEYS:
        raise ConfigError("sweep", key, f"valid keys: {', '.join(SWEEP_KEYS)}")
    if not len(values):
        raise ConfigError("sweep", list(values), "needs at least one value")
    g = gpu or gpu_for_cluster(cluster)
    peak = g.peak_flops_for(model.dtype)
    n = len(values)
    arrays = {name: np.full(n, np.nan) for name in ("eff", "gemm", "model", "iter", "tokens", "params")}
    valid = np.zeros(n, dtype=bool)
    broken: list[tuple[str, ...]] = []
    skipped: list[str] = []
    for i, value in enumerate(values):
        try:
            m, p = _sweep_job(model, parallel, key, int(value))
            check_job(m, p)
        except (ConfigError, ValueError) as exc:
            skipped.append(f"{key}={value}: {exc}")
            broken.append(())
            continue
        _, flop, time = _gemm_efficiency(m, p, g, attention)
        eff = flop / (time * peak)
        est = estimate(predict(m, dataclasses.replace(p, attention=attention), cluster), gpu=g, bandwidth=bandwidth)
        valid[i] = True
        arrays["eff"][i] = eff
        arrays["gemm"][i] = flop / time / TFLOP
        arrays["model"][i] = est.mfu * est.peak_flops / TFLOP
        arrays["iter"][i] = est.iteration_time_s
        arrays["tokens"][i] = est.tokens_per_s
        arrays["params"][i] = m.num_parameters()
        broken.append(_broken(m, p))
    return SweepResult(key=key, values=np.asarray(values, dtype=np.int64), valid=valid, gemm_efficiency=arrays["eff"],
                       gemm_tflops_per_gpu=arrays["gemm"], model_tflops_per_gpu=arrays["model"],
                       iteration_time_s=arrays["iter"], tokens_per_s=arrays["tokens"], num_parameters=arrays["params"],
                       broken_rules=tuple(broken), skipped=tuple(skipped), model=model.name, gpu=g.name)
