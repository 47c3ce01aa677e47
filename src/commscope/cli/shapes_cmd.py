"""``commscope shapes``: the GEMMs of a layer on this GPU, the shape rules they break, and faster shapes nearby.

    commscope shapes --model gpt-3b --cluster dgx-a100 --tp 2
    commscope shapes --model my.json --sweep hidden=4096:8192:64 --png shapes/
    commscope shapes --model gpt-3b --cluster dgx-a100 --tp 2 --measure     # on a CUDA machine

``--measure`` needs torch and a CUDA GPU; without one the command says so on one line and exits with
status 2 (nothing else is printed, so a script cannot mistake predictions for measurements). It times each GEMM as
``commscope calibrate`` does (:func:`commscope.measure.bench.kernels.time_gemm`: the layout of its pass, 0.3 s of load, the
median of CUDA-event-timed calls) and shows it beside the prediction. ``--kernels-out DIR`` also writes the linear-layer
GEMMs (not the attention ones a fused kernel runs) in the kernel CSV format (``DIR/<device>_<model>_tp<t>_mb<b>_gemms.csv``,
one file per job, never overwritten, never beside another device's), which ``commscope calibrate --kernels DIR --gpu BASE --out GPU.toml`` fits, with
every other job measured into DIR, into a GPU file for ``--gpu GPU.toml``. (No single ``achievable_fraction`` is
offered: the estimate's GPU model has several kernel constants, and one number fitted beside them would contradict it.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from commscope.cli.common import add_job_args, check_out_dir, check_out_file, out_path, resolve_job, warn
from commscope.errors import ConfigError


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("shapes", help="GEMM efficiency of a model's shapes on its GPU, broken shape rules, faster shapes",
                       description="List every GEMM of a transformer layer on one GPU (forward, dgrad, wgrad) with its "
                                   "(M, N, K), tile and wave quantisation, alignment and memory roofline, the predicted "
                                   "efficiency and the shape rule it breaks; then nearby shapes with about the same "
                                   "parameter count that run faster, with their effect on communication.")
    add_job_args(p)
    g = p.add_argument_group("shapes")
    g.add_argument("--gpu", default=None,
                   help="GPU preset (a100, h100, v100, rtx3090) or GPU file (default: matched from the cluster's gpu)")
    g.add_argument("--attention", choices=("flash", "unfused"), default="flash",
                   help="flash (default): s x s scores stay on chip; unfused: they go through HBM")
    g.add_argument("--tolerance", type=float, default=0.05, help="parameter-count tolerance of suggestions (default 0.05)")
    g.add_argument("--top", type=int, default=5, help="suggestions to show (default 5)")
    g.add_argument("--refine", type=int, default=48, help="screened shapes estimated in full (default 48; at least 1)")
    g.add_argument("--rank-by", choices=("time", "time-per-param"), default="time",
                   help="rank suggestions by iteration time (default) or iteration time per parameter")
    g.add_argument("--no-suggest", dest="suggest", action="store_false", help="skip the search for faster shapes")
    g.add_argument("--sweep", action="append", default=None, metavar="KEY=START:STOP:STEP",
                   help="predicted throughput as one quantity varies: hidden, heads, ffn, layers, seq, micro_batch, vocab "
                        "(e.g. hidden=4096:8192:64, stop included; or KEY=v1,v2,...); one --sweep per run")
    g.add_argument("--png", type=Path, default=None,
                   help="with --sweep: write the plot to this .png file or into this folder (needs matplotlib)")
    g.add_argument("--force", action="store_true", help="replace the plot of an earlier run at --png")
    g.add_argument("--measure", action="store_true",
                   help="time the GEMMs with torch on this machine's CUDA GPU and compare with the prediction")
    g.add_argument("--measure-iters", type=int, default=10, help="timed repetitions per GEMM, at least (default 10)")
    g.add_argument("--kernels-out", type=out_path, default=None, metavar="DIR",
                   help="with --measure: also write the measured GEMMs as a kernel CSV into DIR, for `commscope "
                        "calibrate --kernels DIR --gpu BASE --out GPU.toml`")
    g.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``hidden=4096:8192:64`` (stop included) or ``heads=16,20,24`` -> (key, values)."""
    from commscope.estimate.shapes import SWEEP_KEYS

    key, sep, spec = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not spec:
        raise ConfigError("sweep", text, "expected KEY=START:STOP:STEP or KEY=v1,v2,..., e.g. hidden=4096:8192:64")
    if key not in SWEEP_KEYS:
        raise ConfigError("sweep", text, f"unknown key {key!r}; valid: {', '.join(SWEEP_KEYS)}")
    try:
        parts = [int(x) for x in spec.split(":" if ":" in spec else ",")]
    except ValueError:
        raise ConfigError("sweep", text, "values must be integers: KEY=START:STOP:STEP or KEY=v1,v2,...") from None
    if ":" in spec:
        if len(parts) not in (2, 3):
            raise ConfigError("sweep", text, "a range is START:STOP or START:STOP:STEP")
        start, stop, step = parts[0], parts[1], parts[2] if len(parts) == 3 else 1
        if step < 1 or stop < start:
            raise ConfigError("sweep", text, "needs START <= STOP and STEP >= 1")
        values = list(range(start, stop + 1, step))
    else:
        values = parts
    if not values or any(v < 1 for v in values):
        raise ConfigError("sweep", text, "values must be positive integers")
    if len(values) > 2000:
        raise ConfigError("sweep", text, f"{len(values)} values; at most 2000 (use a larger step)")
    return key, values


def run(args: argparse.Namespace) -> int:
    from commscope.estimate.gpus import gpu_for_cluster
    from commscope.estimate import shapes

    if args.measure:
        ok, why = shapes.cuda_available()
        if not ok:
            raise ConfigError("measure", True, f"needs a CUDA GPU: {why}; run without --measure for predictions only")
        if args.measure_iters < 1:
            raise ConfigError("measure_iters", args.measure_iters, "must be >= 1")
    elif args.kernels_out is not None:
        raise ConfigError("kernels-out", str(args.kernels_out), "writes what --measure measured: add --measure")
    if args.png is not None and not args.sweep:
        raise ConfigError("png", str(args.png), "the plot shows a sweep: add --sweep KEY=START:STOP:STEP")
    if args.sweep and len(args.sweep) > 1:  # argparse would keep the last silently
        raise ConfigError("sweep", args.sweep[1], f"one --sweep per run (already sweeping {args.sweep[0]}): a sweep "
                                                  "varies one quantity; run shapes once for each")
    sweep = parse_sweep(args.sweep[0]) if args.sweep else None
    if args.png is not None:  # a .png file, or a folder to write <model>-<key>-sweep.png into (see plot_sweep)
        (check_out_file if args.png.suffix.lower() == ".png" else check_out_dir)(args.png, "png")
    if args.top < 1:
        raise ConfigError("top", args.top, "must be >= 1")
    if args.refine < 1:
        raise ConfigError("refine", args.refine, "must be >= 1: the suggestions are the best of the screened shapes "
                                                 "estimated in full (default 48); --no-suggest skips them")
    model, parallel, cluster = resolve_job(args)
    gpu = gpu_for_cluster(cluster, args.gpu)
    problem = gpu.dtype_problem(model.dtype)  # bf16 on a V100: as estimate says it
    if problem is not None:
        warn(args, problem)
    if sweep is not None:
        return _run_sweep(args, sweep, model, parallel, cluster, gpu)

    report = shapes.analyse_shapes(model, parallel, cluster, gpu, attention=args.attention)
    suggestions = None
    if args.suggest:
        suggestions = shapes.suggest_shapes(model, parallel, cluster, gpu, tolerance=args.tolerance, top=args.top,
                                            refine=args.refine, rank_by=args.rank_by.replace("-", "_"),
                                            attention=args.attention)
    measured = None
    csv_path = None
    if args.measure:
        if args.kernels_out is not None:  # refused before anything is measured
            csv_path = _kernels_csv(args.kernels_out, model, parallel)
        measured = shapes.measure_gemms(report.gemms, model.dtype, iters=args.measure_iters)
        if csv_path is not None:
            _write_kernels_csv(csv_path, measured, model, parallel)
    if args.json:
        out: dict[str, Any] = report.to_dict()
        out["suggestions"] = suggestions.to_dict() if suggestions is not None else None
        if measured is not None:
            out["measured"] = [m.to_dict() for m in measured]
            out["measured_over_predicted"] = shapes.measured_over_predicted(measured)
            out["kernels_csv"] = None if csv_path is None else str(csv_path)
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(format_report(report))
    if suggestions is not None:
        print()
        print(format_suggestions(suggestions))
    if measured is not None:
        print()
        print(format_measured(measured, gpu, csv_path=csv_path, base=args.gpu or gpu.name))
    return 0


def _kernels_csv(directory: Path, model, parallel) -> Path:
    """The kernel CSV ``--kernels-out`` writes for this job, checked before anything is timed: writable, this job
    not measured there before, no other device's measurements (:func:`commscope.measure.bench.kernels.check_kernel_directory`)."""
    from commscope.measure.bench.kernels import check_kernel_directory, job_prefix
    from commscope.estimate.shapes import cuda_available

    check_out_dir(directory, "kernels-out")
    ok, device = cuda_available()
    device = device if ok else "cpu"
    job = job_prefix(device, model, parallel.tp, parallel.micro_batch_size)
    check_kernel_directory(directory, device, job)
    return directory / f"{job}_gemms.csv"


def _write_kernels_csv(path: Path, measured, model, parallel) -> None:
    """The linear-layer GEMMs of ``measured`` as a ``*gemms.csv`` file (one call each; fused attention's are left out)."""
    from commscope.measure.bench.kernels import model_label, write_gemms_csv

    path.parent.mkdir(parents=True, exist_ok=True)
    label = model_label(model)[0]  # the model column, as calibrate --model writes it
    rows = []
    for m in measured:
        g = m.result.gemm
        if g.name not in ("attn_scores", "attn_values"):
            rows.append({"model": label, "tp": parallel.tp, "micro_batch": parallel.micro_batch_size,
                         "gemm": g.name, "pass": g.pass_, "m": g.m, "n": g.n, "k": g.k, "batch": g.batch,
                         "measured_s": m.measured_s / g.count})
    write_gemms_csv(path, rows)


# ----------------------------------------------------------------------------------------------- text


def _header(model, parallel, cluster, gpu) -> str:
    peak = gpu.peak_flops_for(model.dtype) / 1e12
    dtype = model.dtype if gpu.dtype_problem(model.dtype) is None else f"fp16 (no {model.dtype} on this GPU)"
    return (f"{model.name} on {cluster.name}: {gpu.name} ({gpu.num_sms} SMs, {peak:.0f} TFLOP/s {dtype} peak, "
            f"{gpu.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s), tp={parallel.tp} pp={parallel.pp} dp={parallel.dp} "
            f"cp={parallel.cp} ep={parallel.ep}, micro-batch {parallel.micro_batch_size} x {model.seq_len} tokens")


def format_report(report) -> str:
    from commscope.cli.terminal import format_table

    model, par, gpu = report.model, report.parallel, report.gpu
    lines = [_header(model, par, report.cluster, gpu),
             f"GEMMs one GPU runs per layer and micro-batch (forward, dgrad, wgrad), {model.dtype}:", ""]
    rows: list[tuple[Any, ...] | str] = []
    kind_seen = None
    for r in report.gemms:
        g = r.gemm
        if g.layer_kind != kind_seen:  # a layer kind's rows under its label
            rows.append({"dense": "-- dense layer", "moe": "-- MoE layer",
                         "model": "-- output layer (once per model)"}[g.layer_kind]
                        + (f" (x{r.layers} layers)" if g.layer_kind != "model" else ""))
            kind_seen = g.layer_kind
        rows.append((g.name, g.pass_, (f"{g.count}x" if g.count > 1 else "") + str(g.batch), g.m, g.n, g.k,
                     f"{g.flop / 1e9:.1f}", f"{r.tile[0]}x{r.tile[1]}", r.split_k, r.num_waves,
                     f"{r.tile_efficiency:.0%}", f"{r.wave_efficiency:.0%}", f"{r.alignment_factor:.2f}",
                     "memory" if r.memory_bound else "compute", f"{r.time_s * 1e6:.1f}", f"{r.efficiency:.0%}",
                     ", ".join(r.broken_rules)))
    lines.append(format_table(("gemm", "pass", "batch", "M", "N", "K", "GFLOP", "tile", "split", "waves", "tile%",
                               "wave%", "align", "bound", "time us", "eff", "rule"), rows,
                              left=("gemm", "pass", "tile", "bound", "rule"), keys=2))
    kind = "moe" if model.is_moe else "dense"
    layer_results = [r for r in report.gemms if r.gemm.layer_kind == kind]
    layer_t = sum(r.time_s for r in layer_results)
    layer_f = sum(r.gemm.flop for r in layer_results)
    peak = gpu.peak_flops_for(model.dtype)
    lines += ["", (f"one {kind} layer: {layer_t * 1e3:.2f} ms of GEMMs at {layer_f / layer_t / peak:.1%} of peak; "
                  f"a micro-batch ({model.num_layers} layers + logits, all stages): {report.gemm_time_s * 1e3:.1f} ms at "
                  f"{report.gemm_efficiency:.1%} (a large aligned GEMM: {gpu.achievable_fraction:.0%})")]
    worst = sorted((r for r in report.gemms), key=lambda r: r.efficiency)[:3]
    lines.append("least efficient: " + "; ".join(f"{r.gemm.name} {r.gemm.pass_} {r.efficiency:.0%} ({_why(r)})"
                                                 for r in worst))
    lines += ["", f"shape rules (multiples of 64 elements = {64 * model.dtype_bytes} bytes of {model.dtype}):"]
    order = {"invalid": 0, "broken": 1, "warn": 2, "ok": 3}
    for rule in sorted(report.rules, key=lambda r: order[r.status]):
        label = {"invalid": "INVALID", "broken": "BROKEN", "warn": "warn", "ok": "ok"}[rule.status]
        text = f"  {label:<8}{rule.title} = {rule.value}: {rule.requirement}"
        if rule.status != "ok" and rule.slowdown is not None:
            verb = "would be" if rule.status == "warn" else "are"
            text += (f" -> {', '.join(rule.affected)} {verb} {rule.slowdown:+.1%} slower on {gpu.name}; "
                     f"{rule.time_lost_s * 1e3:.2f} ms per micro-batch ({rule.share:.1%} of GEMM time)")
        lines.append(text)
        if rule.status != "ok":
            lines.append(f"          why: {rule.explanation}")
            if rule.fix:
                lines.append(f"          fix: {rule.fix}")
    est, base = report.estimate, report.baseline_estimate
    lines += ["", (f"estimate ({est.method}): flat u = {base.gpu_util:.2f} -> {base.iteration_time_s:.3f} s per iteration; "
                  f"shape-aware u = {est.gpu_util:.3f} -> {est.iteration_time_s:.3f} s (compute {est.compute_s:.3f} s, "
                  f"communication {est.comm_s:.3f} s, bubble {est.bubble_s:.3f} s)")]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _why(r) -> str:
    causes = []
    if r.memory_bound:
        causes.append(f"memory-bound, {r.arithmetic_intensity:.0f} FLOP/B")
    if r.tile_efficiency < 0.999:
        causes.append(f"tile {r.tile_efficiency:.0%}")
    if r.wave_efficiency < 0.999:
        causes.append(f"{r.num_waves} waves at {r.wave_efficiency:.0%}")
    if r.alignment_factor < 1:
        causes.append(f"alignment x{r.alignment_factor:.2f}")
    if r.tile_throughput < 0.999:
        causes.append(f"small {r.tile[0]}x{r.tile[1]} tile")
    return ", ".join(causes) or "no loss"


def format_suggestions(s) -> str:
    from commscope.cli.terminal import format_table

    by = "iteration time" if s.rank_by == "time" else "iteration time per parameter"
    lines = [(f"nearby shapes within +-{s.tolerance:.0%} parameters, ranked by predicted {by} "
             f"({s.num_candidates} shapes, {s.num_within_tolerance} within tolerance, {s.num_estimated} estimated):"), ""]
    rows = []
    for label, e in [("-", s.original)] + [(str(i), e) for i, e in enumerate(s.entries, start=1)]:
        m = e.model
        orig = label == "-"
        rows.append((label, m.num_layers, m.hidden_size, m.num_heads, m.head_size, m.ffn,
                     f"{e.num_parameters / 1e9:.3f}B", "" if orig else f"{e.param_change:+.1%}",
                     f"{e.estimate.iteration_time_s:.3f}", "" if orig else f"{e.iteration_speedup:.3f}x",
                     "" if orig else f"{e.compute_speedup:.3f}x", f"{e.gemm_efficiency:.1%}",
                     "" if orig else f"{e.comm_bytes_change:+.1%}", "" if orig else f"{e.comm_time_change_s * 1e3:+.1f}",
                     e.changes + (" | broken: " + ", ".join(e.broken_rules) if e.broken_rules else "")))
    lines.append(format_table(("#", "layers", "hidden", "heads", "head", "ffn", "params", "dparams", "iter s", "speedup",
                               "compute", "GEMM eff", "dcomm B", "dcomm ms", "changes / broken rules"), rows,
                              left=("changes / broken rules",), wrap=("changes / broken rules",)))
    if not s.entries:
        lines.append("   (no nearby shape is faster by the model)")
    lines += [f"note: {n}" for n in s.notes]
    return "\n".join(lines)


def format_measured(measured, gpu, *, csv_path: Path | None = None, base: str = "BASE") -> str:
    from commscope.cli.terminal import format_table
    from commscope.estimate.shapes import measured_over_predicted

    rows = [(m.result.gemm.name, m.result.gemm.pass_, m.result.gemm.m, m.result.gemm.n, m.result.gemm.k,
             f"{m.result.time_s * 1e6:.1f}", f"{m.measured_s * 1e6:.1f}", f"{m.predicted_over_measured:.2f}",
             f"{m.result.gemm.flop / m.measured_s / 1e12:.1f}") for m in measured]
    lines = ["measured with torch.matmul on this GPU (CUDA events):", "",
             format_table(("gemm", "pass", "M", "N", "K", "predicted us", "measured us", "pred/meas", "TFLOP/s"), rows,
                          left=("gemm", "pass"), keys=2)]
    ratio = measured_over_predicted(measured)
    if ratio is not None:
        lines += ["", f"measured / predicted: median {ratio:.2f} over the compute-bound GEMMs (>= 1 GFLOP) on {gpu.name}"]
    fit = f"commscope calibrate --kernels DIR --gpu {base} --out GPU.toml"
    if csv_path is not None:
        fit = fit.replace("DIR", str(csv_path.parent))
        lines.append(f"wrote {csv_path}: fit {gpu.name}'s kernel constants to it (and to every job measured beside "
                     f"it): {fit}, then --gpu GPU.toml")
    else:
        lines.append(f"to fit {gpu.name}'s kernel constants to these: --kernels-out DIR keeps them, then {fit}, and "
                     "--gpu GPU.toml")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- sweep


def _run_sweep(args, sweep: tuple[str, list[int]], model, parallel, cluster, gpu) -> int:
    from commscope.cli.terminal import print_table
    from commscope.estimate.shapes import sweep_shapes

    from contextlib import nullcontext

    from commscope.cli.outputs import claim_file

    key, values = sweep
    png = None
    with nullcontext() if args.png is None else claim_file(args, sweep_png(args.png, model.name, key), field="png"):
        result = sweep_shapes(model, parallel, cluster, values, key=key, gpu=gpu, attention=args.attention)
        if args.png is not None:
            png = plot_sweep(result, args.png, title=f"{model.name} on {gpu.name}, tp={parallel.tp} pp={parallel.pp} "
                                                     f"dp={parallel.dp}, micro-batch {parallel.micro_batch_size}",
                             current=_current_value(model, parallel, key))
    if args.json:
        json.dump({"model": model.name, "cluster": cluster.name, "gpu": gpu.name, "sweep": result.to_dict(),
                   "png": str(png) if png else None}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(_header(model, parallel, cluster, gpu))
    print(f"sweep of {key}: {len(values)} values, {int(result.valid.sum())} valid\n")
    print_table((key, "params", "GEMM TFLOP/s", "GEMM eff", "iter s", "model TFLOP/s", "broken rules"),
                [(int(v), f"{result.num_parameters[i] / 1e9:.3f}B", f"{result.gemm_tflops_per_gpu[i]:.1f}",
                  f"{result.gemm_efficiency[i]:.1%}", f"{result.iteration_time_s[i]:.3f}",
                  f"{result.model_tflops_per_gpu[i]:.1f}", ", ".join(result.broken_rules[i]))
                 for i, v in enumerate(result.values) if result.valid[i]], left=("broken rules",), wrap=("broken rules",))
    if result.skipped:
        print(f"\nskipped {len(result.skipped)}: " + "; ".join(result.skipped[:5]) + (" ..." if len(result.skipped) > 5 else ""))
    if png:
        print(f"\nwrote {png}")
    return 0


def _current_value(model, parallel, key: str) -> int | None:
    return {"hidden": model.hidden_size, "heads": model.num_heads, "ffn": model.ffn, "layers": model.num_layers,
            "seq": model.seq_len, "micro_batch": parallel.micro_batch_size, "vocab": model.vocab_size}.get(key)


def sweep_png(path: Path, model: str, key: str) -> Path:
    """The file a sweep's plot goes to: ``path`` itself when it names a ``.png``, else ``<model>-<key>-sweep.png``
    in the folder ``path``."""
    path = Path(path)
    return path if path.suffix.lower() == ".png" else path / f"{model}-{key}-sweep.png"


def plot_sweep(result, path: Path, *, title: str, current: int | None = None) -> Path:
    """Two panels over the swept values: GEMM TFLOP/s per GPU (the co-design paper's view) and end-to-end model
    TFLOP/s per GPU (communication and bubble included). Shapes that break a rule are drawn in orange.

    ``path`` is a ``.png`` file or a folder (the file is then ``<model>-<key>-sweep.png``). matplotlib is
    imported here (extra ``plots``); without it a ConfigError says how to install it.
    """
    try:
        import numpy as np
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("png", str(path), "plots need matplotlib, which is not installed: pip install 'commscope[plots]'") from None
    path = sweep_png(path, result.model, result.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    x = result.values.astype(float)
    ok = result.valid
    broken = np.array([bool(r) for r in result.broken_rules]) & ok
    clean = ok & ~broken
    fig = Figure(figsize=(9, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True)
    for ax, y, label in ((top, result.gemm_tflops_per_gpu, "GEMM TFLOP/s per GPU"),
                         (bottom, result.model_tflops_per_gpu, "model TFLOP/s per GPU\n(iteration, incl. comm + bubble)")):
        ax.plot(x[ok], y[ok], color="0.6", linewidth=1, zorder=1)
        ax.scatter(x[clean], y[clean], s=14, color="tab:blue", label="every shape rule holds", zorder=2)
        if broken.any():
            ax.scatter(x[broken], y[broken], s=14, color="tab:orange", label="breaks a shape rule", zorder=2)
        if current is not None and x.min() <= current <= x.max():
            ax.axvline(current, color="tab:green", linestyle=":", linewidth=1, label=f"current ({current})")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
        finite = y[ok & np.isfinite(y)]
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
            pad = max((hi - lo) * 0.1, hi * 0.02)
            ax.set_ylim(max(0.0, lo - pad), hi + pad)
    top.legend(loc="lower right", fontsize=8)
    top.set_title(title, fontsize=10)
    label = {"hidden": "hidden size h", "heads": "attention heads", "ffn": "FFN hidden size", "layers": "layers",
             "seq": "sequence length", "micro_batch": "micro-batch size", "vocab": "vocabulary size"}.get(result.key, result.key)
    bottom.set_xlabel(f"{label}\n(predicted, not measured: tile and wave quantisation, alignment, roofline on {result.gpu})",
                      fontsize=9)
    from commscope.io.atomic import atomic_path

    with atomic_path(path, field="png") as tmp:
        fig.savefig(tmp, dpi=110)
    return path
