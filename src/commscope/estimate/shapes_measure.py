"""GEMMs of a job timed with torch on a GPU, beside their prediction (``commscope shapes --measure``).

:func:`measure_gemms` times each GEMM shape as ``commscope calibrate`` does; :func:`measured_over_predicted` says how
far the GPU model is from this GPU on these shapes. torch is imported inside the functions (extra ``torch``), so that
importing :mod:`commscope.estimate.shapes` stays numpy only. Part of :mod:`commscope.estimate.shapes`, which
re-exports its names.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from commscope.errors import ConfigError
from commscope.estimate.compute.gemm import GemmResult
from commscope.units import TFLOP


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredGemm:
    """A GEMM timed with torch on a GPU next to its prediction."""

    result: GemmResult
    measured_s: float
    """Measured time of one layer's calls (``count`` x one call)."""

    @property
    def predicted_over_measured(self) -> float:
        return self.result.time_s / self.measured_s

    @property
    def measured_efficiency(self) -> float:
        return self.result.efficiency * self.result.time_s / self.measured_s

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), "measured_s": self.measured_s,
                "measured_tflops": self.result.gemm.flop / self.measured_s / TFLOP,
                "measured_efficiency": self.measured_efficiency, "predicted_over_measured": self.predicted_over_measured}


def cuda_available() -> tuple[bool, str]:
    """Whether torch with a CUDA GPU is importable here, and why not."""
    try:
        import torch
    except ImportError:
        return False, "PyTorch is not installed (pip install 'commscope[torch]')"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA GPU on this machine"
    return True, torch.cuda.get_device_name(0)


def measure_gemms(results: Sequence[GemmResult], dtype: str, *, warmup: int = 3, iters: int = 10,
                  device: str = "cuda", load_s: float = 0.3) -> tuple[MeasuredGemm, ...]:
    """Time each GEMM shape with ``torch.matmul`` in the layout training runs its pass in (identical shapes once),
    as ``commscope calibrate`` does (:func:`commscope.measure.bench.kernels.time_gemm`): ``load_s`` of back-to-back calls
    right before the timed ones (the GPU at its loaded clock), then at least ``iters`` calls, each between CUDA
    events, and their median, after ``warmup`` calls.

    ``device="cuda"`` (what ``commscope shapes --measure`` uses) raises :class:`ConfigError` when torch or a
    CUDA GPU is missing; ``device="cpu"`` times with ``time.perf_counter`` (a smoke test of this code, not a
    comparison with the GPU model).
    """
    if device == "cuda":
        ok, why = cuda_available()
        if not ok:
            raise ConfigError("measure", True, f"needs a CUDA GPU: {why}; run without --measure for predictions only")
    elif device != "cpu":
        raise ConfigError("device", device, "valid: cuda, cpu")
    if dtype not in ("bf16", "fp16", "fp32", "tf32"):
        raise ConfigError("dtype", dtype, "measurable dtypes: bf16, fp16, fp32")
    from commscope.measure.bench.kernels import MeasureConfig, time_gemm

    config = MeasureConfig(load_s=load_s, min_calls=iters, max_calls=max(iters, 2000), warmup_calls=warmup)
    cache: dict[tuple[str, int, int, int, int], float] = {}
    out = []
    for r in results:
        g = r.gemm
        key = (g.pass_, g.batch, g.m, g.n, g.k)
        if key not in cache:
            cache[key] = time_gemm(g.pass_, g.m, g.n, g.k, batch=g.batch, dtype=dtype, device=device, config=config)
        out.append(MeasuredGemm(result=r, measured_s=cache[key] * g.count))
    return tuple(out)


def measured_over_predicted(measured: Sequence[MeasuredGemm], *, min_flop: float = 1e9) -> float | None:
    """Median measured / predicted time of the compute-bound GEMMs of ``measured`` above ``min_flop`` (None: none):
    how far the GPU model is from this GPU on these shapes. ``commscope calibrate --kernels`` fits the model's
    constants to such measurements (``shapes --measure --kernels-out DIR`` writes them)."""
    ratios = [1.0 / m.predicted_over_measured for m in measured
              if not m.result.memory_bound and m.result.gemm.flop >= min_flop]
    return float(statistics.median(ratios)) if ratios else None
