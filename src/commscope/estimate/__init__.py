"""What the communication and the compute cost in time: the second half of commscope.

The flow, each module using only the ones before it::

    flops, gpus, stacks          the GPU (kernel constants per preset) and the software stack
    compute/                     every kernel of a training step and its in-training effects
    bandwidth                    the effective-bandwidth model of each collective on each link
    fitted                       the same fitted to measurements (``commscope fit``'s TOML model)
    memory, schedule             what fits on a GPU; the pipeline schedules
    terms, overlap               the Estimate, term by term; what the frameworks' overlaps hide
    op_by_op                     the refined iteration time from the op list (its definition)
    stage_structure, closed_form the same in closed form over the stages, on arrays of configurations
    iteration                    the iteration time: the ``estimate`` function, the seed method
    many, plan                   many configurations at once; the ranked plan
    validate_columns, _runs      a file of measured runs: its columns; reading it into specs
    validate, validate_fit       predicted against measured runs; a cluster's efficiency fitted to them
    shapes_rules, _report,       the GEMM shapes of a model against the GPU: the shape rules, the report of one
    _search, _sweep, _measure    job, nearby faster shapes, sweeps, GEMMs timed with torch
    shapes                       where the names of the shapes_* modules are imported from

The names users import from here stay here: :func:`estimate`, :func:`estimate_op_by_op`, :class:`Estimate`,
:data:`METHODS` (loaded on first use, so that importing a submodule stays light).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["METHODS", "Estimate", "estimate", "estimate_op_by_op"]

if TYPE_CHECKING:
    from commscope.estimate.iteration import METHODS, Estimate, estimate, estimate_op_by_op


def __getattr__(name: str) -> Any:
    # the public names, and any other name of the iteration module (the old commscope.estimate module's)
    if name.startswith("__"):
        raise AttributeError(name)
    iteration = importlib.import_module("commscope.estimate.iteration")
    try:
        value = getattr(iteration, name)
    except AttributeError:
        raise AttributeError(f"module 'commscope.estimate' has no attribute {name!r}") from None
    globals()[name] = value
    return value
