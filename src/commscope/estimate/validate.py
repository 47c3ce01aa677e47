"""Check the model against measured runs: a CSV of training runs -> predicted vs measured iteration time.

A user's cluster logs iteration times (or TFLOP/s per GPU) for a few jobs; :func:`read_runs` turns each row of
such a CSV into the specs commscope predicts from, and :func:`validate` predicts each run with
:func:`commscope.api.predict` and :func:`commscope.estimate.estimate` and reports the error
``predicted / measured - 1`` per run, its mean absolute value and the worst run.

The file, one run per row; column names in either spelling of each group, case ignored (``-`` and spaces read
as ``_``)::

    case_id|name|run          a label (default: "row N")
    model                     a label, or a model preset / model file when the shape columns are blank
    layers|num_layers, hidden|hidden_size, heads|num_heads|num_attention_heads      the shape
    ffn_hidden|ffn_hidden_size (4h), num_query_groups (heads), vocab|vocab_size (50257), seq_len|seq_length
    t|tp, p|pp, d|dp, cp, ep  parallel sizes (1 when blank; d may come from gpus)
    gpus                      checked to equal t x p x d x cp, or gives d when that is blank
    global_batch|global_batch_size, microbatch|micro_batch_size (1), virtual_pp|virtual_pipeline_size (1)
    recompute                 yes.../full -> full, selective, no/none/blank -> none
    seq_parallel|sequence_parallel, dist_optimizer|distributed_optimizer, tp_comm_overlap,
    overlap_grad_reduce, overlap_param_gather, overlap_p2p_comm, scatter_gather_tensors_in_pipeline,
    gradient_accumulation_fusion, tied_embeddings, gated_mlp                    yes/no/true/false/1/0
    gpu|gpu_type              GPU model text, matched to a cluster preset (a100 -> dgx-a100, h100 -> dgx-h100,
                              v100 -> dgx1-v100, rtx3090 -> rtx3090-pcie) by the aliases of commscope.estimate.gpus
    cluster                   a cluster preset or cluster file (wins over gpu); gpus_per_node overrides it
    intra_node_GBps, inter_node_GBps      link tier bandwidths, GB/s per GPU (override the cluster's)
    dtype (bf16), attention (flash|unfused), fp8_format, framework, position_embedding, normalization
    stack                     a software stack preset (`commscope presets`: megatron-core-2024, megatron-deepspeed)
    grad_reduce_dtype (fp32 for bf16 models), zero_stage, schedule, order, grad_bucket_size, pipeline_layers
                              (7;8;8;7), decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers:
                              every other knob the estimate has
    head_dim, bias, make_vocab_size_divisible_by, num_experts, top_k, moe_layer_freq, moe_ffn_hidden_size,
    num_shared_experts, first_k_dense_layers, capacity_factor      the rest of the model's shape
    measured_iter_time_s|iteration_time_s      the measurement, seconds per iteration; or, when blank,
    measured_tflops_per_gpu   time = the iteration's hardware FLOPs (Megatron's count, recomputation
                              included: :func:`commscope.estimate.flops.iteration_flops`) / (TFLOP/s x GPUs)

Other columns (source, notes, status, mfu, ...) are kept as text in :attr:`Run.extra` and named (the command
says which columns it did not read, so that a misspelt knob is never silently ignored). A blank cell means "the
default": ``defaults`` (a command's flags) first, then the spec's own default; every such assumption is stated
in :attr:`Run.notes`. Every bad cell raises :class:`~commscope.errors.ConfigError` naming the file, the row
(1-based data row and line), the case, the column, the value and what would be valid:
``runs.csv row 3 (line 4, case 'b'): t='two': expected a positive integer``.

Worked example: the H100 row ``mlm_h100_weak_1.7B`` of Megatron-LM's weak-scaling table (t=1, p=1, d=48,
global batch 192 x 4096 tokens, 408.8 TFLOP/s per GPU) measures 0.452 s; 72 B s l h^2 (1 + s/6h + V/12lh) =
8.87e15 FLOP over 48 GPUs at 408.8 TFLOP/s gives the same 0.452 s.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import (
    ATTENTION_BACKENDS,
    ATTENTION_KINDS,
    FP8_FORMATS,
    FRAMEWORKS,
    ParallelSpec,
)
from commscope.units import GB, TFLOP, canonical_dtype

__all__ = ["COLUMNS", "TERMS", "Run", "Validation", "ValidationRow", "read_runs", "validate"]


# ---------------------------------------------------------------------------------------------------------
# Cells
# ---------------------------------------------------------------------------------------------------------

_TRUE = ("yes", "y", "true", "1")
_FALSE = ("no", "n", "false", "0")


def _text(text: str) -> str:
    return text.strip()


def _positive_int(text: str) -> int:
    t = text.strip()
    try:
        value = int(t)
    except ValueError:
        try:
            number = float(t)
        except ValueError:
            raise ValueError("expected a positive integer") from None
        if not number.is_integer():
            raise ValueError("expected a positive integer") from None
        value = int(number)
    if value < 1:
        raise ValueError("must be a positive integer")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a positive number") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError("must be a positive number")
    return value


def _bool(text: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise ValueError("expected yes, no, true, false, 1, 0 or blank")


def _recompute(text: str) -> str:
    """``yes (use_checkpoint=true)``/``full`` -> full, ``selective``, ``no``/``none`` -> none."""
    word = re.match(r"[a-z0-9]*", text.strip().lower()).group(0)  # type: ignore[union-attr]
    if word in ("yes", "full", "true", "1"):
        return "full"
    if word == "selective":
        return "selective"
    if word in ("no", "none", "false", "0"):
        return "none"
    raise ValueError("valid: full (or yes...), selective, none (or no, blank)")


def _dtype(text: str) -> str:
    try:
        return canonical_dtype(text)
    except ValueError as exc:
        raise ValueError(str(exc).split("; ", 1)[-1]) from None


def _attention(text: str) -> str:
    """Megatron-core's --attention-backend spellings to commscope's two attention kinds."""
    kinds = ATTENTION_BACKENDS
    key = text.strip().lower()
    if key not in kinds:
        raise ValueError(f"valid: {', '.join(kinds)} ({', '.join(ATTENTION_KINDS)})")
    return kinds[key]


def _fp8_format(text: str) -> str | None:
    key = text.strip().lower()
    if key in ("none", "no", "false", "0"):
        return None
    if key not in FP8_FORMATS:
        raise ValueError(f"valid: {', '.join(FP8_FORMATS)}, none or blank")
    return key


def _int_list(text: str) -> tuple[int, ...]:
    """``7 8 8 7``, ``7;8;8;7`` or a quoted ``7,8,8,7``: layers per pipeline stage."""
    parts = [p for p in re.split(r"[\s,;]+", text.strip()) if p]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError("expected whole numbers of layers per stage, e.g. 7;8;8;7") from None
    if not values or min(values) < 1:
        raise ValueError("expected positive numbers of layers per stage, e.g. 7;8;8;7")
    return values


def _stack(text: str) -> str:
    from commscope.estimate.stacks import stack_names

    key = text.strip().lower()
    if key not in stack_names():
        raise ValueError(f"valid: {', '.join(stack_names())}")
    return key


def _zero_stage(text: str) -> int:
    value = _positive_int(text) if text.strip() != "0" else 0
    if value > 3:
        raise ValueError("valid: 0, 1, 2, 3")
    return value


def _choice(valid: tuple[str, ...]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        key = text.strip().lower()
        if key not in valid:
            raise ValueError(f"valid: {', '.join(valid)}")
        return key

    return parse


#: Every column :func:`read_runs` knows: the field it fills -> (its spellings, how a cell is read).
#: Spellings are lower case, with ``_`` for any run of spaces and dashes.
COLUMNS: dict[str, tuple[tuple[str, ...], Callable[[str], Any]]] = {
    "case_id": (("case_id", "name", "run"), _text),
    "model": (("model",), _text),
    "num_layers": (("layers", "num_layers"), _positive_int),
    "hidden_size": (("hidden", "hidden_size"), _positive_int),
    "num_heads": (("heads", "num_heads", "num_attention_heads"), _positive_int),
    "ffn_hidden_size": (("ffn_hidden", "ffn_hidden_size"), _positive_int),
    "num_query_groups": (("num_query_groups",), _positive_int),
    "vocab_size": (("vocab", "vocab_size"), _positive_int),
    "seq_len": (("seq_len", "seq_length"), _positive_int),
    "dtype": (("dtype",), _dtype),
    "position_embedding": (("position_embedding", "position_embedding_type"), _choice(("learned", "rope", "none"))),
    "tied_embeddings": (("tied_embeddings",), _bool),
    "gated_mlp": (("gated_mlp",), _bool),
    "normalization": (("normalization",), _choice(("layernorm", "rmsnorm"))),
    "tp": (("t", "tp", "tensor_model_parallel_size"), _positive_int),
    "pp": (("p", "pp", "pipeline_model_parallel_size"), _positive_int),
    "dp": (("d", "dp", "data_parallel_size"), _positive_int),
    "cp": (("cp", "context_parallel_size"), _positive_int),
    "ep": (("ep", "expert_model_parallel_size"), _positive_int),
    "gpus": (("gpus", "num_gpus"), _positive_int),
    "global_batch_size": (("global_batch", "global_batch_size"), _positive_int),
    "micro_batch_size": (("microbatch", "micro_batch_size"), _positive_int),
    "virtual_pipeline_size": (("virtual_pp", "virtual_pipeline_size"), _positive_int),
    "recompute": (("recompute", "recompute_granularity"), _recompute),
    "sequence_parallel": (("seq_parallel", "sequence_parallel"), _bool),
    "distributed_optimizer": (("dist_optimizer", "distributed_optimizer", "use_distributed_optimizer"), _bool),
    "attention": (("attention", "attention_backend"), _attention),
    "fp8_format": (("fp8_format",), _fp8_format),
    "tp_comm_overlap": (("tp_comm_overlap",), _bool),
    "overlap_grad_reduce": (("overlap_grad_reduce",), _bool),
    "overlap_param_gather": (("overlap_param_gather",), _bool),
    "overlap_p2p_comm": (("overlap_p2p_comm", "overlap_p2p_communication"), _bool),
    "scatter_gather_tensors_in_pipeline": (("scatter_gather_tensors_in_pipeline", "scatter_gather"), _bool),
    "gradient_accumulation_fusion": (("gradient_accumulation_fusion",), _bool),
    "framework": (("framework",), _choice(FRAMEWORKS)),
    "stack": (("stack", "software_stack"), _stack),
    "grad_reduce_dtype": (("grad_reduce_dtype", "grad_reduce_in", "gradient_reduce_dtype"),
                          _choice(("fp32", "bf16", "fp16", "fp8"))),
    "zero_stage": (("zero_stage",), _zero_stage),
    "schedule": (("schedule", "pipeline_schedule"), _choice(("1f1b", "interleaved", "gpipe"))),
    "order": (("order", "rank_order"), _text),
    "grad_bucket_size": (("grad_bucket_size", "ddp_bucket_size"), _positive_int),
    "pipeline_layers": (("pipeline_layers",), _int_list),
    "decoder_first_pipeline_num_layers": (("decoder_first_pipeline_num_layers",), _positive_int),
    "decoder_last_pipeline_num_layers": (("decoder_last_pipeline_num_layers",), _positive_int),
    "head_dim": (("head_dim", "kv_channels"), _positive_int),
    "bias": (("bias", "add_bias_linear"), _bool),
    "make_vocab_size_divisible_by": (("make_vocab_size_divisible_by",), _positive_int),
    "num_experts": (("num_experts",), _positive_int),
    "top_k": (("top_k", "moe_router_topk"), _positive_int),
    "moe_layer_freq": (("moe_layer_freq",), _positive_int),
    "moe_ffn_hidden_size": (("moe_ffn_hidden_size",), _positive_int),
    "num_shared_experts": (("num_shared_experts",), _positive_int),
    "first_k_dense_layers": (("first_k_dense_layers",), _positive_int),
    "capacity_factor": (("capacity_factor", "moe_expert_capacity_factor"), _positive_float),
    "gpu": (("gpu", "gpu_type"), _text),
    "cluster": (("cluster",), _text),
    "gpus_per_node": (("gpus_per_node",), _positive_int),
    "intra_node_GBps": (("intra_node_gbps",), _positive_float),
    "inter_node_GBps": (("inter_node_gbps",), _positive_float),
    "measured_iter_time_s": (("measured_iter_time_s", "iteration_time_s"), _positive_float),
    "measured_tflops_per_gpu": (("measured_tflops_per_gpu",), _positive_float),
}
_SPELLING = {spelling: name for name, (spellings, _) in COLUMNS.items() for spelling in spellings}
_SHAPE = ("num_layers", "hidden_size", "num_heads")
_MODEL_FIELDS = ("ffn_hidden_size", "num_query_groups", "vocab_size", "seq_len", "dtype", "position_embedding",
                 "tied_embeddings", "gated_mlp", "normalization", "head_dim", "bias", "make_vocab_size_divisible_by",
                 "num_experts", "top_k", "moe_layer_freq", "moe_ffn_hidden_size", "num_shared_experts",
                 "first_k_dense_layers", "capacity_factor")
_PARALLEL_FIELDS = ("tp", "pp", "dp", "cp", "ep", "global_batch_size", "micro_batch_size", "virtual_pipeline_size",
                    "recompute", "sequence_parallel", "distributed_optimizer", "attention", "fp8_format",
                    "tp_comm_overlap", "overlap_grad_reduce", "overlap_param_gather", "overlap_p2p_comm",
                    "scatter_gather_tensors_in_pipeline", "gradient_accumulation_fusion", "framework", "stack",
                    "grad_reduce_dtype", "zero_stage", "schedule", "order", "grad_bucket_size", "pipeline_layers",
                    "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers")
_NOT_DEFAULTS = ("case_id", "measured_iter_time_s", "measured_tflops_per_gpu")


def _spelled(name: str) -> str:
    """``tp`` -> ``t|tp|tensor_model_parallel_size``: the spellings of a column, for messages."""
    return "|".join(COLUMNS[name][0])


def _normal(header: str) -> str:
    return re.sub(r"[\s\-]+", "_", header.strip().lower())


# ---------------------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------------------


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
    """The measured runs of a CSV file (see the module docstring for its columns).

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


# ---------------------------------------------------------------------------------------------------------
# Predicted against measured
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidationRow:
    """One run: measured and predicted seconds per iteration, and the prediction's terms (exposed seconds)."""

    case_id: str
    model: str
    cluster: str
    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    measured_s: float
    predicted_s: float
    error: float
    """predicted / measured - 1: +0.10 is a prediction 10% too slow."""
    compute_s: float
    tp_s: float
    pp_s: float
    dp_s: float
    cp_s: float
    ep_s: float
    emb_s: float
    bubble_s: float
    optimizer_s: float
    hidden_s: dict[str, float] = field(default_factory=dict)
    """Communication per axis hidden under compute (not in the terms)."""
    notes: tuple[str, ...] = ()
    """The run's assumptions, then the estimate's notes."""

    @property
    def abs_error(self) -> float:
        return abs(self.error)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        d["abs_error"] = self.abs_error
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    """Predicted against measured over a set of runs."""

    rows: tuple[ValidationRow, ...]
    mean_abs_error: float
    """Mean of |predicted / measured - 1|."""
    worst_abs_error: float
    worst_case: str
    """case_id of the run with the largest |error|."""

    @property
    def mean_error(self) -> float:
        """Mean signed error: > 0 when the model predicts too slow on average."""
        return sum(r.error for r in self.rows) / len(self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {"num_runs": len(self.rows), "mean_abs_error": self.mean_abs_error, "mean_error": self.mean_error,
                "worst_abs_error": self.worst_abs_error, "worst_case": self.worst_case,
                "rows": [r.to_dict() for r in self.rows]}


def _bandwidth_for(bandwidth: Any, cluster: ClusterSpec) -> Any:
    """A bandwidth model for one run: a file read with the run's cluster as fallback, a model as is, or None."""
    if bandwidth is None:
        return None
    if isinstance(bandwidth, (str, os.PathLike)):
        from commscope.estimate.bandwidth import AlphaBeta
        from commscope.io.bandwidth_file import read_bandwidth

        return read_bandwidth(Path(bandwidth), fallback=AlphaBeta(cluster))
    return bandwidth


def validate(runs: Iterable[Run], *, bandwidth: Any = None) -> Validation:
    """Predict every run (:func:`commscope.api.predict`, then :func:`commscope.estimate.estimate`) and compare.

    ``bandwidth``: None (each cluster's alpha-beta model), a measured table or fit file (read once per run with
    that run's cluster as the fallback for ops it lacks, as ``commscope estimate --bandwidth`` does), or a
    bandwidth model used as is.
    """
    from commscope.api import predict
    from commscope.estimate.iteration import estimate

    rows = []
    for run in runs:
        try:
            prediction = predict(run.model, run.parallel, run.cluster)
            est = estimate(prediction, bandwidth=_bandwidth_for(bandwidth, run.cluster))
        except ConfigError as exc:
            raise _at(exc, run.where or run.case_id) from None
        measured = run.measured_iteration_time_s
        par = run.parallel
        rows.append(ValidationRow(
            case_id=run.case_id, model=run.model.name, cluster=run.cluster.name, tp=par.tp, pp=par.pp, dp=par.dp,
            cp=par.cp, ep=par.ep, measured_s=measured, predicted_s=est.iteration_time_s,
            error=est.iteration_time_s / measured - 1, compute_s=est.compute_s, tp_s=est.tp_s, pp_s=est.pp_s,
            dp_s=est.dp_s, cp_s=est.cp_s, ep_s=est.ep_s, emb_s=est.emb_s, bubble_s=est.bubble_s,
            optimizer_s=est.optimizer_s, hidden_s=dict(est.hidden_s), notes=run.notes + tuple(est.notes)))
    if not rows:
        raise ConfigError("runs", 0, "no runs to validate")
    worst = max(rows, key=lambda r: r.abs_error)
    return Validation(rows=tuple(rows), mean_abs_error=sum(r.abs_error for r in rows) / len(rows),
                      worst_abs_error=worst.abs_error, worst_case=worst.case_id)


#: The terms of a row, in the order a table shows them: (field, short label).
TERMS: tuple[tuple[str, str], ...] = (("compute_s", "compute"), ("tp_s", "tp"), ("pp_s", "pp"), ("dp_s", "dp"),
                                      ("cp_s", "cp"), ("ep_s", "ep"), ("emb_s", "emb"), ("bubble_s", "bubble"),
                                      ("optimizer_s", "optim"))
