"""Which layers each pipeline stage holds: the split of the decoder layers over pp stages (and v model chunks).

Megatron-LM's rules (an even split, the user's ``--pipeline-layers`` or ``--decoder-first/last-pipeline-num-layers``,
else a balanced uneven split), which the PyTorch reference training (:mod:`commscope.workloads.gpt`) follows too.
Shared by every framework's communication rules, the compute model, the estimate and the memory model.
"""

from __future__ import annotations

import functools

from commscope.errors import check
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

__all__ = ["balanced_pipeline_layers", "pipeline_split", "pipeline_split_note", "stage_layers",
           "virtual_stage_layers"]


def virtual_stage_layers(model: ModelSpec, parallel: ParallelSpec) -> list[range]:
    """Global layer indices of each virtual stage k = chunk * pp + stage (Megatron's interleaved assignment).

    The split, in order of precedence: ``pipeline_layers``; Megatron's ``--decoder-first-pipeline-num-layers`` /
    ``--decoder-last-pipeline-num-layers`` (the other stages split the rest evenly); an even split when
    pp x v divides the layers; otherwise (v = 1) :func:`balanced_pipeline_layers`.
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
        check(v == 1, "virtual_pipeline_size", v, "with --decoder-first/last-pipeline-num-layers give the split of every "
              "virtual stage with --pipeline-layers instead")
        ends = (first or 0) + (last or 0)
        inner = p - (first is not None) - (last is not None)
        rest = num - ends
        check(rest >= inner and (inner == 0 and rest == 0 or inner > 0 and rest % inner == 0),
              "decoder_first_pipeline_num_layers" if first is not None else "decoder_last_pipeline_num_layers",
              first if first is not None else last,
              f"the remaining {rest} of num_layers={num} must split evenly over the other {inner} stage(s)")
        mid = [rest // inner] * inner if inner else []
        return ([first] if first is not None else []) + mid + ([last] if last is not None else [])
    if num % (p * v) == 0:
        return [num // (p * v)] * (p * v)
    check(v == 1, "virtual_pipeline_size", v,
          f"pp x virtual_pipeline_size = {p * v} must divide num_layers={num} (or give --pipeline-layers)")
    split = balanced_pipeline_layers(model, p)
    check(split is not None, "pp", p, f"is larger than num_layers={num}")
    return list(split or ())


@functools.lru_cache(maxsize=256)
def balanced_pipeline_layers(model: ModelSpec, pp: int) -> tuple[int, ...] | None:
    """An uneven split for pp stages that do not divide the layers: equal middle stages and lighter first and
    last stages, chosen to minimise the slowest stage's forward FLOPs (the last stage also computes the logits),
    as Megatron-core's ``--decoder-first/last-pipeline-num-layers`` let a user do by hand.

    Worked example: Llama 3 405B (126 layers, V = 128,256, h = 16,384) on pp = 16 gives 7, 8 x 14, 7 (the split
    Meta used [llama3-2024]): the logits cost ~0.6 layer, so a last stage of 7 layers + logits stays under 8.
    None when pp > num_layers. Cached per (model, pp): every stage of a workload and of the estimate asks for it.
    """
    from commscope.flops import token_flops

    num = model.num_layers
    if pp > num:
        return None
    if num % pp == 0:
        return (num // pp,) * pp
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


def pipeline_split_note(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """A line saying which uneven pipeline split was chosen, when the user gave none and pp does not divide the layers."""
    p, v = parallel.pp, parallel.virtual_pipeline_size
    if (parallel.pipeline_layers is not None or parallel.decoder_first_pipeline_num_layers is not None
            or parallel.decoder_last_pipeline_num_layers is not None or model.num_layers % (p * v) == 0):
        return None
    split = pipeline_split(model, parallel)
    return (f"pipeline split {','.join(map(str, split))}: pp={p} does not divide num_layers={model.num_layers}, so the "
            f"first and last stages are lighter (the last also computes the logits); --pipeline-layers or "
            f"--decoder-first/last-pipeline-num-layers choose another")
