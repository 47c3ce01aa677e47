"""``commscope calibrate``: this machine measured into the files the other commands read.

Three ways, chosen by the options given:

    commscope calibrate --kernels DIR --gpu h200 --out my-h200.toml [--json]
        Fit a GPU's kernel constants to kernel measurements in DIR (the CSV formats of ``shared/data/gpu``, which
        the way below and ``shapes --measure --kernels-out DIR`` write) with
        :func:`commscope.estimate.compute.calibration.calibrate_kernels`: numpy only, no torch, no GPU needed. Prints, per
        kernel class (gemm, fp8_gemm, attention, layer), the rows, the error in-sample, the worst row, and the error
        of each model's rows predicted by constants fitted without them, then what was fitted and the notes (the
        clock under load, constants held at their priors); skipped rows are warnings on stderr. ``--gpu`` is the
        GPU the measurements ran on (a preset or a GPU file): its datasheet and prior constants start the fit.
        Writes a GPU file (the ``presets/gpus`` format) that ``--gpu FILE`` reads back (``estimate``, ``shapes``);
        ``--json`` prints ``{"gpu": ..., "classes": {"gemm": {"n", "mape", "worst", "loo_mape", ...}, ...},
        "out": ...}``. About 20 s for the 180 GEMMs, 28 FP8 GEMMs, 12 attention calls and 12 layers of the H200 data.

    commscope calibrate --model llama3-70b --tp 8 --out my-h200.toml [--gpu h200] [--kernels-out DIR]
        On a CUDA machine (extra: torch): time this job's own kernels -- its GEMMs forward, dgrad and wgrad, FP8
        GEMMs, causal attention (flash and cuDNN), copies, whole eager layers and a sustained run with nvidia-smi
        samples -- with the GPU held at its loaded clock (:mod:`commscope.measure.bench.kernels`; about a minute plus
        ``--sustained-s``, default 30 s), write them to DIR (default ``my-h200-kernels/`` beside the GPU file), and
        fit every job measured in DIR as above: measure several jobs into one ``--kernels-out`` and each model's
        rows are left out in turn (a job measured there before, or another device's files, are refused). ``--gpu``
        defaults to the preset matching the CUDA device's name. Without a CUDA device it says so in one line
        (exit 2).

    commscope calibrate --nproc 2 --out local.toml
        This machine's collectives as a cluster file: fork N ranks, time an fp32 matrix multiply and a memory copy
        on each, run a short ``bench`` sweep and fit it as ``fit`` does (:mod:`commscope.measure.bench.calibrate`). On CPU
        ranks the probes are the compute model of the ``cpu`` device; on GPUs the cluster names the GPU (``--gpu``
        or the preset matching the device) with its datasheet, and the fp32 512^3 probe stays a measurement in
        ``[meta]``, no GPU model.

    commscope estimate --model llama3-70b ... --cluster dgx-h200 --gpu my-h200.toml
    commscope compare logs/ --bandwidth local.toml --time
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from commscope.cli.common import out_path, warn
from commscope.errors import ConfigError

#: Smallest -e calibrate accepts: the link bandwidth it writes is the busbw of the sweep's two largest all_reduce
#: sizes, and below 1 MiB those time the latency, not the bandwidth (gloo on CPUs: ~50 us of alpha, 4 KiB gave
#: 0.009 GB/s, under any real link). nccl-tests' PERFORMANCE.md reads busbw at large messages for the same reason.
MIN_MAXBYTES = 1 << 20
#: calibrate's own options for the cluster file, named where a value of one of them is refused (calibrate has no -b,
#: -f, -n: the sweep's other sizes and iterations are fixed, see :func:`commscope.measure.bench.calibrate.default_sweep`).
OPTIONS = "--nproc, --out, --name, --backend, -e/--maxbytes, --time-budget, --timeout, --json"
#: Options of the cluster calibration (collectives): dest -> flag.
CLUSTER_OPTIONS = {"nproc": "--nproc", "name": "--name", "backend": "--backend", "maxbytes": "-e/--maxbytes",
                   "time_budget": "--time-budget", "timeout": "--timeout"}
#: Options that describe the job whose kernels --model measures: dest -> flag.
MEASURE_OPTIONS = {"tp": "--tp", "micro_batch_size": "--micro-batch-size", "model.seq_len": "--seq-length",
                   "model.dtype": "--dtype", "kernels_out": "--kernels-out", "sustained_s": "--sustained-s"}
#: Defaults of the options above (None in the parser, so that a given one can be told from a default).
DEFAULTS: dict[str, Any] = {"nproc": 2, "backend": None, "maxbytes": "4M", "time_budget": 0.03, "timeout": 600.0,
                            "tp": 1, "micro_batch_size": 1, "sustained_s": 30.0}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure this machine: a GPU's kernels into a GPU file, its collectives into a "
                                         "cluster file",
                       description="--kernels DIR fits a GPU's kernel constants to measured kernel CSVs (no GPU needed); "
                                   "--model measures this job's kernels on the CUDA GPU here and fits them; both write a "
                                   "GPU file for --gpu. Otherwise: fork N ranks, time an fp32 matrix multiply, a memory "
                                   "copy and a short `bench` sweep, fit it as `fit` does, and write a cluster file "
                                   "(--cluster) whose [collectives] table is the fitted bandwidth model (--bandwidth).")
    k = p.add_argument_group("a GPU's kernels (writes a GPU file, for --gpu)")
    k.add_argument("--kernels", type=Path, default=None, metavar="DIR",
                   help="fit the kernel constants to the kernel CSVs in DIR (*gemms.csv, *fp8_gemms.csv, *attention.csv, "
                        "*layers.csv, *copies.csv, *nvidia_smi.csv as `calibrate --model` writes them); needs --gpu")
    k.add_argument("--model", default=None,
                   help="measure this job's kernels on this machine's CUDA GPU, then fit them: a preset name, a model "
                        "file or a Hugging Face config.json")
    k.add_argument("--tp", "--tensor-model-parallel-size", dest="tp", type=int, default=None,
                   help="with --model: tensor-parallel size; the kernels of one TP rank are timed (default 1)")
    k.add_argument("--micro-batch-size", dest="micro_batch_size", type=int, default=None,
                   help="with --model: sequences per micro-batch (default 1)")
    k.add_argument("--seq-length", "--seq-len", dest="model.seq_len", type=int, default=None,
                   help="with --model: sequence length (default: the model's)")
    k.add_argument("--dtype", dest="model.dtype", default=None, help="with --model: bf16 or fp16 (default: the model's)")
    k.add_argument("--gpu", default=None, metavar="BASE",
                   help="the GPU measured: a preset (h100, h200, a100, ...) or a GPU file, whose datasheet and prior "
                        "constants the fit starts from (with --model: default the preset matching the CUDA device)")
    k.add_argument("--kernels-out", type=out_path, default=None, metavar="DIR",
                   help="with --model: the directory the measured CSVs go to, and whose jobs are all fitted: measure "
                        "several jobs into one (default: OUT's name with -kernels, beside it)")
    k.add_argument("--sustained-s", dest="sustained_s", type=float, default=None, metavar="S",
                   help="with --model: seconds of continuous layers for the clock under load, with nvidia-smi samples "
                        "(default 30; 0: none)")
    k.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)  # cpu: tests only
    c = p.add_argument_group("this machine's collectives (writes a cluster file, for --cluster and --bandwidth)")
    c.add_argument("--nproc", type=int, default=None, help="ranks to start, as many as the jobs you will compare "
                                                           "(default 2)")
    c.add_argument("--name", default=None, help="cluster name in the file (default: the file's stem)")
    c.add_argument("--backend", default=None, choices=("gloo", "nccl"),
                   help="collective backend (default: nccl when there is a GPU per rank, else gloo)")
    c.add_argument("-e", "--maxbytes", default=None, metavar="SIZE", help="largest message of the sweep (default 4M)")
    c.add_argument("--time-budget", type=float, default=None, metavar="S",
                   help="timed seconds per message size of the sweep (default 0.03)")
    c.add_argument("--timeout", type=float, default=None, metavar="S", help="wall-clock limit (default 600)")
    p.add_argument("--out", type=out_path, required=True,
                   help="the file to write (.toml): a GPU file with --kernels or --model, else a cluster file")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--force", action="store_true", help="replace the file of an earlier run at --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    given = {dest: vars(args)[dest] for dest in (*CLUSTER_OPTIONS, *MEASURE_OPTIONS) if vars(args)[dest] is not None}
    if args.kernels is not None and args.model is not None:
        raise ConfigError("kernels", str(args.kernels), "fits kernels measured before and --model measures new ones: "
                                                        "give one of them")
    kernel_mode = args.kernels is not None or args.model is not None
    for dest, flag in CLUSTER_OPTIONS.items():
        if kernel_mode and dest in given:
            raise ConfigError(dest.replace("_", "-"), given[dest],
                              f"{flag} belongs to the cluster calibration (collectives, without --kernels or --model); "
                              f"{'--kernels' if args.model is None else '--model'} calibrates one GPU's kernels")
    for dest, flag in MEASURE_OPTIONS.items():
        if args.model is None and dest in given:
            raise ConfigError(dest.split(".")[-1].replace("_", "-"), given[dest],
                              f"{flag} describes the job whose kernels --model measures; give --model too")
    for dest, value in DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)
    if args.out.suffix.lower() != ".toml":
        raise ConfigError("out", str(args.out), "must be a .toml file")
    from commscope.cli.common import check_out_file

    check_out_file(args.out, "out")  # before any work
    from commscope.cli.outputs import claim_file

    with claim_file(args, args.out):  # before any work or rank: one run writes the file
        if args.kernels is not None:
            return _run_fit(args)
        if args.model is not None:
            return _run_measure(args)
        return _run_cluster(args)


def _say(message: str) -> None:
    """One progress line on stderr."""
    print(f"commscope calibrate: {message}", file=sys.stderr, flush=True)


def _command() -> str | None:
    return shlex.join(["commscope", "calibrate", *sys.argv[2:]]) if "calibrate" in sys.argv[1:2] else None


# ----------------------------------------------------------------------------------------------- kernels


def _run_fit(args: argparse.Namespace) -> int:
    """Fit the kernels in ``args.kernels`` and write the GPU file."""
    from commscope.estimate.gpus import load_gpu

    if args.gpu is None:
        raise ConfigError("gpu", None, "--kernels needs --gpu BASE: the GPU the kernels ran on, whose datasheet the fit "
                                       "starts from (a preset: a100, h100, h200, ... or a GPU file)")
    return _fit_and_write(args, args.kernels, load_gpu(args.gpu), None)


def _fit_and_write(args: argparse.Namespace, directory: Path, base: Any, measured: Any) -> int:
    import json
    from dataclasses import replace

    from commscope.estimate.compute.calibration import calibrate_kernels, read_kernel_dir
    from commscope.estimate.gpus import load_gpu

    data = read_kernel_dir(directory)  # a directory, a file or a header it cannot use: refused before any work
    fp8 = bool(data.fp8_gemms) and "fp8" in base.peak_flops
    if not (data.gemms or fp8 or data.attention or data.copies or (data.sustained and data.smi)):
        raise ConfigError("kernels", str(directory), "holds no kernel that fits a constant (GEMMs, FP8 GEMMs, attention, "
                                                     "copies, or a sustained run with nvidia-smi samples; layers only "
                                                     "check the others): nothing written")
    if data.fp8_gemms and not fp8:
        warn(args, f"{base.name} has no fp8 peak: the FP8 GEMMs in {directory} are not fitted (give a --gpu with one)")
    cal = calibrate_kernels(directory, base, progress=_say)
    for message in (*cal.warnings, *at_fit_edges(cal)):
        warn(args, message)
    counts = ", ".join(f"{c.n} {k}" for k, c in cal.classes.items())
    source = (f"kernel constants fitted by `commscope calibrate` to the measurements in {directory} ({counts or 'none'}) "
              f"from the base {base.name}; datasheet and priors: {base.source}")
    cal = replace(cal, gpu=replace(cal.gpu, source=source))
    why = _write_checked(cal.to_toml(), args.out, check=lambda path: load_gpu(path))
    if why is not None:  # the fit produced a file that does not read back: a bug, not the user's input
        print(f"commscope calibrate: error: the fitted GPU file does not read back ({why}); nothing written to "
              f"{args.out}", file=sys.stderr)
        return 1
    if args.json:
        out = {**cal.to_dict(), "out": str(args.out)}
        if measured is not None:
            out["measured"] = measured.to_dict()
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    if measured is not None:
        print(f"measured on {measured.device} in {measured.wall_s:.0f} s: "
              + ", ".join(f"{n} {kind}" for kind, n in measured.rows.items()) + f" (in {measured.directory}; the fit "
              "below is of every job measured there)")
    print(format_calibration(cal))
    print(f"wrote {args.out} (use: --gpu {args.out}; refit: commscope calibrate --kernels {directory} --gpu "
          f"{args.gpu or base.name} --out {args.out})")
    return 0


def at_fit_edges(cal: Any) -> list[str]:
    """One line per fitted constant that ended at an edge of its fit range (the ranges of
    :mod:`commscope.estimate.compute.calibration`; a lower edge of 0 is a real value and not named): no real GPU sits there,
    so the measurements and the base GPU disagree -- another GPU than --gpu, one throttled or shared while measured."""
    from commscope.estimate.compute.calibration import _ATT_HI, _ATT_LO, _GEMM_HI, _GEMM_LO, _GEMM_PARAMS

    ranges: dict[str, dict[str, tuple[float, float]]] = {
        "gemm": dict(zip(_GEMM_PARAMS, zip(_GEMM_LO, _GEMM_HI))),
        "fp8_gemm": {"achievable_fraction_fp8": (0.1, 1.0)},  # calibration._fit_fp8's range
    }
    for kernel in cal.classes.get("attention").parameters if "attention" in cal.classes else ():
        for p, (lo, hi) in zip(("fraction", "tail", "overhead_us"), zip(_ATT_LO, _ATT_HI)):
            for pass_ in ("fwd", "bwd"):
                scale = 1e6 if p == "overhead_us" else 1.0
                ranges.setdefault("attention", {})[f"{kernel}.{pass_}_{p}"] = (lo * scale, hi * scale)
    out = []
    for name, table in ranges.items():
        if name not in cal.classes:
            continue
        params = cal.classes[name].parameters
        for key, (lo, hi) in table.items():
            head, _, tail = key.partition(".")
            value = params[head][tail] if tail else params.get(key)
            if value is None:
                continue
            for edge in (lo, hi):
                if edge and abs(value - edge) <= 1e-3 * (hi - lo):
                    out.append(f"{name}: {key} = {value:.4g} ended at the edge of its fit range ({lo:g} to {hi:g}), "
                               f"where no real GPU sits: the measurements disagree with {cal.base.name} (taken on "
                               "another GPU than --gpu names? throttled or shared while measured?)")
    return out


def format_calibration(cal: Any) -> str:
    """The fit as text: one row per kernel class, then its constants and notes."""
    from commscope.cli.terminal import format_table

    rows = [(name, c.n, f"{c.mape:.1%}", f"{c.worst:.1%}", "-" if c.loo_mape is None else f"{c.loo_mape:.1%}")
            for name, c in cal.classes.items()]
    lines = [f"{cal.gpu.name} fitted to {cal.directory} (base {cal.base.name}); error of time, |predicted / measured - 1|:",
             "", format_table(("class", "rows", "in-sample", "worst", "each model left out"), rows, left=("class",)), ""]
    for name, c in cal.classes.items():
        lines.append(f"{name}: {_parameters_text(c.parameters)}")
        if c.held:
            lines.append(f"  held at their priors when their model was left out: {', '.join(c.held)}")
        lines += [f"  note: {n}" for n in c.notes]
    if any(c.loo_mape is None for c in cal.classes.values()):
        lines.append("each model left out: - where the rows come from one model (nothing left to fit without it)")
    lines += [f"note: {n}" for n in cal.notes]
    return "\n".join(lines)


def _parameters_text(parameters: dict[str, Any]) -> str:
    parts = []
    for key, value in parameters.items():
        if isinstance(value, dict):  # an attention kernel
            parts.append(f"{key} (fwd {value['fwd_fraction']:.3g} of peak, tail {value['fwd_tail']:.2g}, "
                         f"{value['fwd_overhead_us']:.3g} us; bwd {value['bwd_fraction']:.3g}, tail "
                         f"{value['bwd_tail']:.2g}, {value['bwd_overhead_us']:.3g} us)")
        elif key == "kernel_overhead_s":
            parts.append(f"kernel_overhead_us {value * 1e6:.3g}")
        elif isinstance(value, float):
            parts.append(f"{key} {value:.3g}")
        else:
            parts.append(f"{key.replace('_', ' ')}: {value}")
    return ", ".join(parts)


def _run_measure(args: argparse.Namespace) -> int:
    """Measure this job's kernels on the CUDA GPU here, then fit them."""
    from dataclasses import replace

    from commscope.measure.bench.kernels import CPU_TEST_CONFIG, MeasureConfig
    from commscope.cli.common import check_out_dir, resolve_model
    from commscope.estimate.compute.gemm import layer_dims
    from commscope.estimate.gpus import load_gpu

    for dest in ("tp", "micro_batch_size"):
        if getattr(args, dest) < 1:
            raise ConfigError(dest.replace("_", "-"), getattr(args, dest), "must be a positive integer")
    if not 0 <= args.sustained_s <= 600:
        raise ConfigError("sustained-s", args.sustained_s, "must be 0 (none) to 600 seconds; the GPU reaches its "
                                                           "power limit within seconds, 30 (the default) shows it")
    model = resolve_model(args)
    layer_dims(model, tp=args.tp, micro_batch_size=args.micro_batch_size)  # tp divides heads and widths
    if model.dtype not in ("bf16", "fp16", "fp8"):
        raise ConfigError("dtype", model.dtype, "the kernel calibration times bf16 or fp16 GEMMs (FP8 beside them): "
                                                "give --dtype bf16")
    kernels_out = args.kernels_out or args.out.with_name(f"{args.out.stem}-kernels")
    check_out_dir(kernels_out, "kernels-out")  # what it holds is checked against the device (measure_kernels)
    if args.device == "cuda":
        from commscope.estimate.shapes import cuda_available

        ok, why = cuda_available()
        if not ok:
            raise ConfigError("model", args.model, f"measuring a job's kernels needs a CUDA GPU: {why}; kernels measured "
                                                   "on a GPU machine are fitted anywhere with --kernels DIR --gpu BASE")
        base = load_gpu(args.gpu) if args.gpu is not None else _device_gpu()
        config = replace(MeasureConfig(), sustained_s=args.sustained_s)
    else:
        if args.gpu is None:
            raise ConfigError("gpu", None, "--device cpu needs --gpu BASE")
        base = load_gpu(args.gpu)
        config = replace(CPU_TEST_CONFIG, sustained_s=min(args.sustained_s, CPU_TEST_CONFIG.sustained_s))
    from commscope.measure.bench.kernels import measure_kernels

    measured = measure_kernels(model, tp=args.tp, micro_batch_size=args.micro_batch_size, directory=kernels_out,
                               device=args.device, fp8="fp8" in base.peak_flops, config=config, progress=_say,
                               command=_command() or "")
    for note in measured.notes:
        warn(args, note)
    if args.gpu is None:
        args.gpu = base.name
    return _fit_and_write(args, measured.directory, base, measured)


def _device_gpu() -> Any:
    """The GPU preset matching the CUDA device's name (``NVIDIA H200`` -> h200)."""
    import torch

    from commscope.estimate.gpus import gpu_names, gpu_preset

    name = torch.cuda.get_device_name(torch.cuda.current_device())
    try:
        return gpu_preset(name)
    except ConfigError:
        raise ConfigError("gpu", name, f"no GPU preset matches this device; give --gpu a preset ({', '.join(gpu_names())}) "
                                       "or a GPU file with its datasheet (presets/gpus/h100.toml shows the keys)") from None


# ----------------------------------------------------------------------------------------------- cluster


def _run_cluster(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from commscope.measure.bench.calibrate import calibrate, cluster_toml, default_sweep
    from commscope.measure.bench.fit import _points_from_bench, fit
    from commscope.cli.fit_cmd import format_fit
    from commscope.measure.launch import LaunchError

    if args.nproc < 2:
        raise ConfigError("nproc", args.nproc, "a collective needs at least 2 ranks")
    if args.name is not None and not args.name.strip():
        raise ConfigError("name", args.name, "must not be empty; leave --name out to name the cluster after the file "
                                             f"({args.out.stem!r})")
    if not args.time_budget > 0:
        raise ConfigError("time-budget", args.time_budget, "must be > 0")
    if not args.timeout > 0:
        raise ConfigError("timeout", args.timeout, "must be > 0 seconds")
    max_bytes = _maxbytes(args.maxbytes)
    backend = args.backend or _default_backend(args.nproc)
    gpu = None
    if backend == "nccl":  # the GPU the cluster names: known before any rank starts
        from commscope.estimate.gpus import load_gpu

        gpu = load_gpu(args.gpu) if args.gpu is not None else _device_gpu()
    elif args.gpu is not None:
        raise ConfigError("gpu", args.gpu, "the ranks run on the CPU (gloo): their probes are the compute model of the "
                                           "cpu device; --gpu names the GPU of ranks on GPUs (--backend nccl)")
    sweep = dataclasses.replace(default_sweep(args.nproc), max_bytes=max_bytes, time_budget_s=args.time_budget)
    from commscope.measure.bench.sweep import check_memory, check_world
    from commscope.measure.launch import check_nproc

    check_nproc(args.nproc)
    check_memory(sweep, check_world(sweep, args.nproc, backend), args.nproc, backend)
    from commscope.cli.terminal import Progress

    try:
        with Progress("calibrate", quiet=args.json) as progress:
            cal = calibrate(args.nproc, backend=backend, sweep=sweep, timeout_s=args.timeout, progress=progress)
    except LaunchError as exc:
        print(f"commscope calibrate: error: {exc}", file=sys.stderr)
        return 1
    command = _command()
    points, info = _points_from_bench(cal.sweep.to_dict(), "calibration sweep")
    fitted = fit(points, source="calibration sweep", time_kind=info["time_kind"], backend=backend)
    text = cluster_toml(cal, fitted, name=args.name if args.name is not None else args.out.stem, command=command, gpu=gpu)
    why = _write_checked(text, args.out)
    if why is not None:
        print(f"commscope calibrate: error: the calibration measured {why}; nothing written to {args.out} (a cluster "
              "file `estimate --cluster` refuses would be of no use: run it again on a quieter machine, or with larger "
              f"messages, -e {max(4 * max_bytes, 4 << 20) >> 20}M)", file=sys.stderr)
        return 1
    if args.json:
        json.dump({"out": str(args.out), "wall_s": cal.wall_s, "probes": [dataclasses.asdict(p) for p in cal.probes],
                   "gpu": None if gpu is None else gpu.name,
                   "rows": [r.to_dict() for r in cal.sweep.rows]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{args.nproc} {backend} ranks on {cal.probes[0].device}, {cal.wall_s:.1f} s")
    probes = (f"matmul (fp32, n={cal.probes[0].matmul_n}) per rank: {cal.matmul_flops_per_s / 1e9:.2f} GFLOP/s; "
              f"copy {cal.memory_bandwidth_bytes_per_s / 1e9:.2f} GB/s; small op {cal.op_overhead_s * 1e6:.1f} us")
    if gpu is None:
        print(probes)
    else:
        print(f"{probes} (kept in [meta]; no GPU model)")
        print(f"GPU: {gpu.name}, its datasheet; its kernels: commscope calibrate --model MODEL --tp TP --out GPU.toml, "
              "then --gpu GPU.toml")
    print(format_fit(fitted, hint=False))
    print(f"wrote {args.out} (use: --cluster {args.out} --bandwidth {args.out}; each row's error: its "
          "[collectives.fit] table)")
    return 0


def _maxbytes(text: str) -> int:
    """-e as bytes, at least :data:`MIN_MAXBYTES`; ConfigError naming -e and calibrate's own options."""
    from commscope.measure.bench.sweep import parse_sizes_arg

    try:
        value = parse_sizes_arg(text)
    except ConfigError as exc:
        raise ConfigError("maxbytes", text, f"-e {exc.expected} (calibrate's options: {OPTIONS})") from None
    if value < MIN_MAXBYTES:
        raise ConfigError("maxbytes", text, "-e must be at least 1M: the link bandwidth calibrate writes is the bus "
                                            "bandwidth of its largest all_reduce messages, and below 1 MiB they time "
                                            "the latency, not the bandwidth (the sweep runs from 1 KiB to -e by 4x; "
                                            f"calibrate's options: {OPTIONS}); the default is 4M")
    return value


def _write_checked(text: str, out: Path, check: Callable[[Path], Any] | None = None) -> str | None:
    """Write ``text`` to ``out`` only if it reads back -- with ``check`` (a GPU file: ``load_gpu``), by default as a
    cluster (``--cluster``) and as a bandwidth model (``--bandwidth``), as the file says to use it; else leave
    ``out`` as it was and return why (the refused field, its value and the valid range)."""
    from commscope.io.atomic import atomic_path
    from commscope.io.bandwidth_file import read_bandwidth
    from commscope.spec.files import load_cluster

    def as_cluster(path: Path) -> None:
        load_cluster(path)
        read_bandwidth(path, fallback=None)

    class Refused(Exception):
        pass

    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_path(out) as tmp:  # renamed over out only when it reads back
            tmp.write_text(text)
            try:
                (check or as_cluster)(tmp)
            except ConfigError as exc:
                raise Refused(f"{exc.field}={exc.value!r}: {exc.expected}") from None
    except Refused as why:
        return str(why)
    return None


def _default_backend(nproc: int) -> str:
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"
