"""Which layers each pipeline stage holds: the split of the decoder layers over pp stages (and v model chunks).

Megatron-LM's rules (an even split, the user's ``--pipeline-layers`` or ``--decoder-first/last-pipeline-num-layers``,
else a balanced uneven split), which the PyTorch reference training (:mod:`commscope.trainings.gpt`) follows too.
Shared by every framework's communication rules, the compute model, the estimate and the memory model.
"""

from __future__ import annotations

import functools
import itertools

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
    otherwise :func:`balanced_pipeline_layers`: stage loads differ by one layer at most, the first and last stages
    among the lighter (Megatron-core's ``--account-for-embedding/loss-in-pipeline-split`` where that rule applies;
    the split Llama 3 405B was trained with [llama3-2024]); with v > 1 its stages spread over their chunks.
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
    split = balanced_pipeline_layers(num, p, v)
    check(split is not None, "pp" if v == 1 else "virtual_pipeline_size", p if v == 1 else v,
          f"pp x virtual_pipeline_size = {p * v} pipeline chunks is more than num_layers={num} (with pp={p}: "
          f"virtual_pipeline_size <= {num // p})" if v > 1 else f"is larger than num_layers={num}")
    return list(split or ())


@functools.lru_cache(maxsize=256)
def balanced_pipeline_layers(num_layers: int, pp: int, v: int = 1) -> tuple[int, ...] | None:
    """The default split of ``num_layers`` over pp stages (and v model chunks per stage) that pp x v does not
    divide: stage loads differ by one layer at most, the first and last stages lighter than or as light as every
    other, the heavier stages late in the pipeline. Per virtual stage, in Megatron's order chunk x pp + stage.

    Megatron-core has a rule for part of this and refuses the rest (``megatron/core/transformer/transformer_block.py``
    ``get_num_layers_to_build``, ``transformer_config.py`` ``__post_init__``): without
    ``--decoder-first/last-pipeline-num-layers`` pp must divide the layers, unless
    ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` count the embedding and
    the loss as one layer each: (L + 2) / pp layers per stage (/ v per chunk), the first chunk of the first stage and
    the last chunk of the last stage one decoder layer fewer. Where (L + 2) splits that way this split is that rule:
    Llama 3 405B's 126 layers on pp = 16 give 7, 8 x 14, 7 (the split Meta trained with [llama3-2024]), with v = 2
    chunks 3, 4 x 30, 3. Where it does not, L = q pp + r splits into pp - r stages of q and r of q + 1:

    - the first and last stage take q: the first also holds the embedding, the last the final norm, the logits and
      the loss (with pp - r = 1 only the last is light: the logits cost FLOPs, the embedding lookup almost none);
    - the other light stages come next, the heavy ones after them: 1F1B keeps min(pp - i, m) micro-batches of
      activations alive on stage i, so the heavier stages sit where the fewest are in flight. GPT-3 175B's 96 layers
      on pp = 64: 1 x 31, 2 x 32, 1 (stage 31, the first of 2 layers, keeps 33 micro-batches; stage 1 would keep 63);
    - with v > 1 each stage's layers spread over its chunks as evenly as they go, the lighter chunks first
      (more of the early chunks' forward passes are in flight), except on the last stage, whose last chunk, the
      pipeline's last, is a light one.

    None when pp x v > num_layers. Cached: every stage of a workload and of the estimate asks.
    """
    if pp * v > num_layers:
        return None
    if num_layers % (pp * v) == 0:
        return (num_layers // (pp * v),) * (pp * v)
    q, r = divmod(num_layers, pp)
    light = pp - r
    stages = ([q] + [q] * (light - 2) + [q + 1] * r + [q] if light >= 2 else [q + 1] * r + [q])
    chunks = []
    for stage, total in enumerate(stages):
        c, extra = divmod(total, v)
        chunks.append([c + 1] * extra + [c] * (v - extra) if stage == pp - 1 and pp > 1
                      else [c] * (v - extra) + [c + 1] * extra)
    return tuple(chunks[stage][chunk] for chunk in range(v) for stage in range(pp))


def stage_layers(model: ModelSpec, parallel: ParallelSpec, stage: int) -> list[range]:
    """Layer ranges of each model chunk held by pipeline ``stage``."""
    vs = virtual_stage_layers(model, parallel)
    return [vs[chunk * parallel.pp + stage] for chunk in range(parallel.virtual_pipeline_size)]


def run_lengths(sizes: list[int]) -> str:
    """``7,8x14,7``: a split written with runs of three or more equal entries as value x count."""
    out: list[str] = []
    for size, run in itertools.groupby(sizes):
        count = sum(1 for _ in run)
        out += [f"{size}x{count}"] if count >= 3 else [str(size)] * count
    return ",".join(out)


def pipeline_split_label(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """``pipeline split 7,8x14,7`` (with v > 1 also what the stages hold), when the user gave no split and pp x v does
    not divide the layers; else None."""
    if not _chosen_uneven(model, parallel):
        return None
    return _split_label(pipeline_split(model, parallel), parallel.pp, parallel.virtual_pipeline_size)


def _chosen_uneven(model: ModelSpec, parallel: ParallelSpec) -> bool:
    """Whether commscope chose an uneven split: the user gave none, and pp x v does not divide the layers."""
    return not (parallel.pipeline_layers is not None or parallel.decoder_first_pipeline_num_layers is not None
                or parallel.decoder_last_pipeline_num_layers is not None
                or model.num_layers % (parallel.pp * parallel.virtual_pipeline_size) == 0)


def _split_label(split: list[int], p: int, v: int) -> str:
    """:func:`pipeline_split_label` of the split ``split``."""
    if v == 1:
        return f"pipeline split {run_lengths(split)}"
    return (f"pipeline split {run_lengths(split)} (chunks in chunk x pp + stage order; the stages hold "
            f"{run_lengths(_stage_totals(split, p, v))})")


def _stage_totals(split: list[int], p: int, v: int) -> list[int]:
    """Layers of each stage: the sum over its chunks (virtual stages chunk x pp + stage)."""
    return list(map(sum, zip(*(split[c * p:(c + 1) * p] for c in range(v))))) if v > 1 else list(split)


def _megatron_flags(num_layers: int, p: int, v: int) -> str | None:
    """Megatron-core's flags that give :func:`balanced_pipeline_layers`'s split of ``num_layers`` on (p, v), if any:
    with the embedding and the loss counted as a layer each (or the loss alone) every chunk holds the same."""
    if (num_layers + 2) % (p * v) == 0:
        return "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split"
    if (num_layers + 1) % (p * v) == 0:
        return "--account-for-loss-in-pipeline-split"
    return None


def pipeline_split_note(model: ModelSpec, parallel: ParallelSpec) -> str | None:
    """A line saying which uneven pipeline split was chosen (:func:`pipeline_split_label`) and why."""
    if not _chosen_uneven(model, parallel):
        return None
    p, v = parallel.pp, parallel.virtual_pipeline_size
    split = pipeline_split(model, parallel)  # (worked out once for the label and the stages)
    label = _split_label(split, p, v)
    stages = _stage_totals(split, p, v)
    low, high = min(stages), max(stages)
    why = ""
    if low != high:
        n_low, n_high = stages.count(low), stages.count(high)
        ends = "the first and last" if stages[0] == low else "the last"
        why = (f"{n_low} stage{'s' * (n_low > 1)} hold{'s' * (n_low == 1)} {low} layer{'s' * (low > 1)} and "
               f"{n_high} hold{'s' * (n_high == 1)} {high}, {ends} among the lighter (the first also holds the "
               f"embedding, the last the logits and loss)"
               + (", the heavier late, where fewer micro-batches are in flight" if n_low > 2 else ""))
    flags = _megatron_flags(model.num_layers, p, v)
    if flags:
        why += f", as Megatron-core splits it with {flags}" if why else f"Megatron-core's split with {flags}"
    if v == 1:
        return (f"{label}: pp={p} does not divide num_layers={model.num_layers}: {why}; --pipeline-layers or "
                f"--decoder-first/last-pipeline-num-layers choose another")
    return (f"{label}: pp x virtual_pipeline_size = {p * v} does not divide num_layers={model.num_layers}: "
            + (f"{why}; " if why else "")
            + "each stage's layers are spread over its chunks as evenly as they go; --pipeline-layers chooses another")
