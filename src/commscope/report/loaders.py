"""The inputs of the report's optional sections, read from files: measured op logs, a benchmark, MoE routing.

Each loader turns one kind of file into one frozen record the section builders take (:class:`MeasuredLogs`,
:class:`BenchResult`, :class:`MoeRouting`), and refuses a file no section could use with a one-line ConfigError
that names it. Measured runs are per-rank JSON Lines op logs (:func:`commscope.io.oplog.read_ops_jsonl`) or any
other format :func:`commscope.io.runs.read_run` reads; a benchmark is ``{"meta": {...}, "rows": [{"op",
"group_size", "size_bytes", "busbw_bytes_per_s", "time_s", ...}]}``; MoE routing is an ``.npz`` with a
``routing`` array (iterations, ep, ep) of token counts sent from EP rank i to EP rank j, or a routing trace.
The section builders (:mod:`commscope.report.sections`, :mod:`commscope.report.moe_section`) take these records
and read no file themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.commop import CommOp

__all__ = ["BenchResult", "MeasuredLogs", "MoeRouting", "load_bench", "load_measured", "load_moe"]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLogs:
    """The op records of a measured run: every rank's log, merged."""

    ops: tuple[CommOp, ...]
    """Every record of every file; when the records carry step tags, untagged ones have phase ``setup``."""
    files: tuple[str, ...]
    num_iterations: int = 1
    """Iterations the logs cover; measured sums are divided by it to compare with one predicted iteration."""
    steps: tuple[int, ...] = ()
    """The distinct ``step`` tags of the records (``extra``), as `commscope record` writes them."""
    problems: tuple[str, ...] = ()
    header: dict[str, Any] = field(default_factory=dict)
    """The first file's header line (``commscope_header``), if any."""
    num_attributed: int = 0
    """Records that had no axis and took one from a prediction's layout (:func:`with_axes`)."""
    formats: tuple[str, ...] = ()
    """The formats read (``jsonl``, ``kineto``, ``deepspeed``, ...)."""
    missing_fields: tuple[str, ...] = ()
    """CommOp fields the records could not give."""
    notes: tuple[str, ...] = ()
    """What the reader assumed (a group taken from the world size, ...)."""
    partial_steps: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Steps some ranks did not log completely (left out): step -> those ranks."""
    matrix_omitted: str | None = None
    """Why no measured traffic matrix can be drawn (None: it can)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    """A collective micro-benchmark: ``meta`` as written and one dict per measured point."""

    rows: tuple[dict[str, Any], ...]
    meta: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    problems: tuple[str, ...] = ()
    """Damaged rows skipped (``b.json rows[3].time_s=-1e-05: not a measured time (must be > 0): row skipped``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeRouting:
    """Token counts of one MoE routing record: ``routing[it, i, j]`` tokens EP rank i sends to EP rank j."""

    name: str
    routing: np.ndarray
    """(iterations, ep, ep) non-negative counts."""
    source: str = ""
    trace: Any = None
    """The :class:`~commscope.moe.trace.RoutingTrace` behind ``routing`` when it came from one (expert counts):
    the section then also shows the talk's dynamics (:func:`commscope.moe.metrics.routing_metrics`)."""


_HEADER_ITERATION_KEYS = ("num_iterations", "iterations", "num_steps", "steps")


def _step_of(op: CommOp) -> Any:
    for key, value in op.extra:
        if key == "step":
            return value
    return None


def load_measured(path: str | Path, *, num_iterations: int | None = None, layout=None) -> MeasuredLogs:
    """Read a measured run: a directory of per-rank files or one file, of any format
    :func:`commscope.io.runs.read_run` reads (commscope's op logs, Kineto traces, DeepSpeed logs, ...).

    Records tagged with a training step (``extra["step"]``) count as iterations and untagged ones as setup; steps
    some ranks did not log completely are left out (and said); ``num_iterations`` defaults to the number of
    complete steps, else the header's ``num_iterations`` (or ``iterations``, ``steps``), else 1. ``layout`` is the
    job's, when known (see :func:`~commscope.io.runs.read_run`).
    """
    from commscope.io.runs import read_run

    path = Path(path)
    if not path.exists():
        raise ConfigError("measured", str(path), "no such file or directory (expected per-rank op logs or another "
                                                 "tool's records)")
    try:
        run = read_run(path, layout=layout)
    except ValueError as exc:
        raise ConfigError("measured", str(path), str(exc).removeprefix(f"{path}: ")) from None
    if layout is not None and run.world_size and (run.world_size > layout.world_size or (
            run.world_size != layout.world_size and "jsonl" in run.formats)):
        raise ConfigError("measured", str(path), f"holds the logs of {run.world_size} ranks, but the job to compare them "
                                                 f"with has {layout.world_size} (tp x pp x dp x cp): describe the "
                                                 "recorded job (its flags, or model.toml and parallel.toml beside the "
                                                 "logs), or give --no-predicted")
    ops = [op for op in run.all_ops if _step_of(op) not in run.partial_steps]
    problems = list(run.problems)
    if run.partial_steps:
        problems.append("partial steps left out: " + "; ".join(
            f"step {k} (rank(s) {', '.join(map(str, v))})" for k, v in sorted(run.partial_steps.items())))
    header = next((dict(h) for _, h in sorted(run.headers.items()) if h), {})
    steps = sorted({s for s in (_step_of(op) for op in ops) if isinstance(s, int)})
    if steps:
        ops = [op if isinstance(_step_of(op), int) or op.phase == "setup" else op.with_(phase="setup") for op in ops]
    if num_iterations is None:
        found = [header[k] for k in _HEADER_ITERATION_KEYS if isinstance(header.get(k), int) and header[k] >= 1]
        num_iterations = len(steps) if steps else (found[0] if found else 1)
    elif steps and num_iterations != len(steps):  # the logs say how many: a different count would rescale them all
        raise ConfigError("measured_iterations", num_iterations, f"the logs mark {len(steps)} complete training "
                                                                 f"step(s); leave it out (or give {len(steps)})")
    if num_iterations < 1:
        raise ConfigError("measured_iterations", num_iterations, "must be a positive integer")
    if num_iterations > max(len(ops), 1):  # an iteration without a single op on any rank: a typo, not a job
        raise ConfigError("measured_iterations", num_iterations, f"is more than the {len(ops)} op records the logs "
                                                                 "hold; give the number of training iterations logged")
    return MeasuredLogs(ops=tuple(ops), files=run.files, num_iterations=num_iterations, steps=tuple(steps),
                        problems=tuple(problems), header=header, formats=run.formats,
                        missing_fields=run.missing_fields, notes=run.notes, partial_steps=dict(run.partial_steps),
                        matrix_omitted=run.matrix_omitted)


_BENCH_REQUIRED = ("op", "group_size", "size_bytes", "busbw_bytes_per_s")


def load_bench(path: str | Path) -> BenchResult:
    """Read a benchmark JSON ``{"meta": {...}, "rows": [...]}`` (a bare list of rows is accepted too). A row whose
    numbers no measurement has (:func:`commscope.io.checks.bench_row_problem`: the rules ``fit`` and ``--bandwidth``
    apply) is skipped and named in ``problems``; a file of no usable row is refused."""
    from commscope.io.checks import bench_row_problem, read_json_document

    path = Path(path)
    if not path.exists():  # a folder, a pipe, an unreadable file: read_json_document says which
        raise ConfigError("bench", str(path), "no such file (expected a benchmark JSON with meta and rows)")
    doc = read_json_document(path, "bench", what="a benchmark JSON with meta and rows (commscope bench --out)")
    rows = doc.get("rows") if isinstance(doc, dict) else doc
    meta = doc.get("meta", {}) if isinstance(doc, dict) else {}
    if not isinstance(rows, list) or not rows:
        raise ConfigError("bench", str(path), 'needs a non-empty "rows" list of {op, group_size, size_bytes, busbw_bytes_per_s}')
    out, problems = [], []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ConfigError(f"rows[{i}]", row, "must be an object", source=str(path))
        missing = [k for k in _BENCH_REQUIRED if k not in row]
        if missing:
            raise ConfigError(f"rows[{i}]", {k: row[k] for k in list(row)[:4]}, f"lacks {', '.join(missing)}", source=str(path))
        why = bench_row_problem(row)
        if why is not None:
            problems.append(f"{path.name} rows[{i + 1}].{why}: row skipped")
            continue
        try:
            clean = dict(row, op=str(row["op"]), group_size=int(row["group_size"]), size_bytes=int(row["size_bytes"]),
                         busbw_bytes_per_s=float(row["busbw_bytes_per_s"]))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"rows[{i}]", row, f"has a non-numeric value ({exc})", source=str(path)) from None
        out.append(clean)
    if not out:
        raise ConfigError("bench", str(path), f"has no usable row: {'; '.join(problems[:3])}")
    return BenchResult(rows=tuple(out), meta=dict(meta) if isinstance(meta, dict) else {"meta": meta}, source=str(path),
                       problems=tuple(problems))


def load_moe(path: str | Path) -> list[MoeRouting]:
    """Read an ``.npz`` with a ``routing`` array (iterations, ep, ep), or every ``*.npz`` of a directory; a
    routing trace (:mod:`commscope.moe.trace`: a ``counts`` array, or a directory of ``routing-rank*.npz``)
    becomes its rank-to-rank tokens summed over micro-batches and layers."""
    from commscope.moe.routing import rank_tokens
    from commscope.moe.trace import RANK_FILE_GLOB, load_trace

    def from_trace(source: Path) -> MoeRouting:
        trace = load_trace(source)
        assert trace.placement is not None  # __post_init__ fills in the default
        routing = rank_tokens(trace.counts.sum(axis=(1, 2)), trace.placement, trace.ep)
        return MoeRouting(name=source.stem if source.is_file() else source.name, routing=routing, source=str(source),
                          trace=trace)

    path = Path(path)
    if not path.exists():
        raise ConfigError("moe", str(path), "no such file or directory (expected .npz files with a routing array)")
    files = sorted(path.glob("*.npz")) if path.is_dir() else [path]
    out = []
    if path.is_dir() and any(path.glob(RANK_FILE_GLOB)):
        out.append(from_trace(path))
        files = [f for f in files if not f.match(RANK_FILE_GLOB)]
    if not files and not out:
        raise ConfigError("moe", str(path), "holds no *.npz files")
    for f in files:
        try:
            with np.load(f, allow_pickle=False) as npz:
                if "counts" in npz.files:
                    routing = None
                elif "routing" not in npz.files:
                    raise ConfigError("moe", str(f), f"has no 'routing' array (it has: {', '.join(npz.files) or 'nothing'})")
                else:
                    routing = np.asarray(npz["routing"])
        except (OSError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError("moe", str(f), "is not a readable .npz archive of routing counts (truncated, corrupt, or "
                                             "not written by numpy: a routing trace from `commscope moe` or "
                                             "commscope.moe.RoutingTrace.save)") from None
        if routing is None:
            out.append(from_trace(f))
            continue
        if routing.ndim == 2:
            routing = routing[None]
        if routing.ndim != 3 or routing.shape[1] != routing.shape[2] or routing.shape[0] < 1:
            raise ConfigError("moe", str(f), f"routing has shape {routing.shape}; expected (iterations, ep, ep)")
        if not np.issubdtype(routing.dtype, np.number) or not np.all(np.isfinite(routing)) or np.any(routing < 0):
            raise ConfigError("moe", str(f), "routing must hold finite token counts >= 0")
        out.append(MoeRouting(name=f.stem, routing=routing, source=str(f)))
    return out
