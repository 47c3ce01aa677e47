"""Model shapes against the GPU: the GEMMs of a transformer layer, their predicted efficiency, the shape rules
they break, and nearby shapes that run faster.

Co-design [anthony-2024]: models of the same size run up to 39% faster when their shapes suit the GPU's
matrix units. This module makes that quantitative for one job (model, parallelism, cluster), and is the place its
names are imported from; each part lives in a module of its own:

1. The GEMMs of a layer and the tile/wave model that times them live in :mod:`commscope.estimate.compute.gemm`
   (re-exported here): :func:`layer_gemms`, :func:`gemm_timing`, :func:`time_gemms`.

2. :func:`analyse_shapes` (:mod:`commscope.estimate.shapes_report`) reports every GEMM of a job with its predicted
   efficiency, the rules that govern it, and the shape-aware estimate beside the cluster's flat ``gpu_util``.

3. :func:`shape_rules` (:mod:`commscope.estimate.shapes_rules`) checks the rules of [anthony-2024] and
   [nvidia-matmul-guide] (hidden size, head size, hidden and FFN width per TP rank, vocabulary padding, sequence
   length, tokens per micro-batch multiples of 64; heads divisible by t; experts divisible by e; layers divisible by
   the pipeline) and prices each broken one on this GPU: the affected GEMMs against themselves at the compute speed
   per FLOP they would reach with the offending dimension rounded up to the next multiple of 64 (same memory
   traffic).

4. :func:`suggest_shapes` (:mod:`commscope.estimate.shapes_search`) searches nearby shapes (hidden, heads, FFN,
   layers) whose parameter count stays within a tolerance (default 5%) and ranks them by the iteration time of
   :func:`commscope.estimate.estimate`, whose compute model (:mod:`commscope.estimate.compute`) times every GEMM of
   the shape with the same tile/wave model. :func:`shape_util` keeps the older flat-``u`` approximation (the
   cluster's ``gpu_util`` scaled by this shape's GEMM efficiency over the ideal) for the baseline. Communication
   follows from the shape through the estimate (time) and :func:`commscope.pattern.volumes.axis_volumes` (bytes).

5. :func:`sweep_shapes` (:mod:`commscope.estimate.shapes_sweep`) predicts the throughput of a job as one shape
   quantity varies.

6. :func:`measure_gemms` (:mod:`commscope.estimate.shapes_measure`) times the GEMMs with torch on a GPU beside their
   prediction.

The analytical functions import numpy only; :func:`measure_gemms` imports torch inside (extra ``torch``).
"""

from __future__ import annotations

from commscope.estimate.compute.gemm import (  # re-exported: shapes' public API
    ALIGN_ELEMENTS,
    ATTENTION,
    PASSES,
    Gemm,
    GemmResult,
    GemmTiming,
    alignment_factor,
    gemm_timing,
    layer_dims,
    layer_gemms,
    model_gemms,
    time_gemms,
)
from commscope.estimate.shapes_measure import MeasuredGemm, cuda_available, measure_gemms, measured_over_predicted
from commscope.estimate.shapes_report import ShapeReport, analyse_shapes, shape_util
from commscope.estimate.shapes_rules import RuleCheck, RuleStatus, shape_rules
from commscope.estimate.shapes_search import RANK_BY, RankBy, Suggestion, Suggestions, suggest_shapes
from commscope.estimate.shapes_sweep import SWEEP_KEYS, SweepResult, sweep_shapes

__all__ = [
    "ALIGN_ELEMENTS",
    "ATTENTION",
    "PASSES",
    "RANK_BY",
    "SWEEP_KEYS",
    "Gemm",
    "GemmResult",
    "GemmTiming",
    "MeasuredGemm",
    "RankBy",
    "RuleCheck",
    "RuleStatus",
    "ShapeReport",
    "Suggestion",
    "Suggestions",
    "SweepResult",
    "alignment_factor",
    "analyse_shapes",
    "cuda_available",
    "gemm_timing",
    "layer_dims",
    "layer_gemms",
    "measure_gemms",
    "measured_over_predicted",
    "model_gemms",
    "shape_rules",
    "shape_util",
    "suggest_shapes",
    "sweep_shapes",
    "time_gemms",
]
