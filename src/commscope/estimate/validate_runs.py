"""Reading a CSV of measured runs into the specs commscope predicts from (:func:`read_runs`).

Each data row becomes a :class:`Run`: its model (the shape columns, or a model preset or file), its parallelism,
its cluster (a preset or file, or the one whose GPU the gpu column names), and the measured seconds per iteration
(given, or derived from TFLOP/s per GPU), with every assumption the row needed in its notes. Cells are read by the
column table of :mod:`commscope.estimate.validate_columns`; the file format is documented in
:mod:`commscope.estimate.validate`, which re-exports these names. Every bad cell raises
:class:`~commscope.errors.ConfigError` naming the file, the row, the case, the column and the value.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.estimate.validate_columns import (
    _MODEL_FIELDS,
    _NOT_DEFAULTS,
    _PARALLEL_FIELDS,
    _SHAPE,
    _SPELLING,
    COLUMNS,
    _normal,
    _spelled,
)
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import GB, TFLOP


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One measured training run: the job as commscope's specs, and what it measured."""

    case_id: str
    """The run's label (``row N`` when the file gives none)."""
    model: ModelSpec
    parallel: ParallelSpec
    cluster: ClusterSpec
    measured_iteration_time_s: float
    """Measured seconds per iteration (given, or derived from ``measured_tflops_per_gpu``; see ``notes``)."""
    measured_tflops_per_gpu: float | None = None
    """TFLOP/s per GPU as the file gives it (None: not given)."""
    notes: tuple[str, ...] = ()
    """Every assumption the row needed: defaults for blank cells, the cluster matched, a time derived."""
    extra: dict[str, str] = field(default_factory=dict)
    """Columns :func:`read_runs` does not know (source, notes, status, ...), by their header, as text."""
    where: str = ""
    """Where the run comes from, for messages: ``runs.csv row 3 (line 4, case 'b')``."""
    defaults_used: frozenset[str] = frozenset()
    """The columns whose blank cell took a value from :func:`read_runs`' ``defaults`` (a default no run took
    changed nothing: every row's cell gave its own value)."""


def _at(exc: ConfigError, where: str, headers: Mapping[str, str] | None = None) -> ConfigError:
    """``exc`` re-raised at ``where``, its field given by the column the file spells it with."""
    name = exc.field
    if headers and name in headers and _normal(headers[name]) != name.lower():
        name = f"{name} (column {headers[name]!r})"
    expected = exc.expected if exc.source is None else f"{exc.expected} (in {exc.source})"
    return ConfigError(name, exc.value, expected, source=where)


def _read_text(path: Path) -> str:
    if path.is_dir():
        raise ConfigError("path", str(path), "is a directory; expected a CSV file of measured runs")
    if not path.is_file():
        raise ConfigError("path", str(path), "no such file; expected a CSV file of measured runs")
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError("path", str(path), f"is not UTF-8 text (byte {exc.start}); expected a CSV file") from None
    except OSError as exc:
        raise ConfigError("path", str(path), f"cannot be read: {exc.strerror or exc}") from None


def _records(text: str, source: str) -> list[tuple[int, list[str]]]:
    """(line, cells) of every record of ``text``; the line is where the record ends (1-based)."""
    reader = csv.reader(io.StringIO(text, newline=""))
    out: list[tuple[int, list[str]]] = []
    try:
        for cells in reader:
            out.append((reader.line_num, cells))
    except csv.Error as exc:
        raise ConfigError("csv", f"line {reader.line_num}", f"malformed CSV: {exc}", source=source) from None
    return out


def _header(cells: list[str], source: str) -> tuple[dict[str, int], dict[str, str], list[tuple[int, str]]]:
    """Known columns (field -> index), their headers (field -> header) and the other columns (index, header)."""
    known: dict[str, int] = {}
    headers: dict[str, str] = {}
    other: list[tuple[int, str]] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(cells):
        header = raw.strip()
        key = _normal(header)
        if key and key in seen:
            raise ConfigError("header", header, f"column {i + 1} repeats column {seen[key]!r}; keep one", source=source)
        seen[key] = header
        name = _SPELLING.get(key)
        if name is None:
            other.append((i, header or f"column {i + 1}"))
        elif name in known:
            raise ConfigError("header", header, f"column {i + 1} and column {headers[name]!r} both give {name} "
                                                f"({_spelled(name)}); keep one", source=source)
        else:
            known[name] = i
            headers[name] = header
    return known, headers, other


def _check_columns(known: Mapping[str, int], defaults: Mapping[str, Any], source: str) -> None:
    """ConfigError naming what a file of runs lacks."""
    missing = []
    if "model" not in known and not all(name in known for name in _SHAPE):
        lacking = [_spelled(n) for n in _SHAPE if n not in known]
        missing.append(f"{', '.join(lacking)} (or a model column naming a model preset or file)")
    if "dp" not in known and "gpus" not in known:
        missing.append(f"{_spelled('dp')} (or gpus, to give d = gpus / (t x p x cp))")
    if "global_batch_size" not in known:
        missing.append(_spelled("global_batch_size"))
    if "measured_iter_time_s" not in known and "measured_tflops_per_gpu" not in known:
        missing.append(f"{_spelled('measured_iter_time_s')} (or measured_tflops_per_gpu)")
    if "gpu" not in known and "cluster" not in known and "cluster" not in defaults:
        missing.append(f"{_spelled('gpu')} (or cluster, or a default cluster such as --cluster)")
    if missing:
        raise ConfigError("missing columns", "; ".join(missing), "a file of runs needs each (any one spelling)",
                          source=source)


def _parse_defaults(defaults: Mapping[str, Any] | None, source: str) -> dict[str, Any]:
    """``defaults`` (any column spelling; text or typed values) read like cells."""
    out: dict[str, Any] = {}
    for key, value in (defaults or {}).items():
        name = _SPELLING.get(_normal(str(key)), str(key))
        if name not in COLUMNS or name in _NOT_DEFAULTS:
            valid = [n for n in COLUMNS if n not in _NOT_DEFAULTS]
            raise ConfigError(f"defaults.{key}", value, f"not a column with a default; valid: {', '.join(valid)}",
                              source=source)
        if value is None:
            continue
        if isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, os.PathLike):
            text = os.fspath(value)
        else:
            text = str(value)
        if not text.strip():
            continue
        try:
            out[name] = COLUMNS[name][1](text)
        except ValueError as exc:
            raise ConfigError(f"default {name}", value, str(exc), source=source) from None
    return out


class _ClusterMatcher:
    """GPU model text -> cluster preset, by the GPU presets' aliases (read once)."""

    def __init__(self) -> None:
        self._by_gpu: dict[str, list[str]] | None = None
        self._cache: dict[str, ClusterSpec] = {}

    def gpu_of(self, text: str) -> str | None:
        """The GPU preset's name for ``text`` (``A100-SXM4-80GB``), or None when none matches."""
        from commscope.estimate.gpus import gpu_preset

        try:
            return gpu_preset(text).name
        except ConfigError:
            return None

    def clusters_by_gpu(self) -> dict[str, list[str]]:
        if self._by_gpu is None:
            from commscope.presets import cluster_preset, preset_names

            self._by_gpu = {}
            for name in preset_names("clusters"):
                gpu = self.gpu_of(cluster_preset(name).gpu)
                if gpu is not None:
                    self._by_gpu.setdefault(gpu, []).append(name)
        return self._by_gpu

    def cluster(self, name_or_path: str) -> ClusterSpec:
        if name_or_path not in self._cache:
            from commscope.spec.files import load_cluster

            self._cache[name_or_path] = load_cluster(name_or_path)
        return self._cache[name_or_path]


def _file_or_name(value: str, folder: Path) -> str:
    """``value`` as a file beside the CSV when it names one there, else as given (preset name or path)."""
    p = Path(value)
    if not p.is_absolute() and not p.exists() and (folder / p).is_file():
        return str(folder / p)
    return value


class _Row:
    """One data row being read: its cells by field, where they come from, and the notes they need."""

    def __init__(self, cells: list[str], known: Mapping[str, int], headers: Mapping[str, str],
                 defaults: Mapping[str, Any], where: str) -> None:
        self.raw = {name: cells[i] if i < len(cells) else "" for name, i in known.items()}
        self.headers = headers
        self.defaults = defaults
        self.where = where
        self.from_defaults: list[str] = []
        self.defaulted: set[str] = set()
        self.spec_defaults: list[str] = []

    def get(self, name: str) -> Any:
        """The cell's value, else the default's, else None (records which default was used)."""
        text = self.raw.get(name, "")
        if text.strip():
            try:
                return COLUMNS[name][1](text)
            except ValueError as exc:
                raise ConfigError(self.headers[name], text, str(exc), source=self.where) from None
        if name in self.defaults:
            self.defaulted.add(name)
            self.from_defaults.append(f"{name}={_show(self.defaults[name])}")
            return self.defaults[name]
        return None

    def error(self, name: str, value: Any, expected: str) -> ConfigError:
        """A ConfigError on column ``name`` of this row (``default name`` when the value came from the defaults)."""
        label = f"default {name}" if name in self.defaulted else self.headers.get(name, name)
        return ConfigError(label, value, expected, source=self.where)


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _model(row: _Row, label: str, folder: Path) -> tuple[ModelSpec, list[str]]:
    notes: list[str] = []
    shape = {name: row.get(name) for name in _SHAPE}
    given = {name: value for name in _MODEL_FIELDS if (value := row.get(name)) is not None}
    model_text = row.get("model")
    if all(v is not None for v in shape.values()):
        kwargs = {"name": model_text or label, **shape, **given}
        try:
            model = ModelSpec(**kwargs)
        except ConfigError as exc:
            raise _at(exc, row.where, row.headers) from None
        spec_defaults = {"ffn_hidden_size": "4h", "num_query_groups": "heads (no GQA)",
                         "vocab_size": model.vocab_size, "seq_len": model.seq_len, "dtype": model.dtype,
                         "position_embedding": model.position_embedding, "tied_embeddings": model.tied_embeddings,
                         "gated_mlp": model.gated_mlp, "normalization": model.normalization}
        row.spec_defaults += [f"{k}={_show(v)}" for k, v in spec_defaults.items() if k not in given]
        return model, notes
    if not model_text:
        lacking = [row.headers.get(n, _spelled(n)) for n, v in shape.items() if v is None]
        first = next(n for n, v in shape.items() if v is None)
        raise row.error(first, "", f"blank: give {', '.join(lacking)}, or a model preset or model file in the model "
                                   f"column")
    from commscope.spec.files import load_model

    try:
        model = load_model(_file_or_name(model_text, folder))
    except ConfigError as exc:
        blank = ", ".join(row.headers.get(n, n) for n, v in shape.items() if v is None)
        raise row.error("model", model_text, f"{exc.expected} (the shape columns {blank} are blank or absent, so "
                                              f"model must name a model preset or a model file)") from None
    overrides = {**{k: v for k, v in shape.items() if v is not None}, **given}
    try:
        model = replace(model, **overrides) if overrides else model
    except ConfigError as exc:
        raise _at(exc, row.where, row.headers) from None
    changed = ", ".join(f"{k}={_show(v)}" for k, v in overrides.items())
    notes.append(f"model shape from {model_text!r}" + (f", with {changed}" if overrides else ""))
    return model, notes


def _parallel(row: _Row) -> ParallelSpec:
    values = {name: value for name in _PARALLEL_FIELDS if (value := row.get(name)) is not None}
    gpus = row.get("gpus")
    tp, pp, cp = values.get("tp", 1), values.get("pp", 1), values.get("cp", 1)
    if "dp" not in values:
        if gpus is None:
            raise row.error("dp" if "dp" in row.headers else "gpus", "",
                            f"blank: give {row.headers.get('dp', 'd')} or gpus (d = gpus / (t x p x cp))")
        if gpus % (tp * pp * cp):
            raise row.error("gpus", gpus, f"must be a multiple of t x p x cp = {tp} x {pp} x {cp} = {tp * pp * cp} "
                                          f"(d = gpus / (t x p x cp))")
        values["dp"] = gpus // (tp * pp * cp)
        row.spec_defaults.append(f"dp={values['dp']} (gpus / (t x p x cp))")
    world = tp * pp * values["dp"] * cp
    if gpus is not None and gpus != world:
        raise row.error("gpus", gpus, f"does not match t x p x d x cp = {tp} x {pp} x {values['dp']} x {cp} = {world}")
    if "global_batch_size" not in values:
        raise row.error("global_batch_size", "", "blank: give the sequences per iteration")
    try:
        parallel = ParallelSpec(**values)
    except ConfigError as exc:
        raise _at(exc, row.where, row.headers) from None
    row.spec_defaults += [f"{name}={_show(getattr(parallel, name))}" for name in _PARALLEL_FIELDS
                          if name not in values and name != "dp"]
    return parallel


def _cluster(row: _Row, matcher: _ClusterMatcher, folder: Path) -> tuple[ClusterSpec, list[str]]:
    cluster_text = row.get("cluster")
    gpu_text = row.get("gpu")
    if cluster_text:
        try:
            cluster = matcher.cluster(_file_or_name(cluster_text, folder))
        except ConfigError as exc:
            raise row.error("cluster", cluster_text, exc.expected) from None
        how = f"cluster {cluster.name}"
        if gpu_text:
            ran_on, has = matcher.gpu_of(gpu_text), matcher.gpu_of(cluster.gpu)
            if ran_on is not None and has is not None and ran_on != has:
                raise row.error("gpu", gpu_text, f"is {ran_on} but cluster {cluster.name!r} has {cluster.gpu}; give a "
                                                 f"cluster with this GPU, or none to match one from the gpu column")
    elif gpu_text:
        gpu = matcher.gpu_of(gpu_text)
        names = matcher.clusters_by_gpu().get(gpu or "", [])
        if not names:
            known = ", ".join(f"{g} -> {', '.join(c)}" for g, c in sorted(matcher.clusters_by_gpu().items()))
            raise row.error("gpu", gpu_text, f"matches no cluster preset's GPU (known: {known}); give a cluster "
                                             f"column or a default cluster (--cluster) with a preset or a cluster file")
        cluster = matcher.cluster(names[0])
        how = f"cluster {cluster.name} (gpu {gpu_text!r} is {gpu})"
        if len(names) > 1:
            how += f"; also {', '.join(names[1:])} have that GPU"
    else:
        raise row.error("gpu" if "gpu" in row.headers else "cluster", "",
                        "blank: give the GPU (a100, h100, v100, rtx3090, ...) or a cluster preset or file")
    changes: dict[str, Any] = {}
    gpn = row.get("gpus_per_node")
    if gpn is not None:
        changes["gpus_per_node"] = gpn
    for tier, key in (("intra_node", "intra_node_GBps"), ("inter_node", "inter_node_GBps")):
        rate = row.get(key)
        if rate is not None:
            link = getattr(cluster, tier)
            changes[tier] = replace(link, bandwidth_bytes_per_s=rate * GB, source=f"{key} = {rate:g} (runs file)")
    try:
        cluster = replace(cluster, **changes) if changes else cluster
    except ConfigError as exc:
        raise _at(exc, row.where, row.headers) from None
    intra, inter = cluster.intra_node.bandwidth_bytes_per_s / GB, cluster.inter_node.bandwidth_bytes_per_s / GB
    links = f"{cluster.gpus_per_node} GPUs per node; intra-node {intra:g} GB/s, inter-node {inter:g} GB/s per GPU"
    return cluster, [f"{how}: {links}"]


def _measured(row: _Row, model: ModelSpec, parallel: ParallelSpec) -> tuple[float, float | None, list[str]]:
    from commscope.estimate.flops import iteration_flops

    time_s = row.get("measured_iter_time_s")
    tflops = row.get("measured_tflops_per_gpu")
    if time_s is None and tflops is None:
        name = "measured_iter_time_s" if "measured_iter_time_s" in row.headers else "measured_tflops_per_gpu"
        raise row.error(name, "", "blank: give the measured seconds per iteration (measured_iter_time_s) or TFLOP/s "
                                  "per GPU (measured_tflops_per_gpu)")
    if tflops is None:
        return time_s, None, []
    tokens = parallel.global_batch_size * model.seq_len
    flop = iteration_flops(model, tokens, recompute=parallel.recompute)["hardware"]
    implied_s = flop / (tflops * TFLOP * parallel.world_size)
    if time_s is not None:
        if abs(implied_s / time_s - 1) <= 0.02:
            return time_s, tflops, []
        note = (f"measured_tflops_per_gpu={tflops:g} implies {implied_s:.4g} s by Megatron's hardware FLOPs "
                f"(recompute={parallel.recompute}), {implied_s / time_s - 1:+.1%} from the measured time, which is "
                "used; the file may count FLOPs another way")
        return time_s, tflops, [note]
    kind = {"none": "recompute=none, so the model FLOPs: 3 x forward",
            "selective": "recompute=selective: 3 x forward + the recomputed attention core",
            "full": "recompute=full: 3 x forward + the recomputed forward"}[parallel.recompute]
    note = (f"measured time {implied_s:.4g} s derived from measured_tflops_per_gpu={tflops:g}: Megatron's hardware "
            f"FLOPs of the iteration ({kind}; commscope.estimate.flops.iteration_flops) {flop:.4g} / ({tflops:g} TFLOP/s x "
            f"{parallel.world_size} GPUs)")
    return implied_s, tflops, [note]


def _plausible(row: _Row, model: ModelSpec, parallel: ParallelSpec, cluster: ClusterSpec, time_s: float,
               tflops: float | None) -> list[str]:
    """Refuse a measurement no GPU could make: the iteration's model FLOPs (3 x forward, the least the run computed)
    over the measured time faster than the GPUs' peak. Note, without refusing, a run that commscope's memory model
    says does not fit (the run existed, so the memory model or the row's recompute/ZeRO columns are off)."""
    from commscope.estimate.flops import iteration_flops
    from commscope.estimate.memory import memory_per_gpu

    flop = iteration_flops(model, parallel.global_batch_size * model.seq_len, recompute=parallel.recompute)["model"]
    peak_key = "fp8" if parallel.fp8_format is not None and "fp8" in cluster.peak_flops else model.dtype
    peak = cluster.peak_flops_for(peak_key)
    achieved = flop / (time_s * parallel.world_size)
    if achieved > peak:
        name = "measured_iter_time_s" if tflops is None else "measured_tflops_per_gpu"
        value = time_s if tflops is None else tflops
        raise row.error(name, value, f"implies {achieved / TFLOP:,.0f} TFLOP/s of model FLOPs per GPU, above the "
                                     f"{cluster.gpu}'s {peak / TFLOP:,.0f} TFLOP/s {peak_key} peak: no run computes faster "
                                     "than its GPUs (seconds per iteration? the global batch and sequence length?)")
    notes = []
    need = memory_per_gpu(model, parallel).total_bytes
    if need > cluster.memory_bytes:
        notes.append(f"commscope's memory model gives {need / 2**30:.1f} GiB per GPU, more than the "
                     f"{cluster.memory_bytes / 2**30:.0f} GiB of {cluster.gpu}: the run's recompute, ZeRO or "
                     "distributed-optimizer columns may be missing")
    return notes


def read_runs(path: str | os.PathLike[str], defaults: Mapping[str, Any] | None = None) -> tuple[Run, ...]:
    """The measured runs of a CSV file (see :mod:`commscope.estimate.validate` for its columns).

    ``defaults`` fill blank cells and absent columns (a cell's value wins): keys are column names in any
    spelling (``recompute``, ``micro_batch_size``, ``cluster``, ``intra_node_GBps``), values text or typed.
    Raises :class:`~commscope.errors.ConfigError` naming the file, row, case, column and value of anything bad.
    """
    p = Path(path)
    source = os.fspath(path)
    text = _read_text(p)
    records = [(line, cells) for line, cells in _records(text, source) if any(c.strip() for c in cells)]
    if not records:
        raise ConfigError("path", source, "is empty; expected a header line and one row per measured run")
    parsed_defaults = _parse_defaults(defaults, source)
    header_line, header_cells = records[0]
    known, headers, other = _header(header_cells, f"{source} line {header_line}")
    if len(records) == 1:
        raise ConfigError("path", source, "has a header but no data rows; expected one row per measured run")
    _check_columns(known, parsed_defaults, f"{source} line {header_line}")
    matcher = _ClusterMatcher()
    folder = p.parent
    runs = []
    for n, (line, cells) in enumerate(records[1:], start=1):
        case_text = cells[known["case_id"]].strip() if "case_id" in known and known["case_id"] < len(cells) else ""
        where = f"{source} row {n} (line {line}" + (f", case {case_text!r})" if case_text else ")")
        if len(cells) > len(header_cells) and any(c.strip() for c in cells[len(header_cells):]):
            raise ConfigError("cells", len(cells), f"the row has more cells than the header's {len(header_cells)} "
                                                   "columns (a comma inside an unquoted value?)", source=where)
        row = _Row(cells, known, headers, parsed_defaults, where)
        case_id = case_text or f"row {n}"
        model, model_notes = _model(row, case_id, folder)
        parallel = _parallel(row)
        cluster, cluster_notes = _cluster(row, matcher, folder)
        from commscope.pattern.workload.dense import check_job

        try:
            check_job(model, parallel)
        except ConfigError as exc:
            raise _at(exc, where, headers) from None
        time_s, tflops, time_notes = _measured(row, model, parallel)
        time_notes += _plausible(row, model, parallel, cluster, time_s, tflops)
        notes = model_notes + cluster_notes
        if row.from_defaults:
            notes.append(f"from the defaults given: {', '.join(row.from_defaults)}")
        if row.spec_defaults:
            notes.append(f"blank or absent, so commscope's defaults: {', '.join(row.spec_defaults)}")
        notes += time_notes
        extra = {header: cells[i] if i < len(cells) else "" for i, header in other}
        runs.append(Run(case_id=case_id, model=model, parallel=parallel, cluster=cluster,
                        measured_iteration_time_s=time_s, measured_tflops_per_gpu=tflops, notes=tuple(notes),
                        extra=extra, where=where, defaults_used=frozenset(row.defaulted)))
    return tuple(runs)
