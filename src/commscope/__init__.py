"""commscope: how distributed deep-learning training communicates, and what that costs.

The analytical core (this package without extras) needs numpy and the standard library only. The names of
``__all__`` load on first use (PEP 562), so that ``import commscope.cli.main`` and ``commscope --help`` stay
free of numpy: ``from commscope import predict`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "AXES": "commscope.record",
    "OP_NAMES": "commscope.record",
    "ClusterSpec": "commscope.spec.cluster",
    "CommOp": "commscope.record",
    "ConfigError": "commscope.errors",
    "Layout": "commscope.layout",
    "LinkTier": "commscope.spec.cluster",
    "ModelSpec": "commscope.spec.model",
    "OpSet": "commscope.workload.base",
    "ParallelSpec": "commscope.spec.parallel",
    "Prediction": "commscope.api",
    "TrafficMatrix": "commscope.traffic",
    "Workload": "commscope.workload.base",
    "build_traffic": "commscope.traffic",
    "build_workload": "commscope.workload.dense",
    "predict": "commscope.api",
    "traffic_of": "commscope.traffic",
}

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

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
