"""commscope: how distributed deep-learning training communicates, and what that costs.

The analytical core (this package without extras) needs numpy and the standard library only.
"""

from __future__ import annotations

from commscope.api import Prediction, predict
from commscope.errors import ConfigError
from commscope.layout import Layout
from commscope.record import AXES, OP_NAMES, CommOp
from commscope.spec.cluster import ClusterSpec, LinkTier
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.traffic import TrafficMatrix, build_traffic, traffic_of
from commscope.workload.base import OpSet, Workload
from commscope.workload.dense import build_workload

__version__ = "0.1.0"

__all__ = [
    "AXES",
    "OP_NAMES",
    "ClusterSpec",
    "CommOp",
    "ConfigError",
    "Layout",
    "LinkTier",
    "ModelSpec",
    "OpSet",
    "ParallelSpec",
    "Prediction",
    "TrafficMatrix",
    "Workload",
    "__version__",
    "build_traffic",
    "build_workload",
    "predict",
    "traffic_of",
]
