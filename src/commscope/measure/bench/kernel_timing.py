"""How one kernel is timed on one device: the measurement's budgets, the timer, and the GEMM in training's layouts.

:class:`MeasureConfig` holds how long and how much to measure; :class:`_Timer` runs a kernel under load and then
times its calls (CUDA events on a GPU, ``time.perf_counter`` on the CPU); :func:`gemm_operands` and
:func:`time_gemm` give and time one GEMM in the layout training runs it in, operand sets rotated so that each call
reads from HBM. The method is :mod:`commscope.measure.bench.kernels`' docstring. torch is imported inside the
functions (or passed in), so that importing this module does not load it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from commscope.errors import ConfigError
from commscope.units import GiB, MiB

__all__ = ["CPU_TEST_CONFIG", "MeasureConfig", "gemm_operands", "time_gemm"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasureConfig:
    """How long and how much to measure (defaults: a CUDA GPU, under a minute plus ``sustained_s``)."""

    load_s: float = 0.3
    """Each kernel runs back to back this long right before it is timed: the GPU at its loaded clock."""
    min_timed_s: float = 0.03
    """Timed calls of one kernel span at least this long ..."""
    min_calls: int = 5
    """... and are at least this many."""
    max_calls: int = 2000
    warmup_calls: int = 2
    copy_sizes_bytes: tuple[int, ...] = (64 * MiB, 256 * MiB, GiB)
    stacked_layers: int = 4
    """Layers timed together (per layer = total / this)."""
    sustained_s: float = 30.0
    """Seconds of continuous layers for the clock under load (0: none)."""
    window_s: float = 2.0
    smi_interval_ms: int = 500

    def __post_init__(self) -> None:
        for name in ("load_s", "min_timed_s", "sustained_s"):
            if not (getattr(self, name) >= 0 and math.isfinite(getattr(self, name))):
                raise ConfigError(name, getattr(self, name), "must be a finite number of seconds >= 0")
        if not self.window_s > 0:
            raise ConfigError("window_s", self.window_s, "must be > 0 seconds")
        if self.min_calls < 1 or self.max_calls < self.min_calls or self.stacked_layers < 1 or self.warmup_calls < 0:
            raise ConfigError("min_calls", self.min_calls, "needs 1 <= min_calls <= max_calls, stacked_layers >= 1")


#: Tiny budgets for the CPU path of the tests (the same code, the same files).
CPU_TEST_CONFIG = MeasureConfig(load_s=0.005, min_timed_s=0.002, min_calls=3, max_calls=50, warmup_calls=1,
                                copy_sizes_bytes=(1 * MiB, 4 * MiB), stacked_layers=2, sustained_s=0.3, window_s=0.1)


class _Timer:
    """Times a call on one device: warm-up, a rate probe, ``load_s`` of load, then the timed calls (see the module
    docstring). CUDA: events around each call; CPU: ``time.perf_counter``."""

    def __init__(self, torch: Any, device: Any, config: MeasureConfig) -> None:
        self.torch, self.device, self.cfg = torch, device, config
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def estimate_s(self, fn: Callable[[], Any], calls: int = 3) -> float:
        """Wall seconds per call of ``fn`` after its warm-up (the host's share included: an upper bound)."""
        for _ in range(self.cfg.warmup_calls):
            fn()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        self.sync()
        return max((time.perf_counter() - t0) / calls, 1e-9)

    def times_s(self, fn: Callable[[], Any]) -> list[float]:
        """Seconds of each timed call of ``fn``."""
        cfg = self.cfg
        per_call = self.estimate_s(fn)
        for _ in range(min(math.ceil(cfg.load_s / per_call), 100 * cfg.max_calls)):
            fn()  # no synchronisation: the timed calls queue behind the load, the GPU never idles between them
        calls = max(cfg.min_calls, min(cfg.max_calls, math.ceil(cfg.min_timed_s / per_call)))
        if self.cuda:
            events = [(self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))
                      for _ in range(calls)]
            for start, end in events:
                start.record()
                fn()
                end.record()
            self.sync()
            return [start.elapsed_time(end) / 1e3 for start, end in events]
        laps = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            laps.append(time.perf_counter() - t0)
        return laps

    def median_s(self, fn: Callable[[], Any]) -> float:
        return float(statistics.median(self.times_s(fn)))


def _torch_dtype(torch: Any, dtype: str) -> Any:
    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "tf32": torch.float32}
    if dtype not in table:
        raise ConfigError("dtype", dtype, "measurable GEMM dtypes: bf16, fp16, fp32")
    return table[dtype]


def _l2_bytes(torch: Any, device: Any) -> int:
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * MiB))


def _rotated(make: Callable[[], tuple[Any, ...]], set_bytes: int, l2_bytes: int) -> Callable[[], tuple[Any, ...]]:
    """A function returning the next of enough operand sets (each from ``make``) that the ones used since a set's
    last use fill twice the L2 cache: each call reads its operands from HBM, as in training."""
    count = 1 if set_bytes >= 2 * l2_bytes else min(64, math.ceil(2 * l2_bytes / max(set_bytes, 1)) + 1)
    sets = [make() for _ in range(count)]
    state = {"i": 0}

    def next_set() -> tuple[Any, ...]:
        state["i"] = (state["i"] + 1) % count
        return sets[state["i"]]

    return next_set


def gemm_operands(pass_: str, m: int, n: int, k: int, *, batch: int = 1, dtype: str = "bf16", device: Any = "cpu"
                  ) -> tuple[Any, Any, Any]:
    """(A, B, out) of one ``batch`` x (M x K) @ (K x N) in the layout training runs ``pass_`` in (random data;
    M, N, K as :func:`commscope.estimate.compute.gemm.layer_gemms` names them, for the forward's ``Y = X W^T`` of a
    ``torch.nn.Linear`` with X (M x K) and W stored [N, K]):

    - ``fwd``: A = X (M x K), B = W^T, a transposed view of W stored [N, K];
    - ``dgrad`` (M, N, K = tokens, in, out): A = dY (M x K), B = W stored [K, N] (the forward's [out, in]);
    - ``wgrad`` (M, N, K = in, out, tokens): dW = dY^T X, stored [out, in] = (N x M): A = dY^T, a transposed view of
      dY stored [K, N], B = X stored [K, M]; ``out`` is N x M.
    """
    import torch

    dev = torch.device(device)
    tdtype = _torch_dtype(torch, dtype)
    lead = (batch,) if batch > 1 else ()

    def randn(*shape: int) -> Any:
        return torch.randn((*lead, *shape), device=dev, dtype=tdtype)

    def empty(*shape: int) -> Any:
        return torch.empty((*lead, *shape), device=dev, dtype=tdtype)

    if pass_ == "fwd":
        return randn(m, k), randn(n, k).transpose(-1, -2), empty(m, n)
    if pass_ == "dgrad":
        return randn(m, k), randn(k, n), empty(m, n)
    if pass_ == "wgrad":
        return randn(k, n).transpose(-1, -2), randn(k, m), empty(n, m)
    raise ConfigError("pass", pass_, "valid: fwd, dgrad, wgrad")


def time_gemm(pass_: str, m: int, n: int, k: int, *, batch: int = 1, dtype: str = "bf16", device: Any = "cuda",
              config: MeasureConfig | None = None, timer: Any = None) -> float:
    """Median seconds of one ``torch.matmul`` of :func:`gemm_operands` (the layout of ``pass_``), with operand sets
    rotated where one fits twice into the L2 cache (see the module docstring)."""
    import torch

    dev = torch.device(device)
    t = timer or _Timer(torch, dev, config or MeasureConfig())
    size = torch.finfo(_torch_dtype(torch, dtype)).bits // 8
    operands = _rotated(lambda: gemm_operands(pass_, m, n, k, batch=batch, dtype=dtype, device=dev),
                        batch * (m * k + k * n + m * n) * size, _l2_bytes(torch, dev))

    def call() -> None:
        a, b, c = operands()
        torch.matmul(a, b, out=c)

    return t.median_s(call)
