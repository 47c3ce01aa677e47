"""What the communication and the compute cost in time: the second half of commscope.

The flow, each module using only the ones before it::

    flops, gpus, stacks          the GPU (kernel constants per preset) and the software stack
    compute/                     every kernel of a training step and its in-training effects
    bandwidth                    the effective-bandwidth model of each collective on each link
    memory, schedule             what fits on a GPU; the pipeline schedules
    iteration                    the iteration time, term by term (the ``estimate`` function)
    many, plan                   many configurations at once; the ranked plan
    validate, validate_fit       predicted against measured runs; a cluster's efficiency fitted to them
    shapes                       the GEMM shapes of a model against the GPU (the shape rules)

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
