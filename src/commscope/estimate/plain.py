"""What every estimate builds or looks up, made cheap: frozen dataclasses built in bulk, and constants of an object
held by that object.

A frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__`` (how a frozen dataclass
initialises): for the thousands of :class:`~commscope.estimate.terms.Estimate` objects of a sweep, or the GEMMs of
every estimate, most of what building them costs. :func:`plain_twin` makes a class with the same slots in the same
order and no frozen ``__setattr__``; an instance of it, filled by its plain ``__init__`` and then given the frozen
class (:func:`frozen`), is the object the frozen constructor would have built, frozen from then on
(tests/estimate/test_estimate_many.py::test_estimates_built_in_bulk_are_the_frozen_dataclass holds the two equal).
It runs none of the frozen class's own initialisation beyond setting its fields: a class with a ``__post_init__``
is refused at import.

:func:`held_by_object` keeps a constant worked out of a frozen object (a cluster's GPU, a GPU's kernel table) for
as long as the object is the one asked about: keyed by its id, the entry holding the object so that the id cannot
name another one meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import fields, make_dataclass
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["frozen", "held_by_object", "plain_twin"]

#: The most entries a table of :func:`held_by_object` keeps (a new batch of objects clears it).
MAX_HELD = 64


def plain_twin(cls: type) -> type:
    """A slotted class with ``cls``'s fields as its slots, in the same order, set by a plain ``__init__`` (every
    field an argument, positional or by name; no defaults)."""
    twin = make_dataclass(f"_{cls.__name__}Fields", [f.name for f in fields(cls)], slots=True)
    if getattr(twin, "__slots__", None) != getattr(cls, "__slots__", None) or hasattr(cls, "__post_init__"):
        raise ImportError(f"plain_twin({cls.__name__}): its slots differ from its fields, or it has a __post_init__ "
                          "the twin would skip: build it through its own constructor")
    return twin


def frozen(obj: Any, cls: type[T]) -> T:
    """``obj`` (an instance of ``plain_twin(cls)``) as the ``cls`` it holds."""
    obj.__class__ = cls
    out: T = obj
    return out


def held_by_object(table: dict[tuple[int, Hashable], tuple[Any, T]], obj: Any, key: Hashable,
                   make: Callable[[], T]) -> T:
    """``make()``, a constant of the frozen object ``obj`` (and ``key``), worked out once per object and kept in
    ``table`` with the object itself, so that its id names it for as long as the entry stands."""
    held = table.get((id(obj), key))
    if held is not None and held[0] is obj:
        return held[1]
    out = make()
    if len(table) >= MAX_HELD:
        table.clear()
    table[(id(obj), key)] = (obj, out)
    return out
