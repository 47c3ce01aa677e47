"""Reading and writing specs as files: TOML, JSON and (with ``commscope[yaml]``) YAML.

A spec file is a flat mapping whose keys are the dataclass's field names, plus an optional ``[meta]``
table (``description``, ``source``) that the spec ignores. Cluster files give quantities in human units
with the unit in the key's name, converted to SI on reading (see :data:`CLUSTER_UNIT_KEYS`):

    gpu = "A100-SXM4-80GB"
    memory_GiB = 80                 # -> memory_bytes = 80 * GiB
    memory_bandwidth_GBps = 2039    # -> memory_bandwidth_bytes_per_s = 2039 * GB
    [peak_tflops]                   # -> peak_flops = {"bf16": 312e12}
    bf16 = 312
    [intra_node]
    name = "NVLink3/NVSwitch"
    bandwidth_GBps = 230            # -> bandwidth_bytes_per_s = 230 * GB
    latency_us = 2.5                # -> latency_s = 2.5e-6

The SI names (``memory_bytes``, ``bandwidth_bytes_per_s``, ``latency_s``, ``peak_flops``) are accepted
too. Every mistake in a file raises :class:`~commscope.errors.ConfigError` naming the file, the key and
what would be valid; nothing here lets a ``KeyError`` or ``TypeError`` escape.

The ``*_to_mapping`` functions invert the readers exactly: ``model_from_mapping(model_to_mapping(m)) == m``,
and so through :func:`write_mapping` and :func:`read_mapping` for TOML and JSON.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from commscope.errors import ConfigError
from commscope.spec.cluster import ClusterSpec, LinkTier, implausible_link
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.units import GB, GiB, TFLOP, canonical_dtype

__all__ = [
    "CLUSTER_UNIT_KEYS",
    "FILE_SUFFIXES",
    "cluster_from_mapping",
    "cluster_preset",
    "cluster_to_mapping",
    "dumps_toml",
    "is_hf_config",
    "load_cluster",
    "load_model",
    "load_parallel",
    "model_from_mapping",
    "model_preset",
    "model_to_mapping",
    "parallel_from_mapping",
    "parallel_to_mapping",
    "read_mapping",
    "read_preset",
    "write_mapping",
]

_Spec = TypeVar("_Spec")  # the spec class a mapping is read into

#: File suffixes :func:`read_mapping` understands.
FILE_SUFFIXES = (".toml", ".json", ".yaml", ".yml")

#: Keys of the optional table that describes a file and that the spec ignores.
META_KEY = "meta"

_US_PER_S = 1_000_000  # microseconds per second; dividing by it rounds correctly, multiplying by units.US may not

#: Human-unit keys of a cluster file: key -> (SI field, multiplier to SI).
CLUSTER_UNIT_KEYS: dict[str, tuple[str, float]] = {
    "memory_GiB": ("memory_bytes", GiB),
    "memory_bandwidth_GBps": ("memory_bandwidth_bytes_per_s", GB),
    "peak_tflops": ("peak_flops", TFLOP),
}

#: Human-unit keys of a link tier table: key -> (SI field, multiplier to SI; latency is divided instead).
LINK_UNIT_KEYS: dict[str, tuple[str, float]] = {
    "bandwidth_GBps": ("bandwidth_bytes_per_s", GB),
    "latency_us": ("latency_s", 1 / _US_PER_S),
}

#: Hugging Face ``config.json`` keys that mark a mapping as one (checked by :func:`is_hf_config`).
HF_MARKER_KEYS = ("model_type", "architectures", "n_embd", "num_hidden_layers", "n_layer")


# ---------------------------------------------------------------------------------------------------------
# Reading files
# ---------------------------------------------------------------------------------------------------------


def read_mapping(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a ``.toml``, ``.json``, ``.yaml`` or ``.yml`` file whose top level is a mapping.

    Raises :class:`ConfigError` (field ``path``) for a missing file, an unknown suffix, a malformed file
    (the message names the file and, where the parser gives it, the line) or a top level that is not a
    mapping. YAML needs PyYAML: ``pip install 'commscope[yaml]'``.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if p.is_dir():
        raise ConfigError("path", str(p), f"is a directory; give a {', '.join(FILE_SUFFIXES)} file")
    if suffix not in FILE_SUFFIXES:
        raise ConfigError("path", str(p), f"unknown file type {suffix or '(none)'!r}; valid: {', '.join(FILE_SUFFIXES)}")
    if not p.is_file():
        raise ConfigError("path", str(p), "is a directory; give a file" if p.is_dir() else "no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("path", str(p), f"cannot read the file: {exc}") from None
    return parse_mapping(text, suffix.lstrip("."), source=str(p))


def parse_mapping(text: str, fmt: str, *, source: str) -> dict[str, Any]:
    """Parse ``text`` in format ``fmt`` (``toml``, ``json``, ``yaml``/``yml``); ``source`` names it in errors."""
    fmt = fmt.lower()
    if fmt == "toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            # The message ends with "(at line L, column C)".
            raise ConfigError("path", source, f"malformed TOML: {exc}") from None
    elif fmt == "json":
        try:
            data = json.loads(text, object_pairs_hook=_unique_keys(source))
        except json.JSONDecodeError as exc:
            raise ConfigError("path", source, f"malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    elif fmt in ("yaml", "yml"):
        try:
            import yaml  # type: ignore[import-untyped]
        except ImportError:
            raise ConfigError("path", source, "reading YAML needs PyYAML: pip install 'commscope[yaml]' (or use TOML or JSON)") from None
        try:
            data = yaml.load(text, Loader=_unique_key_yaml_loader(yaml, source))  # (a SafeLoader subclass)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ConfigError("path", source, f"malformed YAML{where}: {problem}") from None
    else:
        raise ConfigError("format", fmt, "valid: toml, json, yaml")
    if not isinstance(data, dict):
        raise ConfigError("path", source, f"the top level must be a mapping of keys to values, got {_type_name(data)}")
    return data


def _unique_keys(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """json's object_pairs_hook: a key given twice is refused (TOML refuses it too; JSON would keep the last)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise ConfigError("path", source, f"key {key!r} is given twice ({out[key]!r} and {value!r}); give it once")
            out[key] = value
        return out
    return pairs


def _unique_key_yaml_loader(yaml: Any, source: str) -> Any:
    """A SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last)."""
    class Loader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML has no type stubs here
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ConfigError("path", source, f"key {key!r} is given twice (lines {seen[key]} and "
                                                      f"{key_node.start_mark.line + 1}); give it once")
                seen[key] = key_node.start_mark.line + 1
            return super().construct_mapping(node, deep=deep)
    return Loader


def is_hf_config(d: Mapping[str, Any]) -> bool:
    """Whether ``d`` looks like a Hugging Face ``config.json`` (``model_type``, ``architectures``, ``n_embd``, ...)."""
    return any(key in d for key in HF_MARKER_KEYS)


# ---------------------------------------------------------------------------------------------------------
# Type checking of values read from files
# ---------------------------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table", type(None): "null"}.get(type(value), type(value).__name__)


def _expected(tp: Any) -> str:
    """How to say what ``tp`` wants, for an error message."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        parts = [_expected(a) for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(parts) + (" (or leave the key out)" if type(None) in typing.get_args(tp) else "")
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin is tuple:
        return "a list of integers"
    if origin is dict:
        return "a table of dtype = number"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, str(tp))


def _coerce(field: str, value: Any, tp: Any, source: str | None) -> Any:
    """Check ``value`` against the type hint ``tp`` and convert it (int -> float, list -> tuple)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(field, value, arg, source)
            except ConfigError:
                continue
        raise ConfigError(field, value, f"expected {_expected(tp)}, got {_type_name(value)}", source=source)
    if origin is Literal:
        if value in typing.get_args(tp) and isinstance(value, str):
            return value
        raise ConfigError(field, value, f"expected {_expected(tp)}", source=source)
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
            return tuple(value)
        raise ConfigError(field, value, f"expected {_expected(tp)}", source=source)
    if origin is dict:
        return _flops_table(field, value, 1.0, source)
    if tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            return float(value)
    elif tp is str:
        ok = isinstance(value, str)
    else:  # a type the readers do not know: let the dataclass validate it
        return value
    if not ok:
        raise ConfigError(field, value, f"expected {_expected(tp)}, got {_type_name(value)}", source=source)
    return value


def _number(field: str, value: Any, source: str | None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, value, f"expected a number, got {_type_name(value)}", source=source)
    return value


def _flops_table(field: str, value: Any, scale: float, source: str | None) -> dict[str, float]:
    """``{dtype: number}`` with canonical dtype names, each number times ``scale``."""
    if not isinstance(value, Mapping):
        raise ConfigError(field, value, "expected a table of dtype = number, e.g. bf16 = 312", source=source)
    out: dict[str, float] = {}
    for dtype, number in value.items():
        try:
            key = canonical_dtype(dtype)
        except ValueError as exc:
            raise ConfigError(f"{field}.{dtype}", number, str(exc).split("; ", 1)[-1], source=source) from None
        out[key] = float(_number(f"{field}.{dtype}", number, source)) * scale
    return out


def _suggest(key: str, valid: list[str]) -> str:
    """``; did you mean 'x'?`` for the closest valid key (difflib, then a shared prefix or substring), or ``""``."""
    lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(key.lower(), list(lower), n=1)
    if not close and len(key) >= 3:
        close = [v for v in lower if v.startswith(key.lower()) or key.lower() in v][:1]
    return f"; did you mean {lower[close[0]]!r}?" if close else ""


def _unknown_key(key: str, value: Any, valid: list[str], what: str, source: str | None) -> ConfigError:
    hint = _suggest(key.rsplit(".", 1)[-1], valid)
    return ConfigError(key, value, f"unknown key in {what}; valid keys: {', '.join(valid)}{hint}", source=source)


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(cls))


def _required(cls: type) -> set[str]:
    return {f.name for f in _fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _build(cls: type[_Spec], kwargs: dict[str, Any], what: str, source: str | None) -> _Spec:
    """Construct ``cls(**kwargs)`` after checking required keys; add ``source`` to its ConfigErrors."""
    for name in sorted(_required(cls) - kwargs.keys()):
        raise ConfigError(name, None, f"required key missing from {what}; expected {_expected(_hints(cls)[name])}", source=source)
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        if exc.source is not None or source is None:
            raise
        raise ConfigError(exc.field, exc.value, exc.expected, source=source) from None


def _check_mapping(d: Any, what: str, source: str | None) -> Mapping[str, Any]:
    if not isinstance(d, Mapping):
        raise ConfigError(what, d, f"expected a mapping of keys to values, got {_type_name(d)}", source=source)
    return d


def _spec_from_mapping(cls: type[_Spec], d: Any, what: str, source: str | None, defaults: Mapping[str, Any]) -> _Spec:
    return _build(cls, {**defaults, **_spec_fields(cls, d, what, source)}, what, source)


def _spec_fields(cls: type, d: Any, what: str, source: str | None) -> dict[str, Any]:
    """The fields of ``cls`` that mapping ``d`` names, each checked and converted (``meta`` ignored)."""
    d = _check_mapping(d, what, source)
    hints = _hints(cls)
    names = [f.name for f in _fields(cls)]
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        if key == META_KEY:
            _check_mapping(value, META_KEY, source)
            continue
        if key not in hints:
            raise _unknown_key(str(key), value, names + [META_KEY], what, source)
        kwargs[key] = _coerce(key, value, hints[key], source)
    return kwargs


def parallel_fields(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The ParallelSpec fields a parallel file names, checked and converted, without the defaults of the
    fields it leaves out (the command line supplies those)."""
    return _spec_fields(ParallelSpec, read_mapping(path), "a parallel file", os.fspath(path))


# ---------------------------------------------------------------------------------------------------------
# Mappings -> specs
# ---------------------------------------------------------------------------------------------------------


def model_from_mapping(d: Mapping[str, Any], *, source: str | None = None, name: str | None = None) -> ModelSpec:
    """A :class:`ModelSpec` from a mapping of its field names (plus an ignored ``meta`` table).

    ``name`` is used when the mapping has no ``name`` key (a preset's or file's name).
    """
    return _spec_from_mapping(ModelSpec, d, "a model file", source, {"name": name} if name else {})


def parallel_from_mapping(d: Mapping[str, Any], *, source: str | None = None) -> ParallelSpec:
    """A :class:`ParallelSpec` from a mapping of its field names (plus an ignored ``meta`` table)."""
    return _spec_from_mapping(ParallelSpec, d, "a parallel file", source, {})


def _link_from_mapping(tier: str, d: Any, source: str | None) -> LinkTier:
    d = _check_mapping(d, tier, source)
    hints = _hints(LinkTier)
    names = [f.name for f in _fields(LinkTier)]
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        field = f"{tier}.{key}"
        if key in LINK_UNIT_KEYS:
            si, scale = LINK_UNIT_KEYS[key]
            if si in d:
                raise ConfigError(field, value, f"give either {key} or {si}, not both", source=source)
            number = _number(field, value, source)
            kwargs[si] = number / _US_PER_S if key == "latency_us" else float(number * scale)
        elif key in hints:
            kwargs[key] = _coerce(field, value, hints[key], source)
        else:
            valid = names + list(LINK_UNIT_KEYS)
            raise _unknown_key(field, value, valid, f"the {tier} table", source)
    for name in ("name", "bandwidth_bytes_per_s"):
        if name not in kwargs:
            hint = " (or bandwidth_GBps)" if name == "bandwidth_bytes_per_s" else ""
            raise ConfigError(f"{tier}.{name}", None, f"required key missing from the {tier} table{hint}", source=source)
    # the range first, named as the file spells it (0 and negatives too: LinkTier would name its SI field)
    for key, bw, lat in (("bandwidth", kwargs.get("bandwidth_bytes_per_s"), None), ("latency", None, kwargs.get("latency_s"))):
        why = implausible_link(bw, lat)
        if why is not None:
            given = next((k for k in d if k.startswith(key)), key)
            raise ConfigError(f"{tier}.{given}", d.get(given), why, source=source)
    return _build(LinkTier, kwargs, f"the {tier} table", source)


#: Table of a cluster file that holds a fitted collective model (``commscope calibrate`` writes it, in the format
#: of ``commscope fit``: ``[collectives.model]``, ``[[collectives.curves]]``); the ClusterSpec ignores it,
#: ``--bandwidth FILE`` reads it (:func:`commscope.io.bandwidth_file.read_bandwidth`).
COLLECTIVES_KEY = "collectives"


def cluster_from_mapping(d: Mapping[str, Any], *, source: str | None = None, name: str | None = None) -> ClusterSpec:
    """A :class:`ClusterSpec` from a mapping in human units (``memory_GiB``, ``bandwidth_GBps``, ...) or SI.

    ``intra_node`` and ``inter_node`` are tables of :class:`LinkTier` fields. When the mapping has no
    ``source`` key, ``meta.source`` becomes the spec's ``source``. ``name`` is used when the mapping has
    no ``name`` key.
    """
    d = _check_mapping(d, "a cluster file", source)
    hints = _hints(ClusterSpec)
    names = [f.name for f in _fields(ClusterSpec)]
    kwargs: dict[str, Any] = {"name": name} if name else {}
    for key, value in d.items():
        if key == META_KEY:
            meta = _check_mapping(value, META_KEY, source)
            if "source" not in d and isinstance(meta.get("source"), str):
                kwargs["source"] = meta["source"]
        elif key == COLLECTIVES_KEY:  # a fitted collective model (`commscope calibrate`): read by --bandwidth
            _check_mapping(value, COLLECTIVES_KEY, source)
        elif key in CLUSTER_UNIT_KEYS:
            si, scale = CLUSTER_UNIT_KEYS[key]
            if si in d:
                raise ConfigError(key, value, f"give either {key} or {si}, not both", source=source)
            if key == "peak_tflops":
                kwargs[si] = _flops_table(key, value, scale, source)
            elif key == "memory_GiB":
                kwargs[si] = round(_number(key, value, source) * scale)
            else:
                kwargs[si] = float(_number(key, value, source) * scale)
        elif key in ("intra_node", "inter_node"):
            kwargs[key] = _link_from_mapping(key, value, source)
        elif key in hints:
            kwargs[key] = _coerce(key, value, hints[key], source)
        else:
            raise _unknown_key(str(key), value, names + list(CLUSTER_UNIT_KEYS) + [META_KEY, COLLECTIVES_KEY],
                               "a cluster file", source)
    for tier in ("intra_node", "inter_node"):
        if tier not in kwargs:
            raise ConfigError(tier, None, f"required table missing from a cluster file: [{tier}] with name and bandwidth_GBps",
                              source=source)
    _check_gpu_numbers(d, kwargs, source)
    return _build(ClusterSpec, kwargs, "a cluster file", source)


#: What any real device's numbers lie within (per GPU, or per CPU process as `calibrate` measures one): 1 GFLOP/s
#: (a CPU core) to 100,000 TFLOP/s (beyond B200's FP4), 64 MiB to 16 TiB of memory, 1 GB/s to 1,000 TB/s of memory
#: bandwidth (0: unknown).
GPU_RANGES = {"peak_flops": (1e9, 1e17, "peak_tflops", 1e12, "TFLOP/s"),
              "memory_bytes": (1 << 26, 1 << 44, "memory_GiB", 1 << 30, "GiB"),
              "memory_bandwidth_bytes_per_s": (1e9, 1e15, "memory_bandwidth_GBps", 1e9, "GB/s")}


def _check_gpu_numbers(d: Mapping[str, Any], kwargs: Mapping[str, Any], source: str | None) -> None:
    """Refuse a GPU number outside any real GPU's range, named as the file spells it."""
    for si, (lo, hi, human, scale, unit) in GPU_RANGES.items():
        value = kwargs.get(si)
        if value is None:
            continue
        key = human if human in d else si
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for dtype, number in items:
            if si == "memory_bandwidth_bytes_per_s" and number == 0:
                continue  # unknown
            if not (isinstance(number, (int, float)) and lo <= number <= hi):
                field = key if dtype is None else f"{key}.{dtype}"
                shown = number / scale if key == human else number
                raise ConfigError(field, shown, f"is outside any real GPU's range ({lo / scale:g}-{hi / scale:g} "
                                                f"{unit})", source=source)


# ---------------------------------------------------------------------------------------------------------
# Specs -> mappings
# ---------------------------------------------------------------------------------------------------------


def _plain(spec: Any) -> dict[str, Any]:
    """Field values of a dataclass, None dropped (TOML has no null; None is every optional field's default)."""
    out: dict[str, Any] = {}
    for f in _fields(type(spec)):
        value = getattr(spec, f.name)
        if value is None:
            continue
        out[f.name] = list(value) if isinstance(value, tuple) else value
    return out


def model_to_mapping(model: ModelSpec) -> dict[str, Any]:
    """The fields of ``model`` as a mapping that :func:`model_from_mapping` reads back to an equal spec."""
    return _plain(model)


def parallel_to_mapping(parallel: ParallelSpec) -> dict[str, Any]:
    """The fields of ``parallel`` as a mapping that :func:`parallel_from_mapping` reads back to an equal spec."""
    return _plain(parallel)


def _human(value: float, scale: float) -> float | int | None:
    """``value / scale`` when reading it back gives exactly ``value``, else None (write the SI key instead).

    ``scale`` is the multiplier from the human unit to SI; microseconds (``scale == 1 / 1e6``) are handled
    by multiplying and dividing by 10^6, which rounds correctly where multiplying by 1e-6 may not.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    if scale == 1 / _US_PER_S:
        human = value * _US_PER_S
        back = human / _US_PER_S
    else:
        human = value / scale
        back = human * scale
    if back != value:
        return None
    return int(human) if float(human).is_integer() and abs(human) < 2**53 else human


def _link_to_mapping(link: LinkTier) -> dict[str, Any]:
    out: dict[str, Any] = {"name": link.name}
    gbps = _human(link.bandwidth_bytes_per_s, GB)
    if gbps is None:
        out["bandwidth_bytes_per_s"] = link.bandwidth_bytes_per_s
    else:
        out["bandwidth_GBps"] = gbps
    us = _human(link.latency_s, 1 / _US_PER_S)
    if us is None:
        out["latency_s"] = link.latency_s
    else:
        out["latency_us"] = us
    if link.source:
        out["source"] = link.source
    return out


def cluster_to_mapping(cluster: ClusterSpec) -> dict[str, Any]:
    """The fields of ``cluster`` in human units where that is exact (SI keys otherwise).

    :func:`cluster_from_mapping` reads the result back to an equal spec.
    """
    out: dict[str, Any] = {"name": cluster.name, "gpu": cluster.gpu, "gpus_per_node": cluster.gpus_per_node}
    if isinstance(cluster.memory_bytes, int) and cluster.memory_bytes % GiB == 0:
        out["memory_GiB"] = cluster.memory_bytes // GiB
    else:
        out["memory_bytes"] = cluster.memory_bytes
    mbw = _human(cluster.memory_bandwidth_bytes_per_s, GB)
    if mbw is None:
        out["memory_bandwidth_bytes_per_s"] = cluster.memory_bandwidth_bytes_per_s
    else:
        out["memory_bandwidth_GBps"] = mbw
    out["gpu_util"] = cluster.gpu_util
    out["nics_per_node"] = cluster.nics_per_node
    if cluster.compute_efficiency != 1.0:
        out["compute_efficiency"] = cluster.compute_efficiency
    if cluster.source:
        out["source"] = cluster.source
    tflops = {k: _human(v, TFLOP) for k, v in cluster.peak_flops.items()}
    if all(v is not None for v in tflops.values()):
        out["peak_tflops"] = tflops
    else:
        out["peak_flops"] = dict(cluster.peak_flops)
    out["intra_node"] = _link_to_mapping(cluster.intra_node)
    out["inter_node"] = _link_to_mapping(cluster.inter_node)
    return out


# ---------------------------------------------------------------------------------------------------------
# Writing files
# ---------------------------------------------------------------------------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_string(s: str) -> str:
    out = ['"']
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _toml_value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, where) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v, where)}" for k, v in value.items() if v is not None) + "}"
    raise ConfigError(where, value, f"cannot be written to TOML: {_type_name(value)}")


def dumps_toml(d: Mapping[str, Any]) -> str:
    """TOML text for a mapping of scalars, lists and one level of tables (``None`` values are left out)."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    for key, value in d.items():
        if value is None:
            continue
        if isinstance(value, Mapping):
            tables.append((str(key), value))
        else:
            lines.append(f"{_toml_key(str(key))} = {_toml_value(value, str(key))}")
    for key, table in tables:
        lines.append("")
        lines.append(f"[{_toml_key(key)}]")
        for k, v in table.items():
            if v is not None:
                lines.append(f"{_toml_key(str(k))} = {_toml_value(v, f'{key}.{k}')}")
    return "\n".join(lines).lstrip("\n") + "\n"


def write_mapping(path: str | os.PathLike[str], d: Mapping[str, Any]) -> Path:
    """Write ``d`` as TOML, JSON or YAML, chosen by the suffix of ``path``; return the path."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix == ".toml":
        text = dumps_toml(d)
    elif suffix == ".json":
        text = json.dumps(d, indent=2) + "\n"
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ConfigError("path", str(p), "writing YAML needs PyYAML: pip install 'commscope[yaml]' (or use TOML or JSON)") from None
        text = yaml.safe_dump(dict(d), sort_keys=False)
    else:
        raise ConfigError("path", str(p), f"unknown file type {suffix or '(none)'!r}; valid: {', '.join(FILE_SUFFIXES)}")
    from commscope.io.atomic import write_text

    write_text(p, text, field="path")
    return p


# ---------------------------------------------------------------------------------------------------------
# Loading by name or path
# ---------------------------------------------------------------------------------------------------------


def _as_file(name_or_path: str | os.PathLike[str]) -> Path | None:
    """The path when ``name_or_path`` is an existing file (or a folder holding a Hugging Face ``config.json``);
    raise when it looks like a path but is missing."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    if p.is_dir() and (p / "config.json").is_file():
        return p / "config.json"
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or os.sep in text or "/" in text or p.suffix.lower() in FILE_SUFFIXES:
        raise ConfigError("path", text, "is a directory without a config.json; give a file" if p.is_dir()
                          else "no such file")
    return None


def read_preset(kind: str, name: str) -> tuple[str, dict[str, Any]]:
    """(key, mapping) of preset ``name`` of ``kind`` (``models`` or ``clusters``), as its TOML file holds it."""
    # imported here: commscope.presets (run first, as the package of .locate) imports this module
    from commscope.presets.locate import preset_path

    entry = preset_path(kind, name)
    key = entry.name.removesuffix(".toml")
    return key, parse_mapping(entry.read_text(encoding="utf-8"), "toml", source=f"{kind}/{entry.name}")


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of model preset ``name`` (``gpt3-175b``, ``llama3-8b``, ...)."""
    key, d = read_preset("models", name)
    return model_from_mapping(d, source=f"models/{key}.toml", name=key)


def cluster_preset(name: str) -> ClusterSpec:
    """The :class:`ClusterSpec` of cluster preset ``name`` (``dgx-a100``, ``rtx3090-pcie``, ...)."""
    key, d = read_preset("clusters", name)
    return cluster_from_mapping(d, source=f"clusters/{key}.toml", name=key)


def load_model(name_or_path: str | os.PathLike[str] | ModelSpec, *, seq_len: int | None = None) -> ModelSpec:
    """A model from a preset name (``gpt3-175b``), a spec file, or a Hugging Face ``config.json``.

    A value that names an existing file is read as a file (a folder with a ``config.json`` is read as that
    file); a file with Hugging Face keys (``model_type``,
    ``architectures``, ``n_embd``, ``num_hidden_layers``) goes through
    :func:`~commscope.spec.hf.model_from_hf_config`. Anything else is a preset name. ``seq_len``, when
    given, replaces the sequence length (a Hugging Face ``max_position_embeddings`` can be 131072).
    """
    if isinstance(name_or_path, ModelSpec):
        model = name_or_path
    else:
        path = _as_file(name_or_path)
        if path is None:
            model = model_preset(os.fspath(name_or_path))
        else:
            d = read_mapping(path)
            if is_hf_config(d):
                from commscope.spec.hf import model_from_hf_config

                hf_name = d.get("_name_or_path") if isinstance(d.get("_name_or_path"), str) and d.get("_name_or_path") else None
                return model_from_hf_config(d, name=hf_name or path.parent.name or path.stem, seq_len=seq_len, source=str(path))
            model = model_from_mapping(d, source=str(path), name=path.stem)
    if seq_len is not None and seq_len != model.seq_len:
        try:
            model = dataclasses.replace(model, seq_len=seq_len)
        except TypeError:
            raise ConfigError("seq_len", seq_len, "must be a positive integer") from None
    return model


def hf_config_notes(name_or_path: str | os.PathLike[str], *, seq_len_given: bool, dtype_given: bool = True,
                    dtype: str = "bf16") -> list[str]:
    """What reading ``name_or_path`` as a Hugging Face ``config.json`` assumed, one line each: the sequence
    length taken from ``max_position_embeddings`` (the longest context the model supports, not the training
    sequence length) when none was given, and a ``model_type`` the file does not state. Empty for any other
    model source."""
    path = _as_file(name_or_path)
    if path is None:
        return []
    d = read_mapping(path)
    if not is_hf_config(d):
        return []
    from commscope.spec.hf import hf_family

    notes = []
    if "model_type" not in d:
        how = "from its architectures" if d.get("architectures") else "from its keys"
        notes.append(f"{path}: no model_type; read as {hf_family(d, source=str(path))!r}, guessed {how}")
    key = next((k for k in ("max_position_embeddings", "n_positions", "n_ctx") if k in d), None)
    if not seq_len_given and key is not None:
        notes.append(f"{path}: seq_length={d[key]} taken from {key} (the longest context the model supports); give "
                     f"--seq-length for the training sequence length")
    stored = d.get("torch_dtype", d.get("dtype"))
    if not dtype_given and isinstance(stored, str) and _canonical_or_none(stored) != dtype:
        notes.append(f"{path}: trained in {dtype}, not in its torch_dtype {stored!r} (the checkpoint's storage "
                     "dtype); give --dtype for another precision")
    return notes


def _canonical_or_none(name: str) -> str | None:
    try:
        return canonical_dtype(name)
    except ValueError:  # "float128", "int4": no training dtype
        return None


def load_cluster(name_or_path: str | os.PathLike[str] | ClusterSpec) -> ClusterSpec:
    """A cluster from a preset name (``dgx-a100``) or a cluster file."""
    if isinstance(name_or_path, ClusterSpec):
        return name_or_path
    path = _as_file(name_or_path)
    if path is None:
        return cluster_preset(os.fspath(name_or_path))
    return cluster_from_mapping(read_mapping(path), source=str(path), name=path.stem)


def load_parallel(path: str | os.PathLike[str] | ParallelSpec | Mapping[str, Any]) -> ParallelSpec:
    """A parallel configuration from a file (or a mapping of its fields)."""
    if isinstance(path, ParallelSpec):
        return path
    if isinstance(path, Mapping):
        return parallel_from_mapping(path)
    p = Path(path)
    if not p.is_file():
        raise ConfigError("path", os.fspath(path), f"{'is a directory' if p.is_dir() else 'no such file'}; a parallel "
                                                   f"configuration is a {', '.join(FILE_SUFFIXES)} file")
    return parallel_from_mapping(read_mapping(p), source=str(p))
