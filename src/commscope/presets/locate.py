"""Where the shipped preset files are: names, paths, and the error for a name that is not one.

The lowest piece of :mod:`commscope.presets`, imported by the spec readers (:mod:`commscope.spec.files`) that turn
a preset into a spec; it imports nothing of commscope but the errors, so that the readers and the catalogue of
presets do not import each other.
"""

from __future__ import annotations

import difflib
from importlib import resources
from importlib.resources.abc import Traversable

from commscope.errors import ConfigError

__all__ = ["KINDS", "preset_names", "preset_path"]

#: Preset kinds: the folder name and the field an unknown name is reported under.
KINDS: dict[str, str] = {"models": "model", "clusters": "cluster"}


def _folder(kind: str) -> Traversable:
    if kind not in KINDS:
        raise ConfigError("kind", kind, f"valid: {', '.join(KINDS)}")
    return resources.files("commscope.presets").joinpath(kind)


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
