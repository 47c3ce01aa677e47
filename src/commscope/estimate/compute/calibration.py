"""A GPU's kernel constants fitted to measured kernels (``commscope calibrate --kernels DIR``), never to end-to-end runs.

The compute model (:mod:`commscope.estimate.compute`) times every kernel of a training step from a handful of constants
per GPU. This module fits them to kernel measurements, class by class, and says how well each class is predicted
in-sample and with each model's rows left out of the fit:

``gemm``
    ``*gemms.csv`` (bf16/fp16 GEMMs: m, n, k, measured_s): the tile/wave model of :mod:`commscope.estimate.compute.gemm`;
    fitted: ``achievable_fraction``, ``cta_fill_steps``, ``epilogue_steps``, ``kernel_overhead_us`` and
    ``tile_reuse_exponent`` on the aligned GEMMs, then ``unaligned_factor`` on GEMMs with a dimension that is not
    a multiple of 16 bytes (``partial_alignment_factor`` on 16- but not 128-byte aligned ones).
``fp8_gemm``
    ``*fp8_gemms.csv`` (m, n, k, fp8_s): ``achievable_fraction_fp8``, the other GEMM constants held.
``attention``
    ``*attention.csv`` (local_heads, seq_len, head_dim, backend, fwd_s, bwd_s): one
    :class:`~commscope.estimate.gpus.AttentionKernel` per backend (fraction, tail and overhead, forward and backward) of
    :mod:`commscope.estimate.compute.attention`.
``layer``
    ``*layers.csv`` (whole layers of a preset model, eager PyTorch): a check of the composite, nothing fitted on
    it: the sum of the kernels above plus the memory-bound kernels at ``memory_efficiency`` x the HBM bandwidth.
    ``memory_efficiency`` comes from ``*copies.csv`` (copy_bytes, measured_s: ``dst.copy_(src)`` of that many
    bytes) where the directory has one, else from the base file (the memory-bound kernels are too small a share
    of a layer to pin it: on the H200's layers a fit is flat from 0.8 to 0.98). Layers compiled with torch.compile
    are reported, not checked (their fused kernels are not the model's).
``clock``
    ``*sustained_layers.csv`` with ``*nvidia_smi.csv``: the SM clock under sustained load (the median of the
    samples at >= 90% of the highest power drawn) and the clock the kernel constants hold at, which is that
    clock times the sustained run's time over the same layer's time in the burst measurement of ``*layers.csv``
    (matched by its FLOP per layer).

Leave-one-model-out: for each model, every class is refitted without that model's rows and predicts them; a
constant no remaining row informs (a misaligned model's ``unaligned_factor`` when it is the only misaligned model)
is taken from :data:`PRIORS`, generic values with their source, so the held-out error never borrows the rows it
predicts. The fit minimises the mean squared log ratio of predicted to measured time (Nelder-Mead within bounds).

numpy and the standard library only; ``commscope.cli.calibrate_cmd`` is the command, and
``commscope calibrate`` on a CUDA machine writes these CSVs (:mod:`commscope.measure.bench.kernels`).
"""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from commscope.estimate.compute.attention import fused_attention_time_s
from commscope.estimate.compute.gemm import alignment_factor, gemm_timing, layer_gemms, legacy_kernel, time_gemms
from commscope.estimate.compute.kernels import layer_kernels
from commscope.errors import ConfigError
from commscope.estimate.gpus import AttentionKernel, GpuSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import GB, MiB, US

__all__ = ["CLASSES", "PRIORS", "ClassFit", "KernelCalibration", "KernelData", "calibrate_kernels", "gpu_toml",
           "minimize", "read_kernel_dir"]

#: Kernel classes in the order they are fitted (each uses the ones before it).
CLASSES = ("gemm", "fp8_gemm", "attention", "layer")

#: Generic values of the constants, for a constant that no measurement of a fit informs (see the module
#: docstring): from the sources the GPU presets cite, not from any kernel CSV.
PRIORS: dict[str, float] = {
    # [nvidia-matmul-guide]: tensor cores are most efficient with multiples of 16 bytes; the slowdown below is an
    # assumption the A100 preset has carried since the shape rules were written (narrower loads, masked tiles)
    "unaligned_factor": 0.5,
    "partial_alignment_factor": 0.95,
    # [nvidia-h100-whitepaper]: Hopper's wgmma doubles the MMA rate per SM clock-for-clock over the mma.sync
    # path the previous architecture's kernels use
    "legacy_gemm_fraction": 0.5,
    # [stream-hbm]: streaming kernels reach ~0.85 of the datasheet HBM bandwidth
    "memory_efficiency": 0.85,
}

_MIN_TIME_S = 1e-7
_MAX_TIME_S = 1e3


# ---------------------------------------------------------------------------------------------------------
# Reading the measurements
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Table:
    """Rows of one CSV as dicts, each with the line it came from."""

    path: Path
    rows: tuple[dict[str, str], ...]
    lines: tuple[int, ...]

    def where(self, i: int) -> str:
        return f"{self.path.name} line {self.lines[i]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelData:
    """Every measurement of one directory, checked (see :func:`read_kernel_dir`)."""

    directory: Path
    gemms: list[dict[str, Any]] = field(default_factory=list)
    fp8_gemms: list[dict[str, Any]] = field(default_factory=list)
    attention: list[dict[str, Any]] = field(default_factory=list)
    layers: list[dict[str, Any]] = field(default_factory=list)
    sustained: list[dict[str, Any]] = field(default_factory=list)
    smi: list[dict[str, Any]] = field(default_factory=list)
    copies: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.gemms or self.fp8_gemms or self.attention or self.layers or self.copies)


def _read(path: Path, required: Sequence[str]) -> _Table:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError("kernels", str(path), "is not a text CSV file") from None
    except OSError as exc:
        raise ConfigError("kernels", str(path), f"cannot be read ({exc.strerror})") from None
    reader = csv.reader(text.splitlines())
    header: list[str] | None = None
    rows, lines = [], []
    for number, cells in enumerate(reader, start=1):
        if not cells or all(not c.strip() for c in cells) or cells[0].lstrip().startswith("#"):
            continue
        if header is None:
            header = [c.strip() for c in cells]
            missing = [c for c in required if c not in header]
            if missing:
                raise ConfigError("kernels", f"{path.name} line {number}",
                                  f"header lacks {', '.join(missing)}; it has {', '.join(header)}")
            continue
        rows.append({h: (cells[i].strip() if i < len(cells) else "") for i, h in enumerate(header)})
        lines.append(number)
    return _Table(path, tuple(rows), tuple(lines))


def _number(table: _Table, i: int, key: str, *, integer: bool = False, positive: bool = True,
            warnings: list[str]) -> Any:
    """The cell as a number, or None with a warning naming file, line and field when it is not a physical one."""
    text = table.rows[i].get(key, "")
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        warnings.append(f"{table.where(i)}: {key} {text!r} is not a number; row skipped")
        return None
    if not math.isfinite(value) or (positive and value <= 0):
        warnings.append(f"{table.where(i)}: {key} {text!r} must be a finite number > 0; row skipped")
        return None
    if key.endswith("_s") and not _MIN_TIME_S <= value <= _MAX_TIME_S:
        warnings.append(f"{table.where(i)}: {key} {value:g} s is outside 0.1 us .. 1000 s; row skipped")
        return None
    return value


def _numbers(table: _Table, i: int, keys: Sequence[str], ints: Sequence[str], warnings: list[str]) -> dict[str, Any] | None:
    out: dict[str, Any] = {}
    for key in keys:
        value = _number(table, i, key, integer=key in ints, warnings=warnings)
        if value is None:
            return None
        out[key] = value
    return out


def _files(directory: Path, pattern: str, exclude: Sequence[str] = ()) -> list[Path]:
    return sorted(p for p in directory.glob(pattern) if p.is_file() and not any(x in p.name for x in exclude))


def read_kernel_dir(directory: str | Path) -> KernelData:
    """Every kernel CSV of ``directory`` (the formats of the module docstring; file names ending ``gemms.csv``,
    ``fp8_gemms.csv``, ``attention.csv``, ``layers.csv``, ``sustained_layers.csv``, ``nvidia_smi.csv``,
    ``copies.csv``). A damaged row is skipped with a warning naming file, line and field; a directory with no
    usable row is refused."""
    d = Path(directory)
    if not d.is_dir():
        raise ConfigError("kernels", str(d), "is not a directory of kernel CSVs")
    data = KernelData(directory=d)
    w = data.warnings
    for path in _files(d, "*gemms.csv", exclude=("fp8_gemms",)):
        t = _read(path, ("m", "n", "k", "measured_s"))
        for i, row in enumerate(t.rows):
            nums = _numbers(t, i, ("m", "n", "k", "measured_s"), ("m", "n", "k"), w)
            if nums is None:
                continue
            batch = _number(t, i, "batch", integer=True, warnings=w) if row.get("batch") else 1
            if batch is None:
                continue
            data.gemms.append({**nums, "batch": batch, "model": row.get("model", path.stem) or path.stem,
                               "where": t.where(i), "dtype": row.get("dtype", "") or "bf16"})
    for path in _files(d, "*fp8_gemms.csv"):
        t = _read(path, ("m", "n", "k", "fp8_s"))
        for i, row in enumerate(t.rows):
            nums = _numbers(t, i, ("m", "n", "k", "fp8_s"), ("m", "n", "k"), w)
            if nums is not None:
                data.fp8_gemms.append({**nums, "model": row.get("model", path.stem) or path.stem, "where": t.where(i)})
    for path in _files(d, "*attention.csv"):
        t = _read(path, ("local_heads", "seq_len", "head_dim", "backend", "fwd_s", "bwd_s"))
        for i, row in enumerate(t.rows):
            nums = _numbers(t, i, ("local_heads", "seq_len", "head_dim", "fwd_s", "bwd_s"),
                            ("local_heads", "seq_len", "head_dim"), w)
            if nums is None:
                continue
            if not row["backend"]:
                w.append(f"{t.where(i)}: backend is empty; row skipped")
                continue
            batch = _number(t, i, "micro_batch", integer=True, warnings=w) if row.get("micro_batch") else 1
            if batch is None:
                continue
            data.attention.append({**nums, "micro_batch": batch, "backend": row["backend"],
                                   "model": row.get("model", path.stem) or path.stem, "where": t.where(i)})
    for path in _files(d, "*layers.csv", exclude=("sustained_layers",)):
        t = _read(path, ("model", "tp", "micro_batch", "fwd_s_per_layer", "bwd_s_per_layer"))
        for i, row in enumerate(t.rows):
            nums = _numbers(t, i, ("tp", "micro_batch", "fwd_s_per_layer", "bwd_s_per_layer"), ("tp", "micro_batch"), w)
            if nums is None:
                continue
            flop = _number(t, i, "flop_fwd_bwd_per_layer", warnings=w) if row.get("flop_fwd_bwd_per_layer") else None
            data.layers.append({**nums, "model": row["model"], "mode": row.get("mode", "eager") or "eager",
                                "flop": flop, "where": t.where(i)})
    for path in _files(d, "*sustained_layers.csv"):
        t = _read(path, ("fwd_bwd_s_per_layer", "tflops"))
        for i, _ in enumerate(t.rows):
            nums = _numbers(t, i, ("fwd_bwd_s_per_layer", "tflops"), (), w)
            if nums is not None:
                data.sustained.append(nums)
    for path in _files(d, "*nvidia_smi.csv"):
        t = _read(path, ("clocks_sm", "power_draw"))
        for i, row in enumerate(t.rows):
            try:
                clock = float(row["clocks_sm"].split()[0])
                power = float(row["power_draw"].split()[0])
            except (ValueError, IndexError):
                w.append(f"{t.where(i)}: clocks_sm {row['clocks_sm']!r} / power_draw {row['power_draw']!r} are not "
                         "'<number> MHz' / '<number> W'; row skipped")
                continue
            if math.isfinite(clock) and math.isfinite(power) and clock > 0 and power > 0:
                data.smi.append({"clock_MHz": clock, "power_W": power})
    for path in _files(d, "*copies.csv"):
        t = _read(path, ("copy_bytes", "measured_s"))
        for i, _ in enumerate(t.rows):
            nums = _numbers(t, i, ("copy_bytes", "measured_s"), ("copy_bytes",), w)
            if nums is not None:
                data.copies.append(nums)
    if data.empty:
        raise ConfigError("kernels", str(d), "holds no usable kernel measurement (files ending gemms.csv, "
                          "fp8_gemms.csv, attention.csv, layers.csv or copies.csv; `commscope calibrate` on a CUDA "
                          "machine writes them)")
    return data


# ---------------------------------------------------------------------------------------------------------
# Fitting
# ---------------------------------------------------------------------------------------------------------


def minimize(f: Callable[[np.ndarray], float], x0: Sequence[float], lo: Sequence[float], hi: Sequence[float], *,
             iters: int = 600, tol: float = 1e-9) -> np.ndarray:
    """Nelder-Mead within box bounds: each variable is mapped from the real line to (lo, hi) by a logistic, so no
    trial point leaves the physical range."""
    lo_, hi_ = np.asarray(lo, float), np.asarray(hi, float)
    span = hi_ - lo_

    def to_box(z: np.ndarray) -> np.ndarray:
        return np.asarray(lo_ + span / (1.0 + np.exp(-z)), dtype=float)

    x0_ = np.clip(np.asarray(x0, float), lo_ + 1e-6 * span, hi_ - 1e-6 * span)
    z0 = -np.log(span / (x0_ - lo_) - 1.0)

    def g(z: np.ndarray) -> float:
        return f(to_box(z))

    n = len(z0)
    pts = [z0] + [z0 + np.eye(n)[i] * 0.5 for i in range(n)]
    vals = [g(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) <= tol * (abs(vals[0]) + tol):
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = g(xr)
        if fr < vals[0]:
            xe = c + 2.0 * (c - pts[-1])
            fe = g(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = g(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0] + 0.5 * (p - pts[0]) for p in pts]
                vals = [g(p) for p in pts]
    return to_box(pts[int(np.argmin(vals))])


def _msle(predicted: np.ndarray, measured: np.ndarray) -> float:
    return float(np.mean(np.log(predicted / measured) ** 2)) if len(measured) else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassFit:
    """How well one kernel class is predicted (relative errors of time, predicted / measured - 1)."""

    name: str
    n: int
    mape: float
    """Mean absolute error in-sample (the constants fitted on every row)."""
    worst: float
    loo_mape: float | None
    """Mean absolute error of each model's rows predicted by constants fitted without them (None: one model)."""
    parameters: dict[str, Any]
    held: tuple[str, ...] = ()
    """Constants that a left-out model's rows alone informed: its held-out prediction used :data:`PRIORS`."""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"n": self.n, "mape": self.mape, "worst": self.worst, "loo_mape": self.loo_mape,
                "parameters": self.parameters, "held": list(self.held), "notes": list(self.notes)}


_GEMM_PARAMS = ("achievable_fraction", "cta_fill_steps", "epilogue_steps", "kernel_overhead_s", "tile_reuse_exponent")
_GEMM_LO = (0.2, 0.0, 0.0, 0.0, 0.0)
_GEMM_HI = (1.0, 200.0, 50.0, 200e-6, 1.0)
#: Where the GEMM fit starts, whatever the base file says (the constants trade against each other: fill steps against
#: the fixed time of a call), so that the answer is the data's alone: a short-pipeline and a long-pipeline kernel.
_GEMM_STARTS = ((0.78, 4.0, 3.0, 25e-6, 0.1), (0.75, 20.0, 1.0, 5e-6, 0.3))


def _best_of(f: Callable[[np.ndarray], float], starts: Sequence[Sequence[float]], lo: Sequence[float],
             hi: Sequence[float]) -> np.ndarray:
    """:func:`minimize` from each start, then once more from the best point found (Nelder-Mead restarted)."""
    found = [minimize(f, x0, lo, hi) for x0 in starts]
    best = min(found, key=f)
    return minimize(f, [float(v) for v in best], lo, hi)


def _gemm_arrays(rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, ...]:
    return tuple(np.array([r[k] for r in rows], dtype=np.int64) for k in ("m", "n", "k", "batch"))


def _gemm_times(gpu: GpuSpec, rows: Sequence[dict[str, Any]], dtype: str = "bf16") -> np.ndarray:
    if not rows:
        return np.zeros(0)
    m, n, k, b = _gemm_arrays(rows)
    return np.asarray(gemm_timing(gpu, m, n, k, b, dtype=dtype).time_s)


def _alignment_class(gpu: GpuSpec, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """'aligned', 'partial' (16 but not 128 bytes) or 'unaligned' per GEMM row (bf16 elements)."""
    if not rows:
        return np.zeros(0, dtype=object)
    m, n, k, _ = _gemm_arrays(rows)
    factor = alignment_factor(replace(gpu, partial_alignment_factor=0.5, unaligned_factor=0.25), 2, m, n, k)
    out = np.where(factor == 1.0, "aligned", np.where(factor == 0.5, "partial", "unaligned"))
    return np.asarray(out, dtype=object)


def _fit_gemm(base: GpuSpec, rows: Sequence[dict[str, Any]], *, priors: bool = False) -> tuple[GpuSpec, tuple[str, ...]]:
    """GEMM constants of ``base`` fitted to ``rows`` (aligned first, then the alignment factors); the names of the
    factors no row informed, which keep ``base``'s values, or with ``priors`` (a left-out fold) :data:`PRIORS`."""
    cls = _alignment_class(base, rows)
    aligned = [r for r, c in zip(rows, cls) if c == "aligned"]
    meas = np.array([r["measured_s"] for r in aligned])
    def spec(x: np.ndarray) -> GpuSpec:
        values: dict[str, Any] = dict(zip(_GEMM_PARAMS, map(float, x)))
        return replace(base, **values)

    gpu = spec(_best_of(lambda x: _msle(_gemm_times(spec(x), aligned), meas), _GEMM_STARTS, _GEMM_LO,
                        _GEMM_HI)) if aligned else base
    held = []
    for kind, param in (("partial", "partial_alignment_factor"), ("unaligned", "unaligned_factor")):
        sub = [r for r, c in zip(rows, cls) if c == kind]
        if not sub:
            if priors:
                gpu = _with(gpu, param, PRIORS[param])
                held.append(param)
            continue
        ms = np.array([r["measured_s"] for r in sub])
        x = minimize(lambda v: _msle(_gemm_times(_with(gpu, param, float(v[0])), sub), ms),  # noqa: B023
                     [getattr(gpu, param)], [0.02], [1.0])
        gpu = _with(gpu, param, float(x[0]))
    if priors and base.tma_alignment_bytes and not [r for r, c in zip(rows, cls) if c == "unaligned"]:
        gpu = replace(gpu, legacy_gemm_fraction=PRIORS["legacy_gemm_fraction"])
    return gpu, tuple(held)


def _fit_fp8(gpu: GpuSpec, rows: Sequence[dict[str, Any]]) -> GpuSpec:
    if not rows or "fp8" not in gpu.peak_flops:
        return gpu
    meas = np.array([r["fp8_s"] for r in rows])
    rows_ = [{**r, "batch": 1} for r in rows]
    x = minimize(lambda v: _msle(_gemm_times(replace(gpu, achievable_fraction_fp8=float(v[0])), rows_, "fp8"), meas),
                 [gpu.achievable_fraction_fp8 or gpu.achievable_fraction], [0.1], [1.0])
    return replace(gpu, achievable_fraction_fp8=float(x[0]))


_ATT_LO = (0.05, 0.0, 0.0)
_ATT_HI = (1.0, 5.0, 2000e-6)


def _attention_times(kernel: AttentionKernel, gpu: GpuSpec, rows: Sequence[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    if not rows:
        return np.zeros(0), np.zeros(0)
    heads = np.array([r["local_heads"] * r["micro_batch"] for r in rows])
    seq = np.array([r["seq_len"] for r in rows])
    d = np.array([r["head_dim"] for r in rows])
    fwd, bwd, _ = fused_attention_time_s(kernel, gpu, batch_heads=heads, seq_q=seq, seq_k=seq, head_dim=d)
    return np.asarray(fwd, float), np.asarray(bwd, float)


def _fit_attention(gpu: GpuSpec, rows: Sequence[dict[str, Any]]) -> dict[str, AttentionKernel]:
    out: dict[str, AttentionKernel] = {}
    for backend in sorted({r["backend"] for r in rows}):
        sub = [r for r in rows if r["backend"] == backend]
        start = gpu.attention_kernels.get(backend) or AttentionKernel(fwd_fraction=0.5, bwd_fraction=0.35, fwd_tail=0.5,
                                                                       bwd_tail=0.5, fwd_overhead_s=20e-6,
                                                                       bwd_overhead_s=100e-6)
        fitted: dict[str, float] = {}
        for p in ("fwd", "bwd"):
            meas = np.array([r[f"{p}_s"] for r in sub])
            names = (f"{p}_fraction", f"{p}_tail", f"{p}_overhead_s")

            def kern(x: np.ndarray, names: tuple[str, ...] = names, start: AttentionKernel = start) -> AttentionKernel:
                values: dict[str, Any] = dict(zip(names, map(float, x)))
                return replace(start, **values)

            idx = 0 if p == "fwd" else 1
            x = minimize(lambda x: _msle(_attention_times(kern(x), gpu, sub)[idx], meas),  # noqa: B023
                         [getattr(start, n) for n in names], _ATT_LO, _ATT_HI)
            fitted.update(zip(names, map(float, x)))
        values: dict[str, Any] = {**fitted, "source": f"fitted to {len(sub)} measured calls"}
        out[backend] = replace(start, **values)
    return out


def _layer_model(name: str, directory: Path) -> ModelSpec | None:
    """The model of a layer row: the model file ``NAME.model.toml`` beside the CSVs (``commscope calibrate`` writes
    one for a model that is no preset), else the preset ``NAME``, else None."""
    from commscope.presets import model_preset
    from commscope.spec.files import load_model

    path = directory / f"{name}.model.toml"
    if Path(name).name == name and path.is_file():
        try:
            return load_model(path)
        except ConfigError:
            return None
    try:
        return model_preset(name)
    except ConfigError:
        return None


def _layer_kernel_name(gpu: GpuSpec) -> str:
    """Layers measured in eager PyTorch run scaled_dot_product_attention: FlashAttention-2 where measured."""
    return "flash" if "flash" in gpu.attention_kernels else next(iter(gpu.attention_kernels), "flash")


def _layer_times(gpu: GpuSpec, rows: Sequence[dict[str, Any]]) -> np.ndarray:
    """fwd + bwd seconds per layer of each row as the kernels model them (eager PyTorch: nothing fused)."""
    out = []
    _, kernel = gpu.attention_kernel(_layer_kernel_name(gpu))
    for r in rows:
        model = r["spec"]
        par = ParallelSpec(tp=r["tp"], micro_batch_size=r["micro_batch"], global_batch_size=r["micro_batch"])
        gemms = [g for g in layer_gemms(model, par) if g.name not in ("attn_scores", "attn_values")]
        gemm_s = sum(res.time_s for res in time_gemms(tuple((g, 1) for g in gemms), gpu, model.dtype))
        fwd, bwd, _ = fused_attention_time_s(kernel, gpu, batch_heads=r["micro_batch"] * model.num_heads // r["tp"],
                                             seq_q=model.seq_len, seq_k=model.seq_len, head_dim=model.head_size,
                                             dtype=model.dtype)
        mem = layer_kernels(model, par, gpu)
        out.append(gemm_s + float(fwd) + float(bwd) + mem.memory_fwd_s + mem.memory_bwd_s)
    return np.array(out)


def _errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.asarray(np.abs(predicted / measured - 1.0), dtype=float)


def _with(gpu: GpuSpec, name: str, value: float) -> GpuSpec:
    """``gpu`` with the float field ``name`` set."""
    values: dict[str, Any] = {name: value}
    return replace(gpu, **values)


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelCalibration:
    """The fitted GPU and how well each kernel class is predicted."""

    gpu: GpuSpec
    base: GpuSpec
    classes: dict[str, ClassFit]
    directory: Path
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: ``{"gpu": ..., "classes": {name: {"n", "mape", "worst", "loo_mape", ...}}}``."""
        return {"gpu": self.gpu.to_dict(), "base": self.base.name, "directory": str(self.directory),
                "classes": {k: v.to_dict() for k, v in self.classes.items()}, "notes": list(self.notes),
                "warnings": list(self.warnings)}

    def to_toml(self) -> str:
        first = (f"{self.gpu.name}: kernel constants fitted by `commscope calibrate --kernels {self.directory}` on the "
                 f"base preset {self.base.name!r}")
        return gpu_toml(self.gpu, header=(first,
                                          *((f"{k}: {c.n} measured, {c.mape:.1%} in-sample"
                                             + (f", {c.loo_mape:.1%} with each model left out"
                                                if c.loo_mape is not None else "")) for k, c in self.classes.items()),
                                          *self.notes))


def _clock(data: KernelData, layer_rows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, list[str]]:
    """(kernel clock, sustained clock, notes) from the sustained run and its power samples."""
    notes: list[str] = []
    if not data.smi or not data.sustained:
        return None, None, notes
    top = max(s["power_W"] for s in data.smi)
    loaded = [s["clock_MHz"] for s in data.smi if s["power_W"] >= 0.9 * top]
    sustained_clock = float(statistics.median(loaded))
    steady = data.sustained[1:] if len(data.sustained) > 2 else data.sustained  # the first window holds the warm-up
    t_sus = float(statistics.median(s["fwd_bwd_s_per_layer"] for s in steady))
    flop = float(statistics.median(s["tflops"] * 1e12 * s["fwd_bwd_s_per_layer"] for s in steady))
    burst = [r["fwd_s_per_layer"] + r["bwd_s_per_layer"] for r in layer_rows
             if r["mode"].startswith("eager") and r["flop"] and abs(r["flop"] / flop - 1) < 0.02]
    notes.append(f"clock: {len(loaded)} samples at >= 90% of {top:.0f} W: SM clock median {sustained_clock:.0f} MHz "
                 "under sustained load")
    if not burst:
        notes.append("clock: no burst measurement of the sustained run's layer (same FLOP per layer) in *layers.csv: "
                     "the kernel constants' clock is unknown, no clock correction")
        return None, sustained_clock, notes
    t_burst = float(statistics.median(burst))
    kernel_clock = sustained_clock * t_sus / t_burst
    notes.append(f"clock: the same layer ran {t_sus * 1e3:.2f} ms sustained against {t_burst * 1e3:.2f} ms in "
                 f"bursts ({len(burst)} runs): the kernel constants hold at {kernel_clock:.0f} MHz")
    return kernel_clock, sustained_clock, notes


def _class_fit(name: str, pred: np.ndarray, meas: np.ndarray, loo: list[float] | None, parameters: dict[str, Any],
               held: Sequence[str] = (), notes: Sequence[str] = ()) -> ClassFit:
    err = _errors(pred, meas)
    return ClassFit(name=name, n=len(meas), mape=float(err.mean()), worst=float(err.max()),
                    loo_mape=float(np.mean(loo)) if loo else None, parameters=parameters, held=tuple(held),
                    notes=tuple(notes))


def calibrate_kernels(directory: str | Path, base: GpuSpec, *, loo: bool = True,
                      progress: Callable[[str], None] | None = None) -> KernelCalibration:
    """Fit ``base``'s kernel constants to the measurements in ``directory`` (see the module docstring)."""
    data = read_kernel_dir(directory)
    say = progress or (lambda _msg: None)
    notes: list[str] = []
    warnings = list(data.warnings)
    gpu = base
    classes: dict[str, ClassFit] = {}
    models = sorted({r["model"] for r in data.gemms} | {r["model"] for r in data.attention}
                    | {r["model"] for r in data.layers} | {r["model"] for r in data.fp8_gemms})
    # layer rows need their model: presets only
    layer_rows = []
    for r in data.layers:
        spec = _layer_model(r["model"], data.directory)
        if spec is None:
            warnings.append(f"{r['where']}: model {r['model']!r} is not a model preset (`commscope presets`) and has "
                            f"no readable model file {r['model']}.model.toml beside it; layer skipped")
            continue
        layer_rows.append({**r, "spec": spec})
    fitted_layers = [r for r in layer_rows if r["mode"].startswith("eager")]

    def fit_all(exclude: str | None) -> tuple[GpuSpec, tuple[str, ...]]:
        g, held = (_fit_gemm(base, [r for r in data.gemms if r["model"] != exclude],
                             priors=exclude is not None) if data.gemms else (base, ()))
        g = _fit_fp8(g, [r for r in data.fp8_gemms if r["model"] != exclude])
        att = [r for r in data.attention if r["model"] != exclude]
        if att:
            g = replace(g, attention_kernels={**g.attention_kernels, **_fit_attention(g, att)})
        return g, held

    say("fitting every class on all rows")
    if data.copies:
        big = [c for c in data.copies if c["copy_bytes"] >= 64 * MiB] or data.copies
        bw = statistics.median(2 * c["copy_bytes"] / c["measured_s"] for c in big)
        eff = min(1.0, bw / base.memory_bandwidth_bytes_per_s)
        base = replace(base, memory_efficiency=eff)  # every fit below starts from the measured memory
        gpu = replace(gpu, memory_efficiency=eff)
        notes.append(f"memory: {len(big)} copies moved {bw / GB:.0f} GB/s (read + write), {eff:.1%} of the "
                     f"{base.memory_bandwidth_bytes_per_s / GB:.0f} GB/s datasheet bandwidth")
    gpu, _ = fit_all(None)
    folds: dict[str, tuple[GpuSpec, tuple[str, ...]]] = {}
    if loo and len(models) > 1:
        for i, model in enumerate(models):
            say(f"leaving out {model} ({i + 1}/{len(models)})")
            folds[model] = fit_all(model)

    def loo_errors(rows: Sequence[dict[str, Any]], predict: Callable[[GpuSpec, Sequence[dict[str, Any]]], np.ndarray],
                   measured: Callable[[dict[str, Any]], float]) -> tuple[list[float] | None, set[str]]:
        if not folds:
            return None, set()
        errs: list[float] = []
        held: set[str] = set()
        for model, (g, h) in folds.items():
            sub = [r for r in rows if r["model"] == model]
            if sub:
                errs += list(_errors(predict(g, sub), np.array([measured(r) for r in sub])))
                if h:
                    held.update(h)
        return errs, held

    if data.gemms:
        pred = _gemm_times(gpu, data.gemms)
        meas = np.array([r["measured_s"] for r in data.gemms])
        errs, held = loo_errors(data.gemms, _gemm_times, lambda r: r["measured_s"])
        cls = _alignment_class(base, data.gemms)
        mis = [r["model"] for r, c in zip(data.gemms, cls) if c != "aligned"]
        held_note = [(f"{', '.join(sorted(set(mis)))}: the only rows with misaligned dimensions; with them left out "
                      f"the alignment factors are the priors ({', '.join(f'{k} {PRIORS[k]}' for k in sorted(held))})")] \
            if held and mis else []
        classes["gemm"] = _class_fit("gemm", pred, meas, errs, {p: getattr(gpu, p) for p in (
            *_GEMM_PARAMS, "partial_alignment_factor", "unaligned_factor", "legacy_gemm_fraction")},
            held=sorted(held), notes=held_note)
        legacy = legacy_kernel(gpu, 2, *_gemm_arrays(data.gemms)[:3])
        if legacy.any():
            notes.append(f"gemm: {int(legacy.sum())} GEMMs have a dimension that is not a multiple of "
                         f"{gpu.tma_alignment_bytes} bytes and run the older kernel")
    if data.fp8_gemms and "fp8" in gpu.peak_flops:
        rows8 = [{**r, "batch": 1} for r in data.fp8_gemms]
        pred = _gemm_times(gpu, rows8, "fp8")
        meas = np.array([r["fp8_s"] for r in data.fp8_gemms])
        errs, _ = loo_errors(rows8, lambda g, sub: _gemm_times(g, sub, "fp8"), lambda r: r["fp8_s"])
        classes["fp8_gemm"] = _class_fit("fp8_gemm", pred, meas, errs,
                                         {"achievable_fraction_fp8": gpu.achievable_fraction_fp8})
    if data.attention:
        preds, meas_l, loo_l = [], [], []
        for backend, kernel in gpu.attention_kernels.items():
            sub = [r for r in data.attention if r["backend"] == backend]
            if not sub:
                continue
            f, b = _attention_times(kernel, gpu, sub)
            preds += [f, b]
            meas_l += [np.array([r["fwd_s"] for r in sub]), np.array([r["bwd_s"] for r in sub])]
            for model, (g, _) in folds.items():
                sub_m = [r for r in sub if r["model"] == model]
                if sub_m and backend in g.attention_kernels:
                    f, b = _attention_times(g.attention_kernels[backend], g, sub_m)
                    loo_l += list(_errors(f, np.array([r["fwd_s"] for r in sub_m])))
                    loo_l += list(_errors(b, np.array([r["bwd_s"] for r in sub_m])))
        classes["attention"] = _class_fit("attention", np.concatenate(preds), np.concatenate(meas_l),
                                          loo_l if folds else None,
                                          {k: v.to_dict() for k, v in gpu.attention_kernels.items()})
    if fitted_layers:
        pred = _layer_times(gpu, fitted_layers)
        meas = np.array([r["fwd_s_per_layer"] + r["bwd_s_per_layer"] for r in fitted_layers])
        errs, _ = loo_errors(fitted_layers, _layer_times, lambda r: r["fwd_s_per_layer"] + r["bwd_s_per_layer"])
        lnotes = []
        compiled = [r for r in layer_rows if not r["mode"].startswith("eager")]
        if compiled:
            c_pred = _layer_times(gpu, compiled)
            c_meas = np.array([r["fwd_s_per_layer"] + r["bwd_s_per_layer"] for r in compiled])
            lnotes.append(f"{len(compiled)} layers compiled (torch.compile) ran {float(np.mean(c_meas / c_pred)) - 1:+.1%} "
                          "against the eager kernels' model: fusions the model does not count; not fitted")
        memory_from = "copies.csv" if data.copies else f"the base file ({base.name})"
        classes["layer"] = _class_fit("layer", pred, meas, errs, {"memory_efficiency": gpu.memory_efficiency,
                                                                 "memory_efficiency_from": memory_from,
                                                                 "attention_kernel": _layer_kernel_name(gpu)},
                                      notes=lnotes)
    kernel_clock, sustained_clock, clock_notes = _clock(data, layer_rows)
    notes += clock_notes
    if sustained_clock is not None:
        gpu = replace(gpu, kernel_clock_MHz=None if kernel_clock is None else round(kernel_clock, 1),
                      sustained_clock_MHz=round(sustained_clock, 1))
    return KernelCalibration(gpu=gpu, base=base, classes=classes, directory=Path(directory), notes=tuple(notes),
                             warnings=tuple(warnings))


# ---------------------------------------------------------------------------------------------------------
# Writing a GPU file
# ---------------------------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else "0"
    return str(value)


def gpu_toml(gpu: GpuSpec, *, header: Sequence[str] = ()) -> str:
    """A GPU file (``presets/gpus/*.toml`` format, human units) that reads back as ``gpu``."""
    lines = [f"# {h}" for h in header]
    plain: list[tuple[str, Any]] = [
        ("name", gpu.name), ("aliases", list(gpu.aliases)), ("architecture", gpu.architecture), ("num_sms", gpu.num_sms),
        ("memory_GiB", round(gpu.memory_bytes / 2**30, 3)), ("memory_bandwidth_GBps", gpu.memory_bandwidth_bytes_per_s / GB),
        ("l2_cache_MiB", round(gpu.l2_cache_bytes / MiB, 3)), ("tile_sizes", [list(t) for t in gpu.tile_sizes]),
        ("tile_k", gpu.tile_k), ("ctas_per_sm", gpu.ctas_per_sm), ("split_k", list(gpu.split_k)),
        ("persistent_gemm", gpu.persistent_gemm), ("achievable_fraction", gpu.achievable_fraction),
        ("cta_fill_steps", float(gpu.cta_fill_steps)), ("epilogue_steps", gpu.epilogue_steps),
        ("tile_reuse_exponent", gpu.tile_reuse_exponent), ("kernel_overhead_us", gpu.kernel_overhead_s / US),
        ("memory_efficiency", gpu.memory_efficiency), ("flash_attention", gpu.flash_attention),
        ("flash_attention_fwd_fraction", gpu.flash_attention_fwd_fraction),
        ("flash_attention_bwd_fraction", gpu.flash_attention_bwd_fraction),
        ("alignment_required_bytes", gpu.alignment_required_bytes), ("alignment_optimal_bytes", gpu.alignment_optimal_bytes),
        ("partial_alignment_factor", gpu.partial_alignment_factor), ("unaligned_factor", gpu.unaligned_factor),
        ("tma_alignment_bytes", gpu.tma_alignment_bytes), ("legacy_gemm_fraction", gpu.legacy_gemm_fraction)]
    if gpu.achievable_fraction_fp8 is not None:
        plain.append(("achievable_fraction_fp8", gpu.achievable_fraction_fp8))
    if gpu.tile_throughput is not None:
        plain.append(("tile_throughput", list(gpu.tile_throughput)))
    for key in ("kernel_clock_MHz", "sustained_clock_MHz"):
        if getattr(gpu, key) is not None:
            plain.append((key, getattr(gpu, key)))
    lines += [f"{k} = {_toml_value(v)}" for k, v in plain if v != ""]
    lines += ["", "[peak_tflops]"] + [f"{k} = {_toml_value(v / 1e12)}" for k, v in gpu.peak_flops.items()]
    for name, kernel in gpu.attention_kernels.items():
        lines += ["", f"[attention.{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in kernel.to_dict().items() if v != ""]
    lines += ["", "[meta]", f"source = {_toml_value(gpu.source)}"]
    return "\n".join(lines) + "\n"
