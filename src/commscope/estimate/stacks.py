"""Software stacks: what a training stack's own efficiency costs against the kernels the GPU model times.

The compute model times each kernel as the GPU runs it (:mod:`commscope.estimate.compute`, constants fitted to measured
kernels) and adds the in-training effects that have a named mechanism (:mod:`commscope.estimate.compute.effects`). An
end-to-end table of one software stack can still differ from that, by what the stack itself loses or gains: older
kernels, launch and synchronisation overheads, data loading, the optimizer's implementation, logging. That
difference is the stack's ``compute_efficiency``: its compute runs at that fraction of the modelled speed. It
is kept here, per stack, with the table it was fitted on and the error before and after, and applied only when the
user names the stack (``--stack NAME``, ``ParallelSpec.stack``, a ``stack`` column in ``validate``): it is never
folded into a GPU's constants, and the default estimate uses none.

Files: ``presets/stacks/<name>.toml``::

    name = "megatron-core-2024"
    compute_efficiency = 0.80
    description = "..."
    source = "..."

numpy-free; the standard library only.
"""

from __future__ import annotations

import difflib
import functools
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Any

from commscope.errors import ConfigError

__all__ = ["StackSpec", "stack_names", "stack_preset"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StackSpec:
    """A training software stack's efficiency against the kernel-level compute model."""

    name: str
    compute_efficiency: float
    """Compute runs at this fraction of the modelled speed (kernel time / efficiency)."""
    description: str = ""
    source: str = ""
    """Where the efficiency comes from: the table it was fitted on, and the errors without and with it."""

    def __post_init__(self) -> None:
        if not (isinstance(self.compute_efficiency, (int, float)) and math.isfinite(self.compute_efficiency)
                and 0.2 <= self.compute_efficiency <= 1.2):
            raise ConfigError("compute_efficiency", self.compute_efficiency,
                              "must be in [0.2, 1.2] (a stack's compute at that fraction of the modelled speed)")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "compute_efficiency": self.compute_efficiency, "description": self.description,
                "source": self.source}


def _folder() -> Any:
    return resources.files("commscope.presets").joinpath("stacks")


@functools.cache
def stack_names() -> tuple[str, ...]:
    """Names of the stack presets, sorted."""
    return tuple(sorted(e.name.removesuffix(".toml") for e in _folder().iterdir() if e.name.endswith(".toml")))


@functools.cache
def stack_preset(name: str) -> StackSpec:
    """The stack preset ``name``; :class:`ConfigError` naming the valid ones otherwise."""
    names = stack_names()
    if name not in names:
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError("stack", name, f"valid: {', '.join(names)}{hint}")
    entry = _folder().joinpath(f"{name}.toml")
    try:
        d = tomllib.loads(entry.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("path", f"stacks/{name}.toml", f"malformed TOML: {exc}") from None
    unknown = set(d) - {"name", "compute_efficiency", "description", "source"}
    if unknown:
        raise ConfigError(min(unknown), None, f"unknown key in stacks/{name}.toml")
    return StackSpec(name=name, compute_efficiency=float(d["compute_efficiency"]),
                     description=str(d.get("description", "")), source=str(d.get("source", "")))
