"""Input specifications: the model, the parallelism, the cluster; and reading them from files."""

from __future__ import annotations

from commscope.spec.cluster import ClusterSpec, LinkTier
from commscope.spec.files import load_cluster, load_model, load_parallel
from commscope.spec.hf import model_from_hf_config
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

__all__ = [
    "ClusterSpec",
    "LinkTier",
    "ModelSpec",
    "ParallelSpec",
    "load_cluster",
    "load_model",
    "load_parallel",
    "model_from_hf_config",
]
