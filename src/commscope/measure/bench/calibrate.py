"""This machine as a cluster file: a matrix-multiply probe, a memory probe and a short collective sweep.

``commscope calibrate --nproc N --out local.toml`` forks N ranks (as a training job here would), and on every
rank at once (so each sees the share of the machine a rank of such a job gets):

1. times a square fp32 matrix multiply (``torch.mm``, n = 512 by default; CUDA when the ranks have GPUs,
   else the CPU with one intra-op thread per rank, as :func:`commscope.measure.launch.spawn` sets): 2 n^3 FLOP per
   call, the median over calls of one rank, the median over ranks;
2. times a copy of a 32 MiB tensor (``dst.copy_(src)``: 2 x 32 MiB moved per call): the streaming memory
   bandwidth, the roofline of the memory-bound kernels of :mod:`commscope.estimate.compute`;
3. runs a short :func:`commscope.measure.bench.sweep.run_sweep` (all_reduce, all_gather, reduce_scatter, broadcast
   and send/recv, 1 KiB to 4 MiB by 4x, on groups of 2, 4, ... dividing N and of N), fitted by
   :func:`commscope.measure.bench.fit.fit` into the bandwidth model ``estimate --bandwidth`` reads.

The file is a cluster file (``--cluster``). On CPU ranks its GPU is the ``cpu`` device and the probes are its
compute model: ``peak_tflops`` and ``memory_bandwidth_GBps`` are the measured matmul rate and copy bandwidth (the
``cpu`` preset has both fractions 1: one CPU rank is a "GPU" whose measured rate is its peak). On GPUs the probes
are no GPU model -- an fp32 512^3 matmul says nothing of the bf16 GEMMs, attention and layers a training step
runs, and a 32 MiB copy half fits in the L2 cache -- so the file names the GPU (a preset or GPU file, ``gpu``) with
its datasheet peaks and memory bandwidth, and the probes are kept as measurements only; the GPU's kernels are
calibrated by ``commscope calibrate --model M --tp T --out GPU.toml`` (:mod:`commscope.measure.bench.kernels`), whose GPU
file ``--gpu`` reads. Its ``[collectives]`` table is the fitted model (``--bandwidth``), and its link tiers are the
fitted all_reduce over the most ranks. Every measurement is kept in ``[meta]`` (``source`` and ``measurements``).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from commscope.measure.bench.fit import FitResult
from commscope.measure.bench.sweep import SweepConfig, SweepResult
from commscope.estimate.gpus import GpuSpec
from commscope.spec.cluster import LINK_LATENCY_RANGE_S
from commscope.units import GB, TFLOP, US, GiB, MiB

__all__ = ["CALIBRATION_OPS", "Calibration", "ComputeProbe", "calibrate", "cluster_toml", "default_sweep", "probe_compute"]

#: Collectives the calibration sweep measures (what the reference trainings use; all_to_all only for MoE).
CALIBRATION_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv")


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeProbe:
    """What one rank measured of its device."""

    device: str
    """``cpu`` or the CUDA device name."""
    matmul_n: int
    matmul_flops_per_s: float
    """2 n^3 / the median time of one n x n x n fp32 ``torch.mm``."""
    copy_bytes: int
    memory_bandwidth_bytes_per_s: float
    """2 x ``copy_bytes`` / the median time of one ``dst.copy_(src)``."""
    op_overhead_s: float
    """Median time of an 8 x 8 matmul: the fixed cost of one kernel (dispatch and launch)."""


def _median_time_s(fn, sync, budget_s: float, min_calls: int = 5) -> float:
    """Median wall time of ``fn()`` over as many calls as fit in ``budget_s`` (at least ``min_calls``)."""
    fn()
    sync()  # warm-up: allocation, kernel selection
    laps: list[float] = []
    end = time.perf_counter() + budget_s
    while len(laps) < min_calls or time.perf_counter() < end:
        t0 = time.perf_counter()
        fn()
        sync()
        laps.append(time.perf_counter() - t0)
    return statistics.median(laps)


def probe_compute(device: Any = None, *, matmul_n: int = 512, copy_bytes: int = 32 * MiB,
                  budget_s: float = 0.4) -> ComputeProbe:
    """Measure this process's matmul rate, copy bandwidth and per-op overhead on ``device`` (default CPU)."""
    import torch

    device = torch.device("cpu") if device is None else torch.device(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    a = torch.randn(matmul_n, matmul_n, device=device)
    b = torch.randn(matmul_n, matmul_n, device=device)
    out = torch.empty(matmul_n, matmul_n, device=device)
    t_mm = _median_time_s(lambda: torch.mm(a, b, out=out), sync, budget_s / 2)
    src = torch.ones(copy_bytes // 4, device=device)
    dst = torch.empty_like(src)
    t_copy = _median_time_s(lambda: dst.copy_(src), sync, budget_s / 4)
    x, y = torch.randn(8, 8, device=device), torch.randn(8, 8, device=device)
    t_small = _median_time_s(lambda: torch.mm(x, y), sync, budget_s / 4, min_calls=50)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return ComputeProbe(device=name, matmul_n=matmul_n, matmul_flops_per_s=2 * matmul_n**3 / t_mm,
                        copy_bytes=copy_bytes, memory_bandwidth_bytes_per_s=2 * copy_bytes / t_copy,
                        op_overhead_s=t_small)


def default_sweep(nproc: int) -> SweepConfig:
    """The short sweep: :data:`CALIBRATION_OPS`, 1 KiB to 4 MiB by 4x, groups of 2, 4, ... that divide ``nproc``
    and of ``nproc`` itself (groups tile the ranks: 3 ranks make one group of 3, 6 groups of 2 and of 6), 0.03 s per
    size (at least 10 iterations), 2 warm-up iterations."""
    groups = tuple(sorted({g for g in (2**i for i in range(1, 12)) if g <= nproc and nproc % g == 0} | {nproc}))
    return SweepConfig(ops=CALIBRATION_OPS, min_bytes=1024, max_bytes=4 * MiB, step_factor=4.0, time_budget_s=0.03,
                       warmup_iters=2, group_sizes=groups)


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Every rank's compute probe, the sweep, and what they were measured on."""

    probes: tuple[ComputeProbe, ...]
    sweep: SweepResult
    backend: str
    nproc: int
    wall_s: float

    @property
    def matmul_flops_per_s(self) -> float:
        """Median over ranks."""
        return statistics.median(p.matmul_flops_per_s for p in self.probes)

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return statistics.median(p.memory_bandwidth_bytes_per_s for p in self.probes)

    @property
    def op_overhead_s(self) -> float:
        return statistics.median(p.op_overhead_s for p in self.probes)


def _calibrate_rank(rank: int, world: int, cfg: SweepConfig, budget_s: float,
                    progress: Callable[[int, int], None] | None = None) -> tuple[ComputeProbe, SweepResult | None]:
    import torch
    import torch.distributed as dist

    from commscope.measure.bench.sweep import run_sweep

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    dist.barrier()  # every rank probes at once: each gets the share of the machine a rank of a job gets
    probe = probe_compute(device, budget_s=budget_s)
    dist.barrier()
    result = run_sweep(cfg, progress=progress)  # run_sweep reports from rank 0 only
    return probe, (result if rank == 0 else None)


def calibrate(nproc: int, *, backend: str = "gloo", sweep: SweepConfig | None = None, probe_budget_s: float = 0.4,
              timeout_s: float = 600.0, progress: Callable[[int, int], None] | None = None) -> Calibration:
    """Probe compute on ``nproc`` forked ranks at once, then sweep their collectives (see the module docstring);
    ``progress(done, total)`` is called by rank 0 after each (op, group size, size) of the sweep."""
    from commscope.measure.launch import spawn

    cfg = sweep or default_sweep(nproc)
    t0 = time.perf_counter()
    outs = spawn(_calibrate_rank, nproc, args=(cfg, probe_budget_s, progress), backend=backend, timeout_s=timeout_s)
    result = outs[0][1]
    assert result is not None  # rank 0 returns the sweep
    return Calibration(probes=tuple(o[0] for o in outs), sweep=result, backend=backend, nproc=nproc,
                       wall_s=time.perf_counter() - t0)


def _round(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def cluster_toml(cal: Calibration, fitted: FitResult, *, name: str = "local", command: str | None = None,
                 gpu: GpuSpec | None = None) -> str:
    """The cluster file of a calibration: cluster keys, ``[meta]`` with every measurement, and the fitted
    collectives as ``[collectives.model]``/``[[collectives.curves]]`` (the format of ``commscope fit``). ``gpu``:
    the GPU of ranks on GPUs (default: the preset matching the device's name), named with its datasheet."""
    from commscope.measure.bench.fit import to_toml
    from commscope.estimate.gpus import gpu_preset
    from commscope.spec.files import dumps_toml

    device = cal.probes[0].device
    on_cpu = device == "cpu"
    if gpu is None or on_cpu:
        gpu = gpu_preset("cpu" if on_cpu else device)
    rate, mem = cal.matmul_flops_per_s, cal.memory_bandwidth_bytes_per_s
    # the link tiers: all_reduce over the most ranks; bus bandwidth = the median measured busbw of its two
    # largest sizes (a fitted segment can be flat, busbw inf, on a noisy machine), latency = the fitted
    # small-message alpha over the ring's 2(n-1) steps
    n = max(r.group_size for r in cal.sweep.rows if r.op == "all_reduce")
    rows = sorted((r for r in cal.sweep.rows if r.op == "all_reduce" and r.group_size == n), key=lambda r: r.size_bytes)
    busbw = statistics.median(r.busbw_bytes_per_s for r in rows[-2:])
    curve = next(c for c in fitted.curves if c.op == "all_reduce" and c.group_size == n)
    steps = 2 * (n - 1)
    where = f"{cal.nproc} {cal.backend} ranks on {platform.node() or 'this host'}"
    latency_s = curve.segments[0].alpha_s / steps
    how = f"the fitted small-message alpha {_round(curve.segments[0].alpha_s / US)} us over its {steps} ring steps"
    if latency_s < LINK_LATENCY_RANGE_S[0]:
        # a noisy sweep can fit the small sizes with no alpha at all: no link has none, so take the smallest
        # message's whole time instead (it is all latency), still over the ring's steps
        smallest = rows[0]
        latency_s = max(smallest.time_s / steps, LINK_LATENCY_RANGE_S[0])
        how = (f"the {smallest.size_bytes:,} B all_reduce's {_round(smallest.time_s / US)} us over its {steps} ring steps "
               f"(the fit gave {_round(curve.segments[0].alpha_s / US)} us of alpha, under any real link's)")
    tier_source = (f"commscope calibrate: all_reduce over {n} ranks in the sweep ([collectives]): busbw "
                   f"{_round(busbw / GB)} GB/s (median of the {', '.join(f'{r.size_bytes:,}' for r in rows[-2:])} B rows), "
                   f"latency = {how}")
    tier = {"name": f"{cal.backend} between local ranks", "bandwidth_GBps": _round(busbw / GB),
            "latency_us": _round(latency_s / US), "source": tier_source}
    probes = [asdict(p) for p in cal.probes]
    measurements = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"), "command": command or "",
        "where": where, "wall_s": _round(cal.wall_s, 3),
        "matmul_n": cal.probes[0].matmul_n,
        "matmul_GFLOPs_per_rank": [_round(p["matmul_flops_per_s"] / 1e9) for p in probes],
        "copy_MiB": cal.probes[0].copy_bytes // MiB,
        "copy_GBps_per_rank": [_round(p["memory_bandwidth_bytes_per_s"] / GB) for p in probes],
        "op_overhead_us_per_rank": [_round(p["op_overhead_s"] / US) for p in probes],
        "sweep_rows": len(cal.sweep.rows), "sweep_noisy_rows": sum(r.noisy for r in cal.sweep.rows),
    }
    probed = (f"fp32 {cal.probes[0].matmul_n}^3 matmul {_round(rate / 1e9)} GFLOP/s per rank (median over ranks, all "
              f"probing at once), {cal.probes[0].copy_bytes // MiB} MiB copy {_round(mem / GB)} GB/s per rank, 8x8 "
              f"matmul {_round(cal.op_overhead_s / US)} us")
    collectives = (f"collectives: {len(cal.sweep.rows)} sweep rows fitted in [collectives] (each row's error in "
                   "[collectives.fit])")
    if on_cpu:  # the probes are the compute model of a CPU rank
        compute: dict[str, Any] = {
            "gpu": gpu.name, "memory_bandwidth_GBps": _round(mem / gpu.memory_efficiency / GB), "gpu_util": 1.0,
            "peak_tflops": {"fp32": _round(rate / gpu.achievable_fraction_for("fp32") / TFLOP)}}
        source = (f"measured by commscope calibrate on {where}: {probed}; peak_tflops = that rate / the {gpu.name} "
                  f"preset's achievable_fraction {gpu.achievable_fraction:g}, memory bandwidth = the copy rate / its "
                  f"memory_efficiency {gpu.memory_efficiency:g}; {collectives}")
    else:  # the probes are no GPU model: the GPU's datasheet, its kernels calibrated apart
        compute = {"gpu": gpu.name, "memory_bandwidth_GBps": _round(gpu.memory_bandwidth_bytes_per_s / GB),
                   "peak_tflops": {k: _round(v / TFLOP) for k, v in gpu.peak_flops.items()}}
        if gpu.memory_bytes:
            compute["memory_GiB"] = _round(gpu.memory_bytes / GiB)
        source = (f"measured by commscope calibrate on {where}; GPU: {gpu.name}, peaks and memory bandwidth from its "
                  f"datasheet ({gpu.source or 'its GPU file'}); the probes ({probed}, on {device}) are measurements, "
                  "no GPU model: the GPU's kernels are calibrated by `commscope calibrate --model M --tp T --out "
                  f"GPU.toml`, used with --gpu GPU.toml; {collectives}")
    cluster = {
        "name": name,
        **compute,
        # every rank a job starts here runs on this host: one "node" holds them all
        "gpus_per_node": max(8, cal.nproc),
        "nics_per_node": 1,
        "intra_node": tier,
        "inter_node": {**tier, "source": "no second host was measured: the same as intra_node"},
        "meta": {
            "description": f"this machine, measured by `commscope calibrate` ({where})",
            "source": source,
            "measurements": measurements,
        },
    }
    head = ("# This machine as a commscope cluster file, written by `commscope calibrate`.\n"
            "# Use: --cluster THIS_FILE (compute: the measured matmul rate and memory bandwidth) and\n"
            "#      --bandwidth THIS_FILE (the fitted collectives below).\n")
    return head + dumps_toml(cluster) + "\n" + to_toml(fitted, command=command, table_prefix="collectives.")
