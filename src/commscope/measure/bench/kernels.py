"""This GPU's kernels measured for one training job, in the CSV formats of ``shared/data/gpu`` (extra: torch).

``commscope calibrate --model M --tp T --out GPU.toml`` on a CUDA machine times the kernels one tensor-parallel rank
of the job (model, ``tp``, micro-batch) runs, writes them into a directory (``--kernels-out``, default ``GPU-kernels/``
beside the GPU file), and fits the GPU's kernel constants to everything in it with
:func:`commscope.estimate.compute.calibration.calibrate_kernels`; ``commscope calibrate --kernels DIR --gpu BASE --out
GPU.toml`` refits the directory later. Several jobs measured into one directory are fitted together, each model's
rows left out in turn (one job alone has nothing to leave out); a job measured there before, or another device's
measurements, are refused (:func:`check_kernel_directory`). The files (``PREFIX`` names the device and the job,
e.g. ``nvidia-h200_llama3-70b_tp8_mb1``):

``PREFIX_gemms.csv``
    The linear-layer GEMMs of one layer (qkv, attn_proj, mlp_up, mlp_down; an MoE layer's router and experts) and
    the logits, forward, dgrad and wgrad, in the layouts training runs them (``torch.nn.Linear`` and its
    backward): fwd ``X W^T`` with W stored [N, K], dgrad ``dY W``, wgrad ``dY^T X`` (``torch.matmul``, the model's
    dtype). ``measured_nn_layout_s`` is left empty (not measured).
``PREFIX_fp8_gemms.csv``
    The forward linear GEMMs in FP8 (``torch._scaled_mm``: e4m3 operands, unit scales, bf16 output) beside the
    same GEMM in bf16 -- where the GPU has FP8 (sm_89 and newer, and an fp8 peak in the base GPU file).
``PREFIX_attention.csv``
    Causal ``scaled_dot_product_attention`` of the job's local heads (micro-batch x num_heads / tp, the model's
    sequence and head size), forced to the flash and to the cuDNN backend: the forward, and forward + backward,
    ``bwd_s = (fwd + bwd) - fwd``. A ``micro_batch`` column follows the shared columns (the fit reads it).
``PREFIX_copies.csv``
    ``dst.copy_(src)`` of 64 MiB, 256 MiB and 1 GiB: the streaming bandwidth of the memory-bound kernels.
``PREFIX_layers.csv``
    Whole layers as one TP rank runs them, without communication, in eager PyTorch: norm, QKV, attention (SDPA,
    forced to flash), projection, residual, norm, MLP, residual; 4 layers stacked, forward and forward + backward,
    per layer = total / 4. No rotary embedding and no dropout (as the shared measurements). Dense models only.
    ``flop_fwd_bwd_per_layer`` counts the GEMMs of one layer forward and backward plus causal attention at half.
``PREFIX_sustained_layers.csv``, ``PREFIX_sustained_nvidia_smi.csv``
    The same layers forward + backward without a pause for ``sustained_s`` (default 30 s) in 2 s windows while
    ``nvidia-smi`` samples SM clock and power every 0.5 s -- only where ``nvidia-smi`` is on the PATH: the clock the
    GPU holds at its power limit (the fit's ``clock`` note). One per directory: a later job skips it.
``SOURCES.md`` (a section per job), and ``NAME.model.toml`` for a model that is no preset (the fit reads its
layers' shapes from it).

Method (that of the shared H200 measurements, SOURCES.md there): random data, never zeros (zeros draw less power
and run faster); operand sets rotated when one set fits twice into the L2 cache, so each call reads from HBM as in
training; each kernel runs back to back for ``load_s`` (0.3 s) right before it is timed, so the GPU runs it at the
clock its power limit allows under load, not at its idle boost clock; then CUDA events around each call, at least
``min_calls`` calls over at least ``min_timed_s`` (30 ms), queued behind the load so that the GPU never waits for
the host; the median call. One job is about 35 timings of ~0.35 s each (15 GEMMs, 8 FP8 and bf16 GEMMs, 4 attention,
3 copies, 2 layer timings; an estimate from the budgets, not yet timed on a GPU): under a minute plus ``sustained_s``.

``device="cpu"`` runs the same code on the CPU with ``time.perf_counter`` (a test of this code and of the file
formats, no GPU model); ``commscope calibrate`` refuses to measure without a CUDA device.

This module runs the job's kernels; beside it, and importable from here too, :mod:`commscope.measure.bench.kernel_files`
holds the files' columns, names and directory rules, :mod:`commscope.measure.bench.kernel_timing` the budgets, the
timer and the GEMM, and :mod:`commscope.measure.bench.nvidia_smi` the clock and power sampler.
"""

from __future__ import annotations

import contextlib
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.measure.bench.kernel_files import (
    ATTENTION_COLUMNS,
    COPIES_COLUMNS,
    FP8_COLUMNS,
    GEMMS_COLUMNS,
    KERNEL_FILES,
    LAYERS_COLUMNS,
    SMI_COLUMNS,
    SUSTAINED_COLUMNS,
    _tflops,
    _write_csv,
    check_kernel_directory,
    file_prefix,
    job_prefix,
    kernel_files_in,
    model_label,
    write_gemms_csv,
)
from commscope.measure.bench.kernel_timing import (
    CPU_TEST_CONFIG,
    MeasureConfig,
    _l2_bytes,
    _rotated,
    _Timer,
    _torch_dtype,
    gemm_operands,
    time_gemm,
)
from commscope.measure.bench.nvidia_smi import SMI_QUERY, _smi_devices, _smi_query, _SmiSampler, smi_rows
from commscope.spec.model import ModelSpec
from commscope.units import MiB

__all__ = ["ATTENTION_COLUMNS", "COPIES_COLUMNS", "CPU_TEST_CONFIG", "FP8_COLUMNS", "GEMMS_COLUMNS", "KERNEL_FILES",
           "LAYERS_COLUMNS", "SMI_COLUMNS", "SMI_QUERY", "SUSTAINED_COLUMNS", "KernelRun", "MeasureConfig",
           "check_kernel_directory", "file_prefix", "gemm_operands", "job_prefix", "kernel_files_in", "layer_flop",
           "measure_kernels", "model_label", "smi_rows", "time_gemm", "write_gemms_csv"]

#: GEMMs a fused attention kernel runs inside itself (timed as attention, not as GEMMs).
_ATTENTION_GEMMS = ("attn_scores", "attn_values")
#: The GEMMs that run in FP8 under Transformer Engine (the output layer stays in bf16).
_FP8_GEMMS = ("qkv", "attn_proj", "mlp_up", "mlp_down")
#: Causal fused attention's backward over its forward FLOP [commscope.estimate.compute.attention.BACKWARD_RATIO].
_ATTENTION_BWD_RATIO = 2.5


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelRun:
    """What :func:`measure_kernels` wrote."""

    directory: Path
    device: str
    files: dict[str, Path] = field(default_factory=dict)
    """Kind (``gemms``, ``fp8_gemms``, ``attention``, ``copies``, ``layers``, ``sustained_layers``,
    ``sustained_nvidia_smi``) -> the file written."""
    rows: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    """What was not measured, and why."""
    wall_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "device": self.device,
                "files": {k: str(v) for k, v in self.files.items()}, "rows": dict(self.rows),
                "notes": list(self.notes), "wall_s": self.wall_s}


def _attention_fwd_flop(micro_batch: int, heads: int, seq: int, head_dim: int) -> int:
    """Causal attention forward at half: 4 s^2 d per head (Q K^T and P V, 2 FLOP per multiply-add), halved."""
    return 4 * micro_batch * heads * seq * seq * head_dim // 2


def layer_flop(model: ModelSpec, tp: int, micro_batch: int) -> int:
    """FLOP of one layer forward and backward as :func:`_Layer` runs it: its GEMMs (forward, dgrad, wgrad) and causal
    attention at half, the backward 2.5x the forward."""
    from commscope.estimate.compute.gemm import layer_gemms
    from commscope.spec.parallel import ParallelSpec

    par = ParallelSpec(tp=tp, micro_batch_size=micro_batch, global_batch_size=micro_batch)
    gemm = sum(2 * g.m * g.n * g.k * g.batch * g.count for g in layer_gemms(model, par) if g.name not in _ATTENTION_GEMMS)
    att = _attention_fwd_flop(micro_batch, model.num_heads // tp, model.seq_len, model.head_size)
    return int(gemm + (1 + _ATTENTION_BWD_RATIO) * att)


def _sdpa_backends(torch: Any) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def _make_layer(torch: Any, model: ModelSpec, tp: int, dtype: Any, device: Any, backend: Any) -> Any:
    """One transformer layer of ``model`` as one TP rank runs it (no communication): (b, s, h) -> (b, s, h)."""
    from torch import nn
    from torch.nn.attention import sdpa_kernel

    h, d = model.hidden_size, model.head_size
    heads, kv = model.num_heads // tp, max(1, model.kv_heads // tp)
    ffn = model.ffn // tp
    norm = nn.RMSNorm if model.normalization == "rmsnorm" else nn.LayerNorm

    class _Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            kw = {"device": device, "dtype": dtype}
            self.norm1, self.norm2 = norm(h, **kw), norm(h, **kw)
            self.qkv = nn.Linear(h, (heads + 2 * kv) * d, bias=model.bias, **kw)
            self.proj = nn.Linear(heads * d, h, bias=model.bias, **kw)
            self.up = nn.Linear(h, ffn * (2 if model.gated_mlp else 1), bias=model.bias, **kw)
            self.down = nn.Linear(ffn, h, bias=model.bias, **kw)

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split([heads * d, kv * d, kv * d], dim=-1)  # (b, s, (a + 2g) d / t)
            q = q.view(b, s, heads, d).transpose(1, 2)  # (b, heads, s, d)
            k = k.view(b, s, kv, d).transpose(1, 2)  # (b, kv, s, d)
            v = v.view(b, s, kv, d).transpose(1, 2)
            if kv != heads:
                k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
            with sdpa_kernel(backend) if backend is not None else contextlib.nullcontext():
                o = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, d)
            x = x + self.proj(o.transpose(1, 2).reshape(b, s, heads * d))
            z = self.up(self.norm2(x))
            if model.gated_mlp:
                gate, z = z.chunk(2, dim=-1)
                z = nn.functional.silu(gate) * z
            else:
                z = nn.functional.gelu(z)
            return x + self.down(z)

    return _Layer()


class _Session:
    """One measurement: the device, its timer, the job, and what has been written so far."""

    def __init__(self, torch: Any, dev: Any, cfg: MeasureConfig, *, model: ModelSpec, label: str, tp: int,
                 micro_batch: int, out: Path, prefix: str, say: Callable[[str], None]) -> None:
        self.torch, self.dev, self.cfg = torch, dev, cfg
        self.timer = _Timer(torch, dev, cfg)
        self.model, self.label, self.tp, self.b = model, label, tp, micro_batch
        self.gemm_dtype = "bf16" if model.dtype == "fp8" else model.dtype
        self.dtype = _torch_dtype(torch, self.gemm_dtype)
        self.out, self.prefix, self.say = out, prefix, say
        self.files: dict[str, Path] = {}
        self.rows: dict[str, int] = {}
        self.notes: list[str] = []

    def skipped(self, what: str, exc: BaseException) -> None:
        """``what`` could not be measured (out of memory, a backend that cannot run these shapes): noted, not fatal."""
        self.notes.append(f"{what}: not measured, {type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:160]}")
        if self.dev.type == "cuda":
            self.torch.cuda.empty_cache()

    def write(self, kind: str, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            self.files[kind] = _write_csv(self.out / f"{self.prefix}_{kind}.csv", columns, rows)
            self.rows[kind] = len(rows)


def measure_kernels(model: ModelSpec, *, tp: int = 1, micro_batch_size: int = 1, directory: str | Path,
                    device: str = "cuda", fp8: bool = True, config: MeasureConfig | None = None,
                    progress: Callable[[str], None] | None = None, command: str = "") -> KernelRun:
    """Time the kernels of ``model`` on one TP rank of ``tp`` at ``micro_batch_size`` and write them into
    ``directory`` (see the module docstring). ``fp8``: measure FP8 GEMMs where the device has them (the caller says
    whether its GPU model has an fp8 peak). Refuses a directory that already holds kernel CSVs."""
    import torch

    from commscope.estimate.compute.gemm import layer_dims

    cfg = config or MeasureConfig()
    out = Path(directory)
    if model.dtype not in ("bf16", "fp16", "fp8"):
        raise ConfigError("dtype", model.dtype, "the kernel calibration times bf16/fp16 GEMMs (and FP8 beside them): "
                                                "give a model in bf16 or fp16 (--dtype bf16)")
    layer_dims(model, tp=tp, micro_batch_size=micro_batch_size)  # tp divides the heads and widths: ConfigError
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("device", device, f"torch {torch.__version__} sees no CUDA GPU on this machine")
        dev = torch.device("cuda", torch.cuda.current_device())
        name = torch.cuda.get_device_name(dev)
    elif device == "cpu":
        dev, name = torch.device("cpu"), "cpu"
    else:
        raise ConfigError("device", device, "valid: cuda, cpu")
    label, is_preset = model_label(model)
    job = job_prefix(name, model, tp, micro_batch_size)
    check_kernel_directory(out, name, job)
    model_file = out / f"{label}.model.toml"
    if not is_preset and model_file.is_file():
        from commscope.spec.files import load_model

        if load_model(model_file) != model:
            raise ConfigError("kernels-out", str(out), f"holds another model named {label!r} ({model_file.name}); the "
                                                       "layers of both would be read as one: rename this model or give "
                                                       "another directory")
    sustained_before = sorted(out.glob("*sustained_layers.csv")) if out.is_dir() else []
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    if not is_preset:  # the fit reads the layers' shapes from it (a preset it finds by name)
        from commscope.spec.files import model_to_mapping, write_mapping

        write_mapping(model_file, model_to_mapping(model))
    run = _Session(torch, dev, cfg, model=model, label=label, tp=tp, micro_batch=micro_batch_size, out=out,
                   prefix=job, say=progress or (lambda _msg: None))
    if sustained_before:  # one sustained run gives the clock; a second of other layers would blur it
        run.cfg = replace(cfg, sustained_s=0.0)
        run.notes.append(f"sustained layers: not measured, the directory has a sustained run ({sustained_before[0].name}): "
                         "one gives the clock under load")
    threads = torch.get_num_threads()
    if dev.type == "cpu":
        torch.set_num_threads(1)  # one intra-op thread, as commscope.measure.launch.spawn gives a CPU rank
    torch.manual_seed(0)
    try:
        gemms = _measure_gemms(run)
        if not fp8:
            run.notes.append("fp8 gemms: not measured, the base GPU has no fp8 peak")
        elif (why := _fp8_problem(torch, dev)) is not None:
            run.notes.append(f"fp8 gemms: not measured, {why}")
        else:
            _measure_fp8(run, gemms)
        _measure_attention(run)
        _measure_copies(run)
        if model.is_moe:
            run.notes.append("layers: not measured for an MoE model (the eager layer here is a dense one)")
        else:
            _measure_layers(run)
    finally:
        torch.set_num_threads(threads)
    _write_sources(run, name=name, command=command)
    return KernelRun(directory=out, device=name, files=run.files, rows=run.rows, notes=tuple(run.notes),
                     wall_s=time.perf_counter() - t_start)


def _measure_gemms(run: _Session) -> list[Any]:
    """Every linear-layer GEMM of one layer and the logits, forward, dgrad and wgrad (identical shapes timed once);
    returns the GEMMs."""
    from commscope.estimate.compute.gemm import layer_gemms
    from commscope.spec.parallel import ParallelSpec

    par = ParallelSpec(tp=run.tp, micro_batch_size=run.b, global_batch_size=run.b)
    gemms = [g for g in (*layer_gemms(run.model, par), *layer_gemms(run.model, par, logits=True))
             if g.name not in _ATTENTION_GEMMS]
    cache: dict[tuple[str, int, int, int, int], float] = {}
    rows = []
    for i, g in enumerate(gemms):
        key = (g.pass_, g.m, g.n, g.k, g.batch)
        run.say(f"gemm {i + 1}/{len(gemms)}: {g.name} {g.pass_} {g.m} x {g.n} x {g.k}")
        if key not in cache:
            try:
                cache[key] = time_gemm(g.pass_, g.m, g.n, g.k, batch=g.batch, dtype=run.gemm_dtype, device=run.dev,
                                       timer=run.timer)
            except RuntimeError as exc:  # out of memory among them
                run.skipped(f"gemm {g.name} {g.pass_}", exc)
                continue
        rows.append({"model": run.label, "tp": run.tp, "micro_batch": run.b, "gemm": g.name, "pass": g.pass_,
                     "m": g.m, "n": g.n, "k": g.k, "batch": g.batch, "measured_s": cache[key]})
    if rows:
        run.files["gemms"] = write_gemms_csv(run.out / f"{run.prefix}_gemms.csv", rows)
        run.rows["gemms"] = len(rows)
    return gemms


def _measure_fp8(run: _Session, gemms: Sequence[Any]) -> None:
    """The forward linear GEMMs in FP8, each beside the same GEMM in bf16."""
    rows = []
    fwd = [g for g in gemms if g.pass_ == "fwd" and g.name in _FP8_GEMMS and g.batch == 1]
    for i, g in enumerate(fwd):
        if g.m % 16 or g.n % 16 or g.k % 16:
            run.notes.append(f"fp8 {g.name}: {g.m} x {g.n} x {g.k} is not a multiple of 16 (torch._scaled_mm needs it)")
            continue
        run.say(f"fp8 gemm {i + 1}/{len(fwd)}: {g.name} {g.m} x {g.n} x {g.k}")
        try:
            fp8_s = _time_fp8(run, g.m, g.n, g.k)
            bf16_s = time_gemm("fwd", g.m, g.n, g.k, dtype="bf16", device=run.dev, timer=run.timer)
        except RuntimeError as exc:
            run.skipped(f"fp8 {g.name}", exc)
            continue
        flop = 2 * g.m * g.n * g.k
        rows.append({"model": run.label, "tp": run.tp, "gemm": g.name, "m": g.m, "n": g.n, "k": g.k, "flop": flop,
                     "fp8_s": fp8_s, "bf16_s": bf16_s, "fp8_tflops": _tflops(flop, fp8_s),
                     "bf16_tflops": _tflops(flop, bf16_s)})
    run.write("fp8_gemms", FP8_COLUMNS, rows)


def _measure_attention(run: _Session) -> None:
    """Causal SDPA of the job's local heads, forced to each backend."""
    heads, s, d, b = run.model.num_heads // run.tp, run.model.seq_len, run.model.head_size, run.b
    rows = []
    for name, backend in _sdpa_backends(run.torch).items():
        run.say(f"attention {name}: {b} x {heads} heads x {s} x {d}")
        try:
            fwd_s, both_s = _time_attention(run, backend, b, heads, s, d)
        except RuntimeError as exc:  # a backend that cannot run these shapes here (cuDNN on a CPU), out of memory
            run.skipped(f"attention {name}", exc)
            continue
        if both_s <= fwd_s:
            run.notes.append(f"attention {name}: forward + backward ({both_s:.3g} s) timed no longer than the forward "
                             f"({fwd_s:.3g} s): not written")
            continue
        rows.append({"model": run.label, "tp": run.tp, "local_heads": heads, "seq_len": s, "head_dim": d,
                     "causal_fwd_flop": _attention_fwd_flop(b, heads, s, d), "backend": name, "fwd_s": fwd_s,
                     "bwd_s": both_s - fwd_s, "micro_batch": b})
    run.write("attention", ATTENTION_COLUMNS, rows)


def _time_copy(run: _Session, size_bytes: int) -> float:
    """``dst.copy_(src)`` of ``size_bytes`` (fp32 elements): ``2 x size_bytes`` through HBM per call."""
    src = run.torch.randn(size_bytes // 4, device=run.dev, dtype=run.torch.float32)
    dst = run.torch.empty_like(src)
    return run.timer.median_s(lambda: dst.copy_(src))


def _measure_copies(run: _Session) -> None:
    rows = []
    for size in run.cfg.copy_sizes_bytes:
        run.say(f"copy {size / MiB:g} MiB")
        try:
            rows.append({"copy_bytes": size, "measured_s": _time_copy(run, size)})
        except RuntimeError as exc:
            run.skipped(f"copy {size} B", exc)
    run.write("copies", COPIES_COLUMNS, rows)


def _fp8_problem(torch: Any, dev: Any) -> str | None:
    """Why FP8 GEMMs cannot be timed here, or None."""
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return f"torch {torch.__version__} has no float8_e4m3fn/_scaled_mm"
    if dev.type == "cuda" and torch.cuda.get_device_capability(dev) < (8, 9):
        return f"{torch.cuda.get_device_name(dev)} has no FP8 tensor cores (sm_89 or newer)"
    return None


def _time_fp8(run: _Session, m: int, n: int, k: int) -> float:
    """torch._scaled_mm of X (M x K, e4m3, row-major) and W^T (W stored [N, K]: column-major K x N), unit scales,
    bf16 output: the forward of a Linear in FP8 as Transformer Engine runs it."""
    torch, dev = run.torch, run.dev
    one = torch.ones((), device=dev, dtype=torch.float32)

    def make() -> tuple[Any, ...]:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        return x, w.t()

    operands = _rotated(make, m * k + n * k + 2 * m * n, _l2_bytes(torch, dev))

    def call() -> None:
        x, wt = operands()
        torch._scaled_mm(x, wt, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    return run.timer.median_s(call)


def _time_attention(run: _Session, backend: Any, b: int, heads: int, s: int, d: int) -> tuple[float, float]:
    """(forward s, forward + backward s) of causal SDPA forced to ``backend``: q, k, v (b, heads, s, d)."""
    from torch.nn.attention import sdpa_kernel

    torch = run.torch
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q, k, v = (torch.randn(b, heads, s, d, device=run.dev, dtype=run.dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(b, heads, s, d, device=run.dev, dtype=run.dtype)

    def fwd() -> None:
        sdpa(q, k, v, is_causal=True)

    def fwd_bwd() -> None:
        torch.autograd.grad(sdpa(q, k, v, is_causal=True), (q, k, v), dout)

    with sdpa_kernel(backend):  # raises RuntimeError at the first call where the backend cannot run these
        return run.timer.median_s(fwd), run.timer.median_s(fwd_bwd)


def _measure_layers(run: _Session) -> None:
    """Whole layers (eager, forward and forward + backward), then the same under sustained load."""
    torch, cfg, n = run.torch, run.cfg, run.cfg.stacked_layers
    backend = _sdpa_backends(torch)["flash"] if run.dev.type == "cuda" else None
    flop = layer_flop(run.model, run.tp, run.b)
    run.say(f"layers: {n} x {run.model.name} (tp {run.tp}, micro-batch {run.b}) forward and backward")
    try:
        stack = torch.nn.Sequential(*(_make_layer(torch, run.model, run.tp, run.dtype, run.dev, backend)
                                      for _ in range(n)))
        params = list(stack.parameters())
        x = torch.randn(run.b, run.model.seq_len, run.model.hidden_size, device=run.dev, dtype=run.dtype,
                        requires_grad=True)  # (b, s, h)
        dy = torch.randn_like(x)

        def fwd() -> None:
            stack(x)

        def fwd_bwd() -> None:
            torch.autograd.grad(stack(x), (x, *params), dy)

        fwd_s = run.timer.median_s(fwd)
        both_s = run.timer.median_s(fwd_bwd)
    except RuntimeError as exc:
        run.skipped("layers", exc)
        return
    if both_s <= fwd_s:
        run.notes.append(f"layers: forward + backward ({both_s:.3g} s) timed no longer than the forward: not written")
        return
    run.write("layers", LAYERS_COLUMNS, [{"model": run.label, "tp": run.tp, "micro_batch": run.b, "mode": "eager",
                                          "fwd_s_per_layer": fwd_s / n, "bwd_s_per_layer": (both_s - fwd_s) / n,
                                          "flop_fwd_bwd_per_layer": flop}])
    if cfg.sustained_s > 0:
        _sustained(run, fwd_bwd, both_s, flop)


def _sustained(run: _Session, fwd_bwd: Callable[[], None], per_iter_s: float, flop: float) -> None:
    """``fwd_bwd`` without a pause for ``sustained_s`` in windows, nvidia-smi sampling beside it where it answers."""
    cfg, n = run.cfg, run.cfg.stacked_layers
    query = _smi_query(_smi_devices(run.torch, run.dev)) if run.dev.type == "cuda" else None
    if run.dev.type == "cuda" and query is None:
        run.notes.append("sustained layers: not measured, nvidia-smi is not on the PATH or does not answer: the clock "
                         "under load is unknown (no clock correction)")
        return
    run.say(f"sustained: {cfg.sustained_s:g} s of continuous layers" + (" with nvidia-smi samples" if query else ""))
    per_window = max(1, round(cfg.window_s / per_iter_s))
    sampler = _SmiSampler(*query, cfg.smi_interval_ms / 1e3) if query is not None else None
    windows = []
    with sampler if sampler is not None else contextlib.nullcontext():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < cfg.sustained_s:
            w0 = time.perf_counter()
            for _ in range(per_window):
                fwd_bwd()
            run.timer.sync()
            per_layer_s = (time.perf_counter() - w0) / per_window / n
            windows.append({"t_s": round(time.perf_counter() - t0, 1), "iterations": per_window,
                            "fwd_bwd_s_per_layer": per_layer_s, "tflops": _tflops(flop, per_layer_s)})
    run.write("sustained_layers", SUSTAINED_COLUMNS, windows)
    if sampler is not None:
        samples = smi_rows("\n".join(sampler.lines))
        run.write("sustained_nvidia_smi", SMI_COLUMNS, samples)
        if not samples:
            run.notes.append("sustained layers: nvidia-smi gave no samples: the clock under load is unknown")


def _write_sources(run: _Session, *, name: str, command: str) -> None:
    """A section of ``SOURCES.md`` beside the CSVs for this job: what was measured, on what, how (as the shared
    measurements' own); appended, so every job measured into the directory keeps its own."""
    torch, cfg, model = run.torch, run.cfg, run.model
    cuda = getattr(torch.version, "cuda", None) if run.dev.type == "cuda" else None
    when = datetime.now(UTC).isoformat(timespec="seconds")
    path = run.out / "SOURCES.md"
    lines = [] if path.is_file() else ["# Kernels measured by `commscope calibrate` (commscope.measure.bench.kernels)", "",
                                       "Fit them: `commscope calibrate --kernels DIR --gpu BASE --out GPU.toml`.", ""]
    lines += [f"## {run.prefix}", "",
              f"Measured {when} on {name} ({platform.node() or 'this host'}), Python {platform.python_version()}, "
              f"torch {torch.__version__}" + (f", CUDA {cuda}" if cuda else "") + ".",
              (f"Job: {model.name} (rows named `{run.label}`), tp {run.tp}, micro-batch {run.b}, {model.dtype}; "
               "one TP rank's kernels, no communication."), ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    lines += ["| file | rows | what |", "| --- | --- | --- |"]
    lines += [f"| `{p.name}` | {run.rows.get(kind, 0)} | {kind} |" for kind, p in run.files.items()]
    lines += ["", ("Method: random data; operand sets rotated when one fits twice into L2; "
              f"each kernel run back to back for {cfg.load_s:g} s before it is timed; CUDA events around each call "
              f"(CPU: perf_counter), at least {cfg.min_calls} calls over at least {cfg.min_timed_s * 1e3:g} ms, the "
              f"median; layers: {cfg.stacked_layers} stacked, eager, SDPA forced to flash, no rotary embedding, "
              "grouped-query keys and values repeated to the query heads; sustained: "
              f"{cfg.sustained_s:g} s in {cfg.window_s:g} s windows, nvidia-smi every {cfg.smi_interval_ms} ms.")]
    if run.notes:
        lines += ["", "Not measured:", ""] + [f"- {n}" for n in run.notes]
    with path.open("a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n\n")
