"""Frozen dataclasses built in bulk: a plain slotted twin filled, then given the frozen class.

A frozen dataclass's own ``__init__`` sets each field through ``object.__setattr__`` (how a frozen dataclass
initialises): for the thousands of :class:`~commscope.estimate.terms.Estimate` objects of a sweep, or the GEMMs of
every estimate, most of what building them costs. :func:`plain_twin` makes a class with the same slots in the same
order and no frozen ``__setattr__``; an instance of it, filled by its plain ``__init__`` and then given the frozen
class (:func:`frozen`), is the object the frozen constructor would have built, frozen from then on
(tests/estimate/test_estimate_many.py::test_estimates_built_in_bulk_are_the_frozen_dataclass holds the two equal).
It runs none of the frozen class's own initialisation beyond setting its fields: a class with a ``__post_init__``
is refused at import.
"""

from __future__ import annotations

from dataclasses import fields, make_dataclass
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["frozen", "plain_twin"]


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
