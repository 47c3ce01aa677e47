"""commscope: how distributed deep-learning training communicates, and what that costs.

The analytical core (this package without extras) needs numpy and the standard library only. The names of
``__all__`` load on first use (PEP 562), so that ``import commscope.cli.main`` and ``commscope --help`` stay
free of numpy: ``from commscope import predict`` works as before.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# modules that moved in the house move of issue 34 stay importable at their old paths, with a DeprecationWarning
from commscope._moved import install as _install_moved

_install_moved()

#: Public name -> the module that defines it.
_EXPORTS = {
    "AXES": "commscope.commop",
    "OP_NAMES": "commscope.commop",
    "ClusterSpec": "commscope.spec.cluster",
    "CommOp": "commscope.commop",
    "ConfigError": "commscope.errors",
    "Layout": "commscope.pattern.layout",
    "LinkTier": "commscope.spec.cluster",
    "ModelSpec": "commscope.spec.model",
    "OpSet": "commscope.pattern.workload.base",
    "ParallelSpec": "commscope.spec.parallel",
    "Prediction": "commscope.api",
    "TrafficMatrix": "commscope.pattern.traffic",
    "Workload": "commscope.pattern.workload.base",
    "build_traffic": "commscope.pattern.traffic",
    "build_workload": "commscope.pattern.workload.dense",
    "predict": "commscope.api",
    "traffic_of": "commscope.pattern.traffic",
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
    from commscope.pattern.layout import Layout
    from commscope.commop import AXES, OP_NAMES, CommOp
    from commscope.spec.cluster import ClusterSpec, LinkTier
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec
    from commscope.pattern.traffic import TrafficMatrix, build_traffic, traffic_of
    from commscope.pattern.workload.base import OpSet, Workload
    from commscope.pattern.workload.dense import build_workload


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'commscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
