"""Which layers each pipeline stage holds: the split of the decoder layers over pp stages (and v model chunks).

Megatron-LM's rules (an even split, the user's ``--pipeline-layers`` or ``--decoder-first/last-pipeline-num-layers``,
else a balanced uneven split), which the PyTorch reference training (:mod:`commscope.workloads.gpt`) follows too.
Shared by every framework's communication rules, the compute model, the estimate and the memory model.
"""

from __future__ import annotations

import functools

from commscope.errors import ConfigError, check
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

__all__ = ["balanced_pipeline_layers", "pipeline_split", "pipeline_split_label", "pipeline_split_note", "run_lengths", "stage_layers",
           "virtual_stage_layers"]


def virtual_stage_layers(model: ModelSpec, parallel: ParallelSpec) -> list[range]:
    """Global layer indices of each virtual stage k = chunk * pp + stage (Megatron's interleaved assignment).

    The split, in order of precedence: ``pipeline_layers``; Megatron's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` (the other stages split the rest evenly; with v > 1 each stage's layers
    spread evenly over its v chunks, as Megatron-core requires); an even split when pp x v divides the layers;
    otherwise :func:`balanced_pipeline_layers` (with v > 1: its stages spread over their chunks, the lighter chunks at
    the pipeline's two ends, the split Llama 3 405B was trained with [llama3-2024]).
    """
    return _ranges(pipeline_split(model, parallel))


def _ranges(sizes: list[int]) -> list[range]:
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def pipeline_split(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """Layers of each virtual stage (see :func:`virtual_stage_layers`); raises ConfigError when none can be made."""
    p, v, num = parallel.pp, parallel.virtual_pipeline_size, model.num_layers
    if parallel.pipeline_layers is not None:
        return list(parallel.pipeline_layers)
    first, last = parallel.decoder_first_pipeline_num_layers, parallel.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        ends = (first or 0) + (last or 0)
        inner = p - (first is not None) - (last is not None)
        rest = num - ends
        if not (rest >= inner and (inner == 0 and rest == 0 or inner > 0 and rest % inner == 0)):
            field, value = (("decoder_first_pipeline_num_layers", first) if first is not None
                            else ("decoder_last_pipeline_num_layers", last or 0))
            other = ends - value
            valid = [x for x in range(1, num + 1) if (inner == 0 and num - other - x == 0)
                     or (inner > 0 and num - other - x >= inner and (num - other - x) % inner == 0)]
            shown = ", ".join(map(str, valid[:6])) + (", ..." if len(valid) > 6 else "")
            raise ConfigError(field, value, f"leaves {rest} of num_layers={num} for the other {inner} stage(s), which "
                                            f"must hold at least 1 layer each, evenly" + (
                                                f"; valid here: {shown}" if valid else "; no value is"))
        mid = [rest // inner] * inner if inner else []
        stages = ([first] if first is not None else []) + mid + ([last] if last is not None else [])
        if v == 1:
            return stages
        # Megatron-core: every stage's layers split evenly over its v model chunks
        if any(n % v for n in stages):
            field, value = (("decoder_first_pipeline_num_layers", first) if first is not None and first % v else
                            ("decoder_last_pipeline_num_layers", last) if last is not None and last % v else
                            ("virtual_pipeline_size", v))
            raise ConfigError(field, value, f"every pipeline stage's layers must split evenly over its "
                                            f"virtual_pipeline_size={v} chunks (the stages would hold "
                                            f"{run_lengths(stages)}); give every chunk's layers with --pipeline-layers, "
                                            f"or leave both out for the balanced split (lighter first and last "
                                            f"stages, spread over their chunks)")
        return [n // v for _ in range(v) for n in stages]
    if num % (p * v) == 0:
        return [num // (p * v)] * (p * v)
    split = balanced_pipeline_layers(model, p, v)
    check(split is not None, "pp" if v == 1 else "virtual_pipeline_size", p if v == 1 else v,
          f"pp x virtual_pipeline_size = {p * v} pipeline chunks is more than num_layers={num} (with pp={p}: "
          f"virtual_pipeline_size <= {num // p})" if v > 1 else f"is larger than num_layers={num}")
    return list(split or ())


@functools.lru_cache(maxsize=256)
def balanced_pipeline_layers(model: ModelSpec, pp: int, v: int = 1) -> tuple[int, ...] | None:
    """An uneven split for pp stages that do not divide the layers: equal middle stages and lighter first and
    last stages, chosen to minimise the slowest stage's forward FLOPs (the last stage also computes the logits),
    as Megatron-core's ``--decoder-first/last-pipeline-num-layers`` let a user do by hand. With v model chunks
    per stage (the interleaved schedule) each stage's layers are then spread over its chunks as evenly as they go,
    the lighter chunks at the pipeline's two ends (first chunks of the first stage, last chunks of the last stage);
    returned per virtual stage, in Megatron's order chunk x pp + stage.

    Worked example: Llama 3 405B (126 layers, V = 128,256, h = 16,384) on pp = 16 gives 7, 8 x 14, 7 (the split
    Meta used [llama3-2024]): the logits cost ~0.6 layer, so a last stage of 7 layers + logits stays under 8; with
    v = 2 the chunks are 3, 4 x 30, 3 (Meta's interleaved split: one layer fewer in the first and last chunk).
    None when pp x v > num_layers. Cached per (model, pp, v): every stage of a workload and of the estimate asks.
    """
    from commscope.flops import token_flops

    num = model.num_layers
    if pp * v > num:
        return None
    if num % (pp * v) == 0:
        return (num // (pp * v),) * (pp * v)
    if v > 1:
        stages = balanced_pipeline_layers(model, pp)
        assert stages is not None  # pp <= pp x v <= num
        chunks = []
        for stage, total in enumerate(stages):
            q, r = divmod(total, v)
            light_first = stage == 0 and pp > 1
            chunks.append([q] * (v - r) + [q + 1] * r if light_first else [q + 1] * r + [q] * (v - r))
        return tuple(chunks[stage][chunk] for chunk in range(v) for stage in range(pp))
    tf = token_flops(model)
    layer = sum(tf.layers) / num
    best: tuple[float, int, tuple[int, ...]] | None = None
    for first in range(1, num + 1):
        for last in range(1, num - first + 1):
            rest = num - first - last
            if pp == 2:
                if rest:
                    continue
                mid: tuple[int, ...] = ()
            elif rest < pp - 2 or rest % (pp - 2):
                continue
            else:
                mid = (rest // (pp - 2),) * (pp - 2)
            cost = max([first * layer, last * layer + tf.logits] + [n * layer for n in mid])
            spread = max((first, last) + mid) - min((first, last) + mid)
            key = (cost, spread, (first,) + mid + (last,))
            if best is None or key[:2] < best[:2]:
                best = key
    return best[2] if best else None


def stage_layers(model: ModelSpec, parallel: ParallelSpec, stage: int) -> list[range]:
    """Layer ranges of each model chunk held by pipeline ``stage``."""
    vs = virtual_stage_layers(model, parallel)
    return [vs[chunk * parallel.pp + stage] for chunk in range(parallel.virtual_pipeline_size)]


def run_lengths(sizes: list[int]) -> str:
    """``7,8x14,7``: a split written with runs of three or more equal entries as value x count."""
    out, i = [], 0
    while i < len(sizes):
        j = i
        while j < len(sizes) and sizes[j] == sizes[i]:
            j += 1
        out += [f"{sizes[i]}x{j - i}"] if j - i >= 3 else [str(sizes[i])] * (j - i)
        i = j
    return ",".join(out)


def pipeline_split_label(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """``pipeline split 7,8x14,7`` (with v > 1 also what the stages hold), when the user gave no split and pp x v does
    not divide the layers; else None."""
    p, v = parallel.pp, parallel.virtual_pipeline_size
    if (parallel.pipeline_layers is not None or parallel.decoder_first_pipeline_num_layers is not None
            or parallel.decoder_last_pipeline_num_layers is not None or model.num_layers % (p * v) == 0):
        return None
    split = pipeline_split(model, parallel)
    if v == 1:
        return f"pipeline split {run_lengths(split)}"
    return (f"pipeline split {run_lengths(split)} (chunks in chunk x pp + stage order; the stages hold "
            f"{run_lengths(_stage_totals(split, p, v))})")


def _stage_totals(split: list[int], p: int, v: int) -> list[int]:
    """Layers of each stage: the sum over its chunks (virtual stages chunk x pp + stage)."""
    return [sum(split[c * p + s] for c in range(v)) for s in range(p)]


def pipeline_split_note(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """A line saying which uneven pipeline split was chosen (:func:`pipeline_split_label`) and why."""
    label = pipeline_split_label(model, parallel)
    if label is None:
        return None
    p, v = parallel.pp, parallel.virtual_pipeline_size
    if v == 1:
        return (f"{label}: pp={p} does not divide num_layers={model.num_layers}, so the first and last stages are "
                f"lighter (the last also computes the logits); --pipeline-layers or "
                f"--decoder-first/last-pipeline-num-layers choose another")
    stages = _stage_totals(pipeline_split(model, parallel), p, v)
    lighter = min(stages) < max(stages)
    return (f"{label}: pp x virtual_pipeline_size = {p * v} does not divide num_layers={model.num_layers}, so "
            + ("the first and last stages are lighter (the last also computes the logits) and " if lighter else "")
            + "each stage's layers are spread over its chunks as evenly as they go; --pipeline-layers chooses another")
