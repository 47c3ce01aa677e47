"""All Hypothesis strategies of the test suite, in one place."""

from __future__ import annotations

from hypothesis import strategies as st

from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

ORDERS = ["tp-cp-ep-dp-pp", "tp-cp-dp-ep-pp", "tp-pp-cp-ep-dp", "dp-tp-cp-ep-pp", "pp-tp-ep-cp-dp"]


@st.composite
def jobs(draw, *, max_world: int = 64, moe: bool | None = False):
    """A random valid (ModelSpec, ParallelSpec) pair with world size <= max_world."""
    tp = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    cp = draw(st.sampled_from([1, 1, 2]))
    dp = draw(st.sampled_from([1, 2, 3, 4]))
    while tp * pp * dp * cp > max_world:
        dp = max(1, dp // 2)
        pp = max(1, pp - 1)
    v = draw(st.sampled_from([1, 1, 2])) if pp > 1 else 1
    heads = tp * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([8, 16]))
    # now and then a pipeline that does not divide the layers (the chosen uneven split: lighter first and last
    # stages, or chunks; every remainder, so light middle stages before heavier ones too)
    layers = pp * v * draw(st.integers(1, 3)) + (draw(st.sampled_from([0, 0, 0, *range(1, pp)])) if pp > 1 else 0)
    is_moe = draw(st.booleans()) if moe is None else moe
    ep = 1
    num_experts = 0
    if is_moe:
        ep = draw(st.sampled_from([d for d in (1, 2, 4) if (dp * cp) % d == 0]))
        num_experts = ep * draw(st.sampled_from([1, 2]))
    model = ModelSpec(
        name="rand",
        num_layers=layers,
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_query_groups=draw(st.sampled_from([heads, tp])) if heads % tp == 0 else heads,
        vocab_size=draw(st.integers(100, 1000)),
        make_vocab_size_divisible_by=draw(st.sampled_from([1, 8, 128])),
        seq_len=cp * tp * draw(st.sampled_from([4, 8])),
        tied_embeddings=draw(st.booleans()),
        position_embedding=draw(st.sampled_from(["learned", "rope"])),
        gated_mlp=draw(st.booleans()),
        bias=draw(st.booleans()),
        normalization=draw(st.sampled_from(["layernorm", "rmsnorm"])),
        dtype=draw(st.sampled_from(["bf16", "fp16", "fp32"])),
        num_experts=num_experts,
        top_k=1 if num_experts < 2 else 2,
    )
    mb = draw(st.sampled_from([1, 2]))
    m = draw(st.integers(1, 3)) * (pp if v > 1 else 1)
    parallel = ParallelSpec(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep,
        sequence_parallel=draw(st.booleans()),
        zero_stage=draw(st.sampled_from([0, 0, 1, 3])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        virtual_pipeline_size=v,
        global_batch_size=m * mb * dp,
        micro_batch_size=mb,
        order=draw(st.sampled_from(ORDERS)),
        grad_bucket_size=draw(st.sampled_from([None, None, 1000])),
    )
    return model, parallel


# --- damaged logs, for fuzzing the parsers of real tools' output ---------------------------------------------------

#: Values a damaged log puts where a number or a JSON value was.
EXTREME_VALUES = ["1e400", "-1", "nan", "NaN", "inf", "0", "1e30", "99999999999999999999999", "-0", "1e-30", "N/A",
                  "x", "", "null", '"x"', "[]", "{}", "true", '"[0, 99]"', "100000000000000000000000000000000.0"]
_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


@st.composite
def damaged_log(draw, text: str, *, focus: str | None = None):
    """``text`` with 1-4 damages a real log suffers: lines lost, repeated (a header line inside a table, as two
    runs' outputs interleave), swapped or cut off; a number or JSON value replaced by an extreme or wrong value
    or scaled by up to 10^±30. ``focus`` (a regex): lines to damage by preference, so that a 240,000-line trace is
    damaged where its parser looks."""
    import re

    lines = text.split("\n")
    focused = [i for i, line in enumerate(lines) if focus and re.search(focus, line)] or list(range(len(lines)))
    for _ in range(draw(st.integers(1, 4))):
        if not lines:
            break
        i = draw(st.sampled_from(focused)) if focused and max(focused) < len(lines) else draw(
            st.integers(0, len(lines) - 1))
        kind = draw(st.sampled_from(["drop", "repeat", "swap", "value", "scale", "header", "cut", "garbage"]))
        if kind == "drop":
            del lines[i]
        elif kind == "repeat":
            lines.insert(draw(st.integers(0, len(lines))), lines[i])
        elif kind == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "header":
            headers = [line for line in lines if line.lstrip().startswith("#")]
            if headers:
                lines.insert(i, draw(st.sampled_from(headers)))
        elif kind == "cut":
            lines = lines[:i] + [lines[i][: draw(st.integers(0, len(lines[i])))]]
        elif kind == "garbage":
            lines.insert(i, draw(st.text(alphabet=st.characters(codec="utf-8"), max_size=40)))
        else:
            numbers = list(re.finditer(_NUMBER, lines[i]))
            if not numbers:
                continue
            m = draw(st.sampled_from(numbers))
            if kind == "value":
                new = draw(st.sampled_from(EXTREME_VALUES))
            else:
                new = repr(float(m.group()) * 10.0 ** draw(st.integers(-30, 30)))
            lines[i] = lines[i][: m.start()] + new + lines[i][m.end():]
    return "\n".join(lines)


@st.composite
def estimate_jobs(draw, *, max_world: int = 64, moe: bool | None = None):
    """A random valid job of :func:`jobs` with the estimate's overlap, attention, precision and gradient accumulation
    flags drawn too,
    and a few variants of its parallelism (micro-batch size, SP, recomputation, ZeRO) on the same layout."""
    from dataclasses import replace

    model, par = draw(jobs(max_world=max_world, moe=moe))
    sp = par.sequence_parallel
    par = replace(par, tp_comm_overlap=sp and draw(st.booleans()), overlap_grad_reduce=draw(st.booleans()),
                  overlap_param_gather=par.shards_optimizer and draw(st.booleans()),
                  attention=draw(st.sampled_from(["flash", "unfused"])),
                  fp8_format=draw(st.sampled_from([None, None, "hybrid"])),
                  gradient_accumulation_fusion=draw(st.booleans()),
                  stack=draw(st.sampled_from([None, None, "megatron-core-2024"])))
    variants = [par]
    for _ in range(draw(st.integers(0, 3))):
        mb = draw(st.sampled_from([1, 2]))
        sp = draw(st.booleans())
        variants.append(replace(par, micro_batch_size=mb, global_batch_size=par.num_micro_batches * mb * par.dp,
                                sequence_parallel=sp, tp_comm_overlap=False,
                                recompute=draw(st.sampled_from(["none", "selective", "full"])),
                                zero_stage=draw(st.sampled_from([0, 1, 3])), overlap_param_gather=False,
                                gradient_accumulation_fusion=draw(st.booleans())))
    return model, variants


@st.composite
def chakra_jobs(draw, *, max_world: int = 8):
    """A random job of :func:`estimate_jobs` (pp with and without interleaving, cp, sp, ZeRO 1-3, ep, uneven
    pipeline splits, the overlap flags, attention and precision), with what else the Chakra export branches on: the
    distributed optimizer and its parameter-gather overlap, the scatter/gather of pipeline messages, GPipe, and
    interleaving without p2p overlap."""
    from dataclasses import replace

    model, variants = draw(estimate_jobs(max_world=max_world, moe=None))
    par = draw(st.sampled_from(variants))
    if par.zero_stage == 0 and draw(st.booleans()):
        par = replace(par, distributed_optimizer=True, overlap_param_gather=draw(st.booleans()))
    if par.tp > 1 and par.pp > 1 and not par.sequence_parallel and draw(st.booleans()):
        par = replace(par, scatter_gather_tensors_in_pipeline=True)
    if par.pp > 1 and par.virtual_pipeline_size == 1 and draw(st.sampled_from([False, False, True])):
        par = replace(par, schedule="gpipe")
    if par.virtual_pipeline_size > 1:
        par = replace(par, overlap_p2p_comm=draw(st.booleans()))
    return model, par
