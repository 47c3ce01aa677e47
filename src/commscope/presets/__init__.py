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

import tomllib
from importlib import resources
from typing import Any

from commscope.presets.locate import KINDS, preset_names, preset_path
from commscope.spec.files import META_KEY, cluster_preset, model_preset, read_preset
from commscope.units import GB, TFLOP

__all__ = ["KINDS", "cluster_preset", "list_presets", "model_preset", "preset_names", "preset_path"]


def _meta(d: dict[str, Any]) -> tuple[str, str]:
    meta = d.get(META_KEY) or {}
    return str(meta.get("description", "")), str(meta.get("source", ""))


def list_presets() -> dict[str, list[dict[str, Any]]]:
    """Every preset with its description, source and headline numbers, for listing (human units).

    ``models`` rows: name, description, source, num_parameters, num_layers, hidden_size, num_heads,
    seq_len, num_experts. ``clusters`` rows: name, description, source, gpu, gpus_per_node,
    peak_bf16_tflops, intra_node_GBps, inter_node_GBps. ``gpus`` rows: name, description, source, num_sms,
    peak_bf16_tflops, memory_bandwidth_GBps, sustained_clock_MHz. ``stacks`` rows: name, description, source,
    compute_efficiency.
    """
    from commscope.estimate.gpus import gpu_names, gpu_preset
    from commscope.estimate.stacks import stack_names, stack_preset

    models = []
    for name in preset_names("models"):
        _, d = read_preset("models", name)
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
        _, d = read_preset("clusters", name)
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
    gpus = []
    for name in gpu_names():
        g = gpu_preset(name)
        text = resources.files("commscope.presets").joinpath("gpus", f"{name}.toml").read_text(encoding="utf-8")
        description, source = _meta(tomllib.loads(text))
        gpus.append({"name": name, "description": description, "source": source, "num_sms": g.num_sms,
                     "peak_bf16_tflops": g.peak_flops_for("bf16") / TFLOP if "bf16" in g.peak_flops or "fp16" in
                     g.peak_flops else None, "memory_bandwidth_GBps": g.memory_bandwidth_bytes_per_s / GB,
                     "sustained_clock_MHz": g.sustained_clock_MHz})
    stacks = [{"name": n, "description": stack_preset(n).description, "source": stack_preset(n).source,
               "compute_efficiency": stack_preset(n).compute_efficiency} for n in stack_names()]
    return {"models": models, "clusters": clusters, "gpus": gpus, "stacks": stacks}
