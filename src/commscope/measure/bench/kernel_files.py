"""The files of a kernel measurement: their columns and names, the directory rules, and the CSV writer.

Every file :mod:`commscope.measure.bench.kernels` writes has the columns of ``shared/data/gpu``, so that
:func:`commscope.estimate.compute.calibration.read_kernel_dir` reads the shared measurements and a new GPU's alike.
A job's files start with :func:`job_prefix` (device, model, tp, micro-batch); :func:`check_kernel_directory`
refuses a directory that would mix what the fit keeps apart (a job measured twice, another device). Nothing here
imports torch: ``commscope shapes`` writes GEMM files through :func:`write_gemms_csv` too.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.spec.model import ModelSpec

__all__ = ["ATTENTION_COLUMNS", "COPIES_COLUMNS", "FP8_COLUMNS", "GEMMS_COLUMNS", "KERNEL_FILES", "LAYERS_COLUMNS",
           "SMI_COLUMNS", "SUSTAINED_COLUMNS", "check_kernel_directory", "file_prefix", "job_prefix",
           "kernel_files_in", "model_label", "write_gemms_csv"]

#: Columns of each file, exactly as in ``shared/data/gpu`` (the fit needs the ones it names, reads the rest as notes).
GEMMS_COLUMNS = ("model", "tp", "micro_batch", "gemm", "pass", "m", "n", "k", "batch", "flop", "measured_s",
                 "measured_tflops", "measured_nn_layout_s")
FP8_COLUMNS = ("model", "tp", "gemm", "m", "n", "k", "flop", "fp8_s", "bf16_s", "fp8_tflops", "bf16_tflops")
ATTENTION_COLUMNS = ("model", "tp", "local_heads", "seq_len", "head_dim", "causal_fwd_flop", "backend", "fwd_s", "bwd_s",
                     "micro_batch")
COPIES_COLUMNS = ("copy_bytes", "measured_s")
LAYERS_COLUMNS = ("model", "tp", "micro_batch", "mode", "fwd_s_per_layer", "bwd_s_per_layer", "flop_fwd_bwd_per_layer")
SUSTAINED_COLUMNS = ("t_s", "iterations", "fwd_bwd_s_per_layer", "tflops")
SMI_COLUMNS = ("timestamp", "clocks_sm", "power_draw", "temperature_c", "throttle_reasons")

#: The file name endings :func:`commscope.estimate.compute.calibration.read_kernel_dir` reads.
KERNEL_FILES = ("gemms.csv", "attention.csv", "layers.csv", "nvidia_smi.csv", "copies.csv")


def kernel_files_in(directory: Path) -> list[Path]:
    """The kernel CSVs in ``directory`` (the file name endings the fit reads)."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(KERNEL_FILES))


def file_prefix(device: str) -> str:
    """``NVIDIA H200`` -> ``nvidia-h200``: the device in the file names."""
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "gpu"


def model_label(model: ModelSpec) -> tuple[str, bool]:
    """(the preset's name, True) when ``model`` is that preset unchanged, else (a file-name-safe label, False): the
    ``model`` column of the rows and the model part of the file names."""
    from commscope.presets import model_preset

    try:
        if model_preset(model.name) == model:
            return model.name, True
    except ConfigError:
        pass
    return re.sub(r"[^A-Za-z0-9._-]+", "-", model.name).strip("-.") or "model", False


def job_prefix(device: str, model: ModelSpec, tp: int, micro_batch: int) -> str:
    """The start of one job's file names: ``nvidia-h200_llama3-70b_tp8_mb1`` (device, model, tp, micro-batch)."""
    return f"{file_prefix(device)}_{model_label(model)[0]}_tp{tp}_mb{micro_batch}"


def check_kernel_directory(directory: Path, device: str, job: str, field: str = "kernels-out") -> None:
    """Refuse to add the job ``job`` (:func:`job_prefix`) to ``directory`` when it would mix what the fit keeps apart:
    this job measured there before (its kernels counted twice), or another device's measurements (two GPUs fitted
    as one). Other jobs of the same device are welcome: the fit of the directory learns from all of them, and
    leaves each model out in turn."""
    files = kernel_files_in(directory)
    again = [f for f in files if f.name.startswith(f"{job}_")]
    if again:
        raise ConfigError(field, str(directory), f"already holds this job's measurements ({again[0].name}); a second "
                                                 "run would count its kernels twice: give another directory")
    other = [f for f in files if not f.name.startswith(f"{file_prefix(device)}_")]
    if other:
        raise ConfigError(field, str(directory), f"holds measurements of another device ({other[0].name}); this is "
                                                 f"{device}, and one fit of both would mix two GPUs: give a directory "
                                                 "of its own")


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.9g}"
    return "" if value is None else str(value)


def _write_csv(path: Path, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> Path:
    from commscope.io.atomic import atomic_open

    with atomic_open(path, "w", newline="") as f:  # beside the target, renamed into place when complete
        w = csv.writer(f, lineterminator="\n")
        w.writerow(columns)
        for row in rows:
            w.writerow([_cell(row.get(c)) for c in columns])
    return path


def _tflops(flop: float, seconds: float) -> float:
    """TFLOP/s to 4 significant digits (``686.2``; a CPU's ``0.01234``, never a 0 the fit would refuse)."""
    return float(f"{flop / seconds / 1e12:.4g}")


def write_gemms_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    """``rows`` (model, tp, micro_batch, gemm, pass, m, n, k, batch, measured_s) as a ``*gemms.csv`` file, flop and
    TFLOP/s filled in."""
    full = []
    for r in rows:
        flop = 2 * r["m"] * r["n"] * r["k"] * r.get("batch", 1)
        full.append({"batch": 1, **r, "flop": flop, "measured_tflops": _tflops(flop, r["measured_s"])})
    return _write_csv(path, GEMMS_COLUMNS, full)
