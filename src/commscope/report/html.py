"""One self-contained HTML report: the data builder and the renderer.

:func:`build_report_data` turns library results (a :class:`~commscope.api.Prediction`, its
:class:`~commscope.estimate.Estimate`, a :class:`~commscope.estimate.plan.Plan`, measured op logs, a bandwidth
benchmark, MoE routing) into one JSON-ready dict; every number the page shows is in it, already computed
here (pooled heatmap cells, shares, histograms, timed schedules, measured-vs-predicted bytes).
:func:`render_html` embeds that dict in a single HTML file whose own small script only draws it: inline
SVG and canvas, no library, no font, no image and no request of any kind leaves the page.

The pieces live beside this module, and every name of theirs below is importable from here too:
:mod:`commscope.report.loaders` reads the optional sections' input files (measured op logs, a benchmark, MoE
routing); :mod:`commscope.report.sections` builds each section (heatmaps, bytes, message sizes, the iteration
breakdown, the pipeline schedule, measured vs predicted, bandwidth curves, time), :mod:`commscope.report.counts`
counts measured and predicted ops alike, and :mod:`commscope.report.moe_section` builds the MoE routing section.
"""

from __future__ import annotations

import functools
import html as _html
import json
import math
import re
import time
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.commop import REPORT_AXES
from commscope.report.counts import logical_measured_ops, measured_bytes_by_axis, predicted_bytes_by_axis, with_axes
from commscope.report.loaders import BenchResult, MeasuredLogs, MoeRouting, load_bench, load_measured, load_moe
from commscope.report.moe_section import MAX_MOE_FRAMES, MOE_DYNAMICS_NOTES, MOE_DYNAMICS_SERIES, moe_metrics, moe_section
from commscope.report.sections import (
    AUTO_GPU_LEVEL_MAX,
    AXIS_STYLE,
    HTML_MAX_CELLS,
    MAX_SCHEDULE_SLOTS,
    TERMS,
    _config_label,
    bench_section,
    breakdown_section,
    bytes_section,
    compare_measured,
    heatmap_section,
    measured_heatmap_section,
    message_size_section,
    per_iteration,
    schedule_section,
    size_histogram,
    time_section,
)

#: Format of the embedded data (bumped on incompatible changes).
FORMAT_NAME = "commscope.report"
FORMAT_VERSION = 1


def _axis_list(keys: Iterable[str]) -> list[dict[str, str]]:
    return [{"key": a, "label": AXIS_STYLE[a][0], "color": AXIS_STYLE[a][1]} for a in keys]


def _summary(prediction, estimate) -> list[dict[str, Any]]:
    out = []
    if prediction is not None:
        tm = prediction.traffic
        link = tm.bytes_by_link()
        out += [
            {"label": "GPUs", "value": tm.world_size, "kind": "count",
             "detail": f"{tm.num_nodes:,} node{'s' if tm.num_nodes != 1 else ''} \u00d7 {tm.gpus_per_node}"},
            {"label": "bytes sent per iteration", "value": tm.total_bytes, "kind": "bytes",
             "detail": f"{link['inter_node'] / tm.total_bytes:.1%} inter-node" if tm.total_bytes else ""},
            # counted as the message-size chart counts them (a transfer once, at its send), so that the page has one
            # number of ops; the op list's records count each receive too
            {"label": "ops per iteration", "value": sum(s.num_ops for s in prediction.workload.opsets if s.op != "recv"),
             "kind": "count", "detail": f"{prediction.num_ops:,} records with the receives; {tm.num_pairs:,} GPU pairs talk"},
        ]
    if estimate is not None:
        out += [
            {"label": "iteration time", "value": estimate.iteration_time_s, "kind": "seconds", "detail": f"{estimate.method} estimate"},
            {"label": "communication", "value": estimate.comm_ratio, "kind": "ratio", "detail": "of the iteration"},
            {"label": "pipeline bubble", "value": estimate.bubble_ratio, "kind": "ratio", "detail": "of the iteration"},
            {"label": "MFU", "value": estimate.mfu, "kind": "ratio", "detail": f"{estimate.tflops_per_gpu:.0f} TFLOP/s per GPU"},
        ]
    return out


def _inputs(prediction, estimate, *, command_line: str | None, files: dict[str, Any] | None) -> dict[str, Any]:
    from commscope import __version__

    out: dict[str, Any] = {"commscope_version": __version__, "command_line": command_line, "files": files or {}}
    if prediction is not None:
        from commscope.spec.files import cluster_to_mapping, model_to_mapping, parallel_to_mapping

        out.update(model=model_to_mapping(prediction.model), parallel=parallel_to_mapping(prediction.parallel),
                   cluster=cluster_to_mapping(prediction.cluster), algorithm=prediction.traffic.algorithm)
    if estimate is not None:
        if estimate.compute_model == "gpu":  # a result, not an input: said as one (the cluster's gpu_util is the input)
            out["estimate_method"] = (f"{estimate.method}: the GPU's compute model, {estimate.gpu_util:.1%} of "
                                      f"{estimate.peak_flops / 1e12:.0f} TFLOP/s peak while computing")
        else:
            out.update(estimate_method=estimate.method, gpu_util=estimate.gpu_util)
    if prediction is not None:
        timed = _timed_attention(prediction)
        if timed is not None:
            out["attention_timed"] = timed
    return out


def _timed_attention(prediction) -> str | None:
    """How the estimate times attention where it is not as the job asked (flash on a GPU without fused kernels)."""
    from commscope.estimate.compute.model import timed_attention
    from commscope.estimate.gpus import gpu_for_cluster

    try:
        gpu = gpu_for_cluster(prediction.cluster)
    except ConfigError:  # no GPU preset: the estimate says how it copes
        return None
    asked = prediction.parallel.attention
    timed, notes = timed_attention(prediction.model, prediction.parallel, gpu)
    return None if timed.attention == asked else f"{timed.attention}: {notes[0].split(':')[0]}"


def build_report_data(*, prediction=None, estimate=None, plan=None, measured: MeasuredLogs | None = None,
                      bench: BenchResult | None = None, moe: Sequence[MoeRouting] | None = None,
                      command_line: str | None = None, files: dict[str, Any] | None = None,
                      title: str | None = None, heatmap_level: str = "auto",
                      time_comparison: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the report shows, as one JSON-ready dict (sections absent when their input is).

    ``estimate`` without ``prediction`` is allowed only for the breakdown; the schedule needs both.
    ``command_line`` and ``files`` are recorded so that the report can be reproduced. ``time_comparison`` (measured
    logs against the bandwidth model and estimate, :func:`commscope.cli.compare_cmd.time_comparison`) adds the
    time section.
    """
    t0 = time.perf_counter()
    if prediction is None and estimate is None and measured is None and bench is None and not moe:
        raise ConfigError("report", "nothing", "needs a prediction, an estimate, measured logs, a benchmark or MoE routing")
    sections: dict[str, Any] = {}
    notes: list[str] = []
    if prediction is not None:
        tm = prediction.traffic
        sections["heatmap"] = heatmap_section(tm, level=heatmap_level)
        sections["bytes"] = bytes_section(tm, prediction.workload.logical_bytes_by_axis())
        notes += list(prediction.workload.notes)
    if measured is not None:
        measured = with_axes(measured, prediction)
    if prediction is not None or measured is not None:
        sections["message_sizes"] = message_size_section(prediction.workload if prediction is not None else None, measured)
    if estimate is not None:
        par = prediction.parallel if prediction is not None else None
        sections["breakdown"] = breakdown_section(estimate, parallel=par, plan=plan)
        if par is not None:
            sections["schedule"] = schedule_section(par, estimate)
        notes += list(estimate.notes)
    elif plan is not None:
        raise ConfigError("plan", "given", "needs the estimate of the job it is compared with")
    if measured is not None:
        sections["measured"] = compare_measured(measured, prediction)
        measured_map = measured_heatmap_section(measured, prediction, level=heatmap_level)
        if measured_map is not None:
            sections["measured_heatmap"] = measured_map
    if time_comparison is not None:
        sections["time"] = time_section(time_comparison)
    if bench is not None:
        sections["bench"] = bench_section(bench, prediction.cluster if prediction is not None else None)
    if moe:
        sections["moe"] = moe_section(moe)
    if title is None:
        if prediction is not None:
            p = prediction.parallel
            title = f"{prediction.model.name} on {prediction.cluster.name}: {_config_label(p)}, {p.world_size:,} GPUs"
        else:
            title = "commscope report"
    return {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "title": title,
        "axes": _axis_list((*REPORT_AXES, "other")),
        "summary": _summary(prediction, estimate),
        "inputs": _inputs(prediction, estimate, command_line=command_line, files=files),
        "notes": list(dict.fromkeys(notes)),
        "build_s": time.perf_counter() - t0,
        **sections,
    }


# ----------------------------------------------------------------------------------------------- rendering


def _jsonable(value: Any) -> Any:
    """Python/numpy values -> JSON values; floats to 7 significant digits, non-finite to null."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        x = float(value)
        if not math.isfinite(x):
            return None
        return x if x == 0 or x.is_integer() and abs(x) < 2**53 else float(f"{x:.7g}")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"report data: {type(value).__name__} is not JSON-serialisable")


def data_to_json(data: dict[str, Any]) -> str:
    """The embedded JSON: compact, and safe inside a ``<script>`` element (``<``, ``>``, ``&`` escaped)."""
    text = json.dumps(_jsonable(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


# The page only draws: every number it shows is in the embedded data. Its skeleton, style and script are files
# of their own, shipped as package data (commscope/report/assets/: page.html, report.css, report.js) and inlined
# here, so that the report stays one self-contained file that makes no request. Errors (window.onerror,
# console.error, a section that fails to draw) are listed in #errors and counted in <body data-errors>, which
# the browser test reads.
ASSETS = ("page.html", "report.css", "report.js")


@functools.cache
def page_asset(name: str) -> str:
    """The text of one of the page's files (:data:`ASSETS`)."""
    if name not in ASSETS:
        raise ValueError(f"no report asset {name!r}; the assets are {', '.join(ASSETS)}")
    return resources.files("commscope.report").joinpath("assets", name).read_text(encoding="utf-8")


def render_html(data: dict[str, Any]) -> str:
    """The report as one self-contained HTML document (inline style and script, data embedded as JSON)."""
    parts = {"TITLE": _html.escape(str(data.get("title", "commscope report"))), "CSS": page_asset("report.css"),
             "DATA": data_to_json(data), "JS": page_asset("report.js")}
    return re.sub(r"%(TITLE|CSS|DATA|JS)%", lambda mo: parts[mo.group(1)], page_asset("page.html"))


def write_html(data: dict[str, Any], path: str | Path) -> Path:
    """Render ``data`` and write it to ``path`` (parents created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from commscope.io.atomic import write_text

    write_text(path, render_html(data))
    return path


__all__ = [
    "AUTO_GPU_LEVEL_MAX",
    "AXIS_STYLE",
    "HTML_MAX_CELLS",
    "MAX_MOE_FRAMES",
    "MAX_SCHEDULE_SLOTS",
    "MOE_DYNAMICS_NOTES",
    "MOE_DYNAMICS_SERIES",
    "TERMS",
    "BenchResult",
    "MeasuredLogs",
    "MoeRouting",
    "bench_section",
    "breakdown_section",
    "build_report_data",
    "bytes_section",
    "compare_measured",
    "data_to_json",
    "heatmap_section",
    "load_bench",
    "load_measured",
    "load_moe",
    "logical_measured_ops",
    "measured_bytes_by_axis",
    "measured_heatmap_section",
    "message_size_section",
    "moe_metrics",
    "moe_section",
    "per_iteration",
    "predicted_bytes_by_axis",
    "render_html",
    "schedule_section",
    "size_histogram",
    "time_section",
    "with_axes",
    "write_html",
]
