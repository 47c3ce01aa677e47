"""Old module paths, kept working with a DeprecationWarning after the house move of issue 34.

The package was reorganised into folders that follow the flow (``pattern/``, ``estimate/``, ``measure/``,
``trainings/``; ``docs/architecture.md`` explains the names). Code that imports a module by its old path, e.g.
``import commscope.capture`` or ``from commscope.traffic import build_traffic``, gets the module at its new path
(the same module object, so types compare equal) and one :class:`DeprecationWarning` naming the new path. The
table below is the whole list; :func:`install` puts the finder in :data:`sys.meta_path` when ``commscope`` is
imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install"]

#: Old dotted path (under ``commscope.``) -> new dotted path; a package's submodules follow it.
MOVED: dict[str, str] = {
    "record": "commop",
    "layout": "pattern.layout",
    "traffic": "pattern.traffic",
    "volumes": "pattern.volumes",
    "workload": "pattern.workload",
    "flops": "estimate.flops",
    "gpus": "estimate.gpus",
    "stacks": "estimate.stacks",
    "compute": "estimate.compute",
    "bandwidth": "estimate.bandwidth",
    "memory": "estimate.memory",
    "schedule": "estimate.schedule",
    "estimate_many": "estimate.many",
    "plan": "estimate.plan",
    "validate": "estimate.validate",
    "validate_fit": "estimate.validate_fit",
    "shapes": "estimate.shapes",
    "launch": "measure.launch",
    "capture": "measure.capture",
    "bench": "measure.bench",
    "bench.fitted": "estimate.fitted",
    "tune": "measure.tune",
    "workloads": "trainings",
}


def _target(fullname: str) -> str | None:
    """The new path of ``fullname`` when it lies under a moved module or package, else None."""
    if not fullname.startswith("commscope."):
        return None
    rest = fullname[len("commscope."):]
    parts = rest.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in MOVED:
            return "commscope." + ".".join([MOVED[head], *parts[i:]])
    return None


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new
        self.real_spec: Any = None
        self.real_loader: Any = None

    def create_module(self, spec: Any) -> ModuleType:
        module = importlib.import_module(self.new)
        # the import system writes the alias's spec into the module next; keep its own to give back
        self.real_spec, self.real_loader = module.__spec__, getattr(module, "__loader__", None)
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there (the old path will go)",
                      DeprecationWarning, stacklevel=2)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the real module was executed at its new path; give it back its own spec and loader
        module.__spec__ = self.real_spec
        module.__loader__ = self.real_loader


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = _target(fullname)
        if new is None or new == fullname:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new), is_package=real.submodule_search_locations is not None)


_FINDER = _Finder()


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
