"""Model and cluster presets: one TOML file each, shipped inside the package.

``models/<name>.toml`` holds :class:`~commscope.spec.model.ModelSpec` fields; ``clusters/<name>.toml``
holds :class:`~commscope.spec.cluster.ClusterSpec` fields in human units (``bandwidth_GBps``,
``latency_us``, ``memory_GiB``, ``peak_tflops``). Each has a ``[meta]`` table with a ``description`` and
the ``source`` its numbers come from. The files are read with :mod:`importlib.resources`, so presets work
from an installed wheel as from a checkout.

    >>> model_preset("llama3-8b").num_parameters()
    8030261248
    >>> cluster_preset("dgx-a100").intra_node.bandwidth_bytes_per_s / 1e9
    230.0
"""

from __future__ import annotations

import difflib
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any

from commscope.errors import ConfigError
from commscope.spec.cluster import ClusterSpec
from commscope.spec.files import META_KEY, cluster_from_mapping, model_from_mapping, parse_mapping
from commscope.spec.model import ModelSpec
from commscope.units import GB, TFLOP

__all__ = ["KINDS", "cluster_preset", "list_presets", "model_preset", "preset_names", "preset_path"]

#: Preset kinds: the folder name and the field an unknown name is reported under.
KINDS: dict[str, str] = {"models": "model", "clusters": "cluster"}


def _folder(kind: str) -> Traversable:
    if kind not in KINDS:
        raise ConfigError("kind", kind, f"valid: {', '.join(KINDS)}")
    return resources.files(__name__).joinpath(kind)


def preset_names(kind: str) -> list[str]:
    """Sorted preset names of ``kind`` (``models`` or ``clusters``)."""
    return sorted(entry.name.removesuffix(".toml") for entry in _folder(kind).iterdir()
                  if entry.name.endswith(".toml") and entry.is_file())


def preset_path(kind: str, name: str) -> Traversable:
    """The file of preset ``name`` of ``kind`` (a :class:`pathlib.Path` when the package is on disk).

    An unknown name raises :class:`ConfigError` on field ``model`` or ``cluster``, listing the valid names
    and suggesting the closest.
    """
    folder = _folder(kind)
    key = str(name).strip().lower()
    entry = folder.joinpath(f"{key}.toml")
    if key and "/" not in key and entry.is_file():
        return entry
    valid = preset_names(kind)
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(KINDS[kind], name, f"not a {KINDS[kind]} preset or an existing file; valid presets: {', '.join(valid)}{hint}")


def _read(kind: str, name: str) -> tuple[str, dict[str, Any]]:
    entry = preset_path(kind, name)
    key = entry.name.removesuffix(".toml")
    return key, parse_mapping(entry.read_text(encoding="utf-8"), "toml", source=f"{kind}/{entry.name}")


def model_preset(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of model preset ``name`` (``gpt3-175b``, ``llama3-8b``, ...)."""
    key, d = _read("models", name)
    return model_from_mapping(d, source=f"models/{key}.toml", name=key)


def cluster_preset(name: str) -> ClusterSpec:
    """The :class:`ClusterSpec` of cluster preset ``name`` (``dgx-a100``, ``rtx3090-pcie``, ...)."""
    key, d = _read("clusters", name)
    return cluster_from_mapping(d, source=f"clusters/{key}.toml", name=key)


def _meta(d: dict[str, Any]) -> tuple[str, str]:
    meta = d.get(META_KEY) or {}
    return str(meta.get("description", "")), str(meta.get("source", ""))


def list_presets() -> dict[str, list[dict[str, Any]]]:
    """Every preset with its description, source and headline numbers, for listing (human units).

    ``models`` rows: name, description, source, num_parameters, num_layers, hidden_size, num_heads,
    seq_len, num_experts. ``clusters`` rows: name, description, source, gpu, gpus_per_node,
    peak_bf16_tflops, intra_node_GBps, inter_node_GBps.
    """
    models = []
    for name in preset_names("models"):
        _, d = _read("models", name)
        model = model_preset(name)
        description, source = _meta(d)
        models.append({
            "name": name,
            "description": description,
            "source": source,
            "num_parameters": model.num_parameters(),
            "num_layers": model.num_layers,
            "hidden_size": model.hidden_size,
            "num_heads": model.num_heads,
            "seq_len": model.seq_len,
            "num_experts": model.num_experts,
        })
    clusters = []
    for name in preset_names("clusters"):
        _, d = _read("clusters", name)
        cluster = cluster_preset(name)
        description, source = _meta(d)
        clusters.append({
            "name": name,
            "description": description,
            "source": source,
            "gpu": cluster.gpu,
            "gpus_per_node": cluster.gpus_per_node,
            "peak_bf16_tflops": cluster.peak_flops_for("bf16") / TFLOP,
            "intra_node_GBps": cluster.intra_node.bandwidth_bytes_per_s / GB,
            "inter_node_GBps": cluster.inter_node.bandwidth_bytes_per_s / GB,
        })
    return {"models": models, "clusters": clusters}
