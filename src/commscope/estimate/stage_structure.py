"""What the closed form reads of a job's pipeline stages before it times any op: where each axis's groups sit, and
what each stage holds.

The closed form (:mod:`commscope.estimate.closed_form`) reduces the op sets of a Megatron job to counts per stage x
op time. What those counts and times depend on splits in two, each computed once and shared by every configuration
that has it: the layout alone (:class:`_Spans`: the span over nodes of the slowest group of every axis on every
stage, and the pipeline boundaries that cross nodes; once per tp, pp, dp, cp, ep and rank order, from the real
:class:`~commscope.pattern.layout.Layout`, in one vectorised pass per axis), and the layer split alone
(:class:`_Stages`: layers, parameters, FLOP and ZeRO-3 gathers per stage; once per tp, ep, pp, v and split, in closed
form over the stages). No Python loop runs per stage or layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from commscope.estimate.bandwidth import GroupSpan
from commscope.estimate.flops import token_flops
from commscope.pattern.layout import Layout
from commscope.pattern.workload.stages import pipeline_split, pipeline_split_note
from commscope.spec.params import embedding_params, end_params, layer_params

if TYPE_CHECKING:
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec


@dataclass(frozen=True, slots=True)
class _Spans:
    """Where the groups of one layout sit: for every axis, (n, num_nodes, per_node) of the slowest group on each
    stage (what the op-by-op path times each op set by), shape (3, pp), or (3, 1) where every stage's groups sit
    alike (:attr:`alike`); and which pipeline boundaries cross nodes."""

    tp: np.ndarray
    cp: np.ndarray
    """Of the context-parallel ring's (src, dst) pairs (its sends)."""
    dp: np.ndarray
    """Of the dp x cp groups (dense gradients)."""
    edp: np.ndarray
    """Of the expert-data-parallel groups (expert gradients)."""
    ep: np.ndarray
    pp_across: np.ndarray
    """(pp,) bool: some pipeline's boundary from stage s to stage (s + 1) mod pp crosses nodes."""
    emb: np.ndarray
    """(3,) the slowest (first stage, last stage) pair of the tied-embedding sync."""
    alike: bool = False
    """Every stage's groups sit as stage 0's: the axes' arrays are (3, 1), one column for every stage."""

    def axis(self, name: str, p: int) -> np.ndarray:
        """The (3, pp) array of axis ``name``, whichever way it is held."""
        x: np.ndarray = getattr(self, name)
        return np.broadcast_to(x, (3, p)) if self.alike else x


_NO_ROW = np.iinfo(np.int64).max


def _stage_spans(rows: np.ndarray, stage_of_row: np.ndarray, p: int, gpn: int) -> np.ndarray:
    """(3, p): the span of the slowest of ``rows`` (a (G, n) array of groups) on each stage, by
    :meth:`GroupSpan.slowest`'s order (crossing nodes first, then the fewest members on a node, then the most nodes),
    in one pass: each row's span is ranked by one integer and the smallest per stage kept. A stage without groups
    (or groups of one rank) gets n = 1, which times to 0 s."""
    n = rows.shape[1]
    if rows.shape[0] == 0 or n < 2:
        return np.ones((3, p), dtype=np.int64)
    if n == 2:  # pairs (sends, the embedding sync): apart or on one node
        apart = rows[:, 0] // gpn != rows[:, 1] // gpn
        num_nodes, per_node = 1 + apart, 2 - apart
    else:
        num_nodes, per_node = GroupSpan.row_spans(rows, gpn)
    inside = num_nodes.max() == 1  # every group inside a node (the common case)
    if p == 1:  # one stage, which has the groups
        return np.array([[n], [1], [n]], dtype=np.int64) if inside else _slowest_column(num_nodes, per_node, n)
    present = np.bincount(stage_of_row, minlength=p) > 0
    out = np.ones((3, p), dtype=np.int64)
    if inside:
        out[0], out[2] = np.where(present, n, 1), np.where(present, n, 1)
        return out
    rank = _rank(num_nodes, per_node, n)
    best = np.full(p, _NO_ROW)
    np.minimum.at(best, stage_of_row, rank)
    best = np.where(present, best, 0)
    out[0] = np.where(present, n, 1)
    out[1] = np.where(present, n - best % (n + 1), 1)
    out[2] = np.where(present, best // (n + 1) % (n + 1), 1)
    return out


def _rank(num_nodes: np.ndarray, per_node: np.ndarray, n: int) -> np.ndarray:
    """Each group's place in :meth:`GroupSpan.slowest`'s order as one integer, the slowest the smallest: (num_nodes
    == 1, per_node, -num_nodes) ascending (n + 1 > per_node and num_nodes <= n)."""
    out: np.ndarray = ((num_nodes == 1) * (n + 1) + per_node) * (n + 1) + (n - num_nodes)
    return out


def _slowest_column(num_nodes: np.ndarray, per_node: np.ndarray, n: int) -> np.ndarray:
    """(3, 1): the span of the slowest of groups of ``n`` ranks with these spans (:func:`_stage_spans` of one stage)."""
    best = int(_rank(num_nodes, per_node, n).min())
    return np.array([[n], [n - best % (n + 1)], [best // (n + 1) % (n + 1)]], dtype=np.int64)


_ONE = np.ones((3, 1), dtype=np.int64)


def _spans(par: ParallelSpec, gpn: int, moe: bool, cache: dict[tuple[Any, ...], tuple[np.ndarray, ...]] | None = None) -> _Spans:
    """:class:`_Spans` of ``par``'s layout (the expert groups only for an MoE model: a dense one has none to time).

    Where pp is the outermost axis of the rank order and a stage spans whole nodes (stage_stride a multiple of the
    GPUs per node), every stage's groups are stage 0's moved by whole nodes, so they sit alike: the axes' spans are
    those of stage 0 on every stage, which do not depend on pp (``cache``, keyed without it, holds them across
    layouts), and every pipeline boundary crosses nodes."""
    layout = Layout(par)
    p = par.pp
    stride = layout.stage_stride
    sizes = {"tp": par.tp, "cp": par.cp, "dp-cp": par.dp * par.cp, "expert-dp": par.expert_dp if moe else 1,
             "ep": par.ep if moe else 1}
    alike = par.order.endswith("-pp") and stride % gpn == 0

    def of(kind: str, pairs: bool = False) -> np.ndarray:
        if sizes[kind] < 2:
            return _ONE if alike else np.broadcast_to(_ONE, (3, p))
        if alike and not pairs:
            quick = _progression_span(layout, kind, gpn)
            if quick is not None:
                return quick
        groups = layout.first_stage_groups(kind) if alike else layout.groups(kind)
        stages = np.zeros(len(groups), dtype=np.int64) if alike else groups[:, 0] // stride % p
        if pairs:  # the ring's (src, dst) sends, as the workload's context-parallel op sets
            stages = np.repeat(stages, groups.shape[1])
            groups = np.stack([groups.reshape(-1), np.roll(groups, -1, axis=1).reshape(-1)], axis=1)
        return _stage_spans(groups, stages, 1 if alike else p, gpn)  # (alike: (3, 1), stage 0's)

    key = (par.tp, par.dp, par.cp, par.ep, par.order, gpn, moe)
    axes = cache.get(key) if alike and cache is not None else None
    if axes is None:
        axes = (of("tp"), of("cp", pairs=True), of("dp-cp"), of("expert-dp"), of("ep"))
        if alike and cache is not None:
            cache[key] = tuple(x[:, :1] for x in axes)
    if p > 1 and alike:
        # every pipeline's stages are whole nodes apart (rank r and r + s x stage_stride): each boundary, and every
        # embedding pair (first stage, last stage), crosses nodes, one rank on each
        across, emb_span = np.ones(p, dtype=bool), np.array([2, 2, 1], dtype=np.int64)
    elif p > 1:
        pp_nodes = layout.groups("pp") // gpn
        across = (pp_nodes != np.roll(pp_nodes, -1, axis=1)).any(axis=0)
        emb = layout.groups("emb")
        emb_span = _stage_spans(emb, np.zeros(len(emb), dtype=np.int64), 1, gpn)[:, 0]
    else:
        across, emb_span = np.zeros(1, dtype=bool), _ONE[:, 0]
    return _Spans(tp=axes[0], cp=axes[1], dp=axes[2], edp=axes[3], ep=axes[4], pp_across=across, emb=emb_span,
                  alike=alike)


def _progression_span(layout: Layout, kind: str, gpn: int) -> np.ndarray | None:
    """(3, 1): the span of stage 0's groups of ``kind`` without building them, where each is one arithmetic
    progression of ranks (its member axes of more than one rank adjacent in the order, but for axes of one) whose
    nodes follow from its stride alone: a stride of whole nodes puts every member on its own node, a group that fits
    an aligned block dividing the node stays inside one, and one whose block is whole nodes, its stride dividing
    the node, has the same members on each of them. None where none holds (the groups then decide)."""
    expert = kind in ("ep", "expert-dp")
    sizes = layout._expert_sizes if expert else layout._dense_sizes
    members = {"dp-cp": ("dp", "cp"), "expert-dp": ("dp",)}.get(kind, (kind,))
    wanted = sum(1 for axis in members if sizes[axis] > 1)
    stride, n, found = 1, 1, 0
    for axis in layout._order:
        size = 1 if axis == "pp" else sizes[axis]  # (stage 0 alone)
        if size == 1:
            continue
        if axis in members:
            n *= size
            found += 1
        elif found:  # an axis of more than one rank after a member: the progression ends here
            break
        else:
            stride *= size
    if found < wanted:  # a member beyond another axis: not one progression
        return None
    if stride % gpn == 0:
        return np.array([[n], [n], [1]], dtype=np.int64)
    if gpn % (stride * n) == 0:
        return np.array([[n], [1], [n]], dtype=np.int64)
    if gpn % stride == 0 and (stride * n) % gpn == 0:  # whole nodes, gpn / stride members on each
        return np.array([[n], [stride * n // gpn], [gpn // stride]], dtype=np.int64)
    return None


@dataclass(frozen=True, slots=True)
class _Stages:
    """What each pipeline stage holds under one layer split (arrays of length pp)."""

    layers: np.ndarray
    moe_layers: np.ndarray
    dense_params: np.ndarray
    """Parameters of one rank whose gradients the dp x cp group reduces."""
    expert_params: np.ndarray
    replicated: np.ndarray
    """Of those, copied on every TP rank (sequence parallelism all-reduces their gradients over TP)."""
    body_flop: np.ndarray
    """Forward FLOP per token of the stage's layers (:func:`commscope.estimate.flops.token_flops`)."""
    core_flop: np.ndarray
    """Of those, the attention core's."""
    zero3: np.ndarray | None
    """(3, pp, 3): per ZeRO-3 gather size of the dense parameters (a dense layer's, an MoE layer's when it differs,
    the embedding-side modules'): elements, gathers per micro-batch, op sets (None where not asked for)."""
    zero3_expert: np.ndarray | None
    """(3, pp, 1): the same for the expert parameters of the MoE layers."""
    split_note: str | None

    def num_buckets(self, bucket_elements: int | None) -> int:
        """Gradient buckets of the stage with the most (dense or expert parameters) at ``bucket_elements`` each."""
        if not bucket_elements:
            return 1
        most = max(int(self.dense_params.max(initial=0)), int(self.expert_params.max(initial=0)))
        return 1 if not most else -(-most // bucket_elements)


def _moe_before(model: ModelSpec, x: np.ndarray) -> np.ndarray:
    """Layers with routed experts among layers 0..x-1 (:meth:`ModelSpec.is_moe_layer`, counted in closed form)."""
    if not model.is_moe:
        return np.zeros_like(x)
    k, f = model.first_k_dense_layers, model.moe_layer_freq
    return np.where(x > k, -(-(x - k) // f), 0)


def _layer_kinds(model: ModelSpec) -> dict[str, int]:
    """The kinds of layer ``model`` has (``dense``, ``moe``), each with the index of one layer of it: every layer of
    a kind has the same GEMMs, parameters and FLOP. A dense layer is layer 0, or 1 where experts start at layer 0
    (with moe_layer_freq > 1); an MoE layer is the first after the first_k_dense_layers."""
    kinds = {}
    if model.num_layers > model.num_moe_layers:
        kinds["dense"] = 1 if model.is_moe and model.first_k_dense_layers == 0 else 0
    if model.num_moe_layers:
        kinds["moe"] = model.first_k_dense_layers
    return kinds


def _stage_layers(model: ModelSpec, parallel: ParallelSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(dense layers, MoE layers, dense parameters, expert parameters) of a rank of each stage, (pp,) each, without a
    loop over stages or layers: every layer of one kind has the same parameters; the first stage's first chunk
    adds the embedding, the last stage's last chunk the final norm and output layer
    (:func:`~commscope.spec.params.end_params`)."""
    p, v, tp, ep = parallel.pp, parallel.virtual_pipeline_size, parallel.tp, parallel.ep
    sizes = np.array(pipeline_split(model, parallel), dtype=np.int64)  # virtual stage k = chunk x pp + stage
    layers = sizes if v == 1 else sizes.reshape(v, p).sum(axis=0)
    if not model.is_moe:
        moe = np.zeros(p, dtype=np.int64)
    elif model.num_moe_layers == model.num_layers:  # every layer has experts (Mixtral)
        moe = layers
    else:  # MoE layers before each virtual stage's end less those before its start (the previous end)
        before = _moe_before(model, np.concatenate(([0], sizes)).cumsum())
        moe = before[1:] - before[:-1]
        moe = moe if v == 1 else moe.reshape(v, p).sum(axis=0)
    dense = layers - moe
    kinds = _layer_kinds(model)
    dense_of, expert_of = {}, {"moe": 0}  # (a kind the model lacks has no layers on any stage)
    for kind, index in kinds.items():
        lp = layer_params(model, index, tp=tp, ep=ep)
        dense_of[kind], expert_of[kind] = lp.tp_sharded // tp + lp.replicated, lp.expert // (ep * tp)
    ends = np.zeros(p, dtype=np.int64)
    emb = embedding_params(model, tp=tp)
    if p == 1 and v == 1:
        ends[0] = end_params(model, emb, tp=tp, first=True, last=True)
    else:
        ends[0] += end_params(model, emb, tp=tp, first=True, last=False)
        ends[p - 1] += end_params(model, emb, tp=tp, first=False, last=True)
    return dense, moe, ends + _per_stage(kinds, dense, moe, dense_of), moe * expert_of["moe"]


def _per_stage(kinds: dict[str, int], dense: np.ndarray, moe: np.ndarray, per_layer: dict[str, Any]) -> np.ndarray:
    """Each stage's sum of a quantity over its layers, ``per_layer`` giving it for one layer of each kind: dense
    layers x theirs + MoE layers x theirs, a kind the model lacks (``kinds``: :func:`_layer_kinds`) left out (it has
    no layers on any stage)."""
    out: np.ndarray | None = dense * per_layer["dense"] if "dense" in kinds else None
    if "moe" in kinds:
        out = moe * per_layer["moe"] if out is None else out + moe * per_layer["moe"]
    assert out is not None, "a model has layers"
    return out


def _stages(model: ModelSpec, par: ParallelSpec, zero3: bool = True,
            layers: tuple[np.ndarray, ...] | None = None) -> _Stages:
    """:class:`_Stages` of ``par``'s split, without a loop over stages or layers: every layer of one kind (dense,
    MoE) has the same parameters and FLOP, so a stage is its count of each kind plus the first and last stage's
    embedding-side modules (the ZeRO-3 gathers only with ``zero3``: what no configuration shards is not worked out;
    ``layers``: :func:`_stage_layers` of ``par``, where the caller has them)."""
    p, tp, ep = par.pp, par.tp, par.ep
    dense, moe, dense_params, expert_params = layers or _stage_layers(model, par)
    per_stage = dense + moe
    tf = token_flops(model)
    zero = {"dense": 0, "moe": 0}
    shard, repl, expert, flop, core = dict(zero), dict(zero), dict(zero), {"dense": 0.0, "moe": 0.0}, {"dense": 0.0, "moe": 0.0}
    kinds = _layer_kinds(model)
    for kind, index in kinds.items():
        lp = layer_params(model, index, tp=tp, ep=ep)
        shard[kind], repl[kind] = lp.tp_sharded // tp + lp.replicated, lp.replicated
        expert[kind] = lp.expert // (ep * tp)
        flop[kind], core[kind] = tf.layers[index], tf.attention_core[index]

    replicated = _per_stage(kinds, dense, moe, repl)  # (a new array) and the last stage's final norm:
    replicated[p - 1] += model.hidden_size * (2 if model.normalization == "layernorm" else 1)
    z3 = zx = None
    if zero3:
        emb = embedding_params(model, tp=tp)
        z3, zx = _zero3(p, dense, moe, shard, expert,
                        lambda first, last: end_params(model, emb, tp=tp, first=first, last=last))
    return _Stages(
        layers=per_stage, moe_layers=moe,
        dense_params=dense_params, expert_params=expert_params, replicated=replicated,
        body_flop=_per_stage(kinds, dense, moe, flop), core_flop=_per_stage(kinds, dense, moe, core),
        zero3=z3, zero3_expert=zx,
        split_note=pipeline_split_note(model, par))


def _zero3(p: int, dense: np.ndarray, moe: np.ndarray, shard: dict[str, int], expert: dict[str, int],
           ends: Any) -> tuple[np.ndarray, np.ndarray]:
    """:attr:`_Stages.zero3` and :attr:`_Stages.zero3_expert` (``ends(first, last)``: the embedding-side parameters of
    a stage that is the first and/or the last)."""
    # ZeRO-3 gathers each layer's parameters, and the embedding-side modules of the stage (as the first and last
    # stage, whatever its chunks) as one more, once per micro-batch; layers of equal size share an op set
    z = np.zeros((3, p, 3), dtype=np.int64)  # (elements, gathers per micro-batch, op sets) x stage x gather size
    z[0, :, 0], z[0, :, 1] = shard["dense"], shard["moe"]
    whole = z[0, :, 2]
    whole[0] = ends(True, p == 1)
    if p > 1:
        whole[p - 1] = ends(False, True)
    whole[1:p - 1] = ends(False, False)
    if shard["moe"] == shard["dense"]:
        z[1, :, 0] = dense * (shard["dense"] > 0) + moe * (shard["moe"] > 0)
    else:
        z[1, :, 0], z[1, :, 1] = dense * (shard["dense"] > 0), moe * (shard["moe"] > 0)
    z[1, :, 2] = whole > 0
    z[2] = z[1] > 0
    zx = np.zeros((3, p, 1), dtype=np.int64)
    zx[0] = expert["moe"]
    zx[1, :, 0] = moe * (expert["moe"] > 0)
    zx[2] = zx[1] > 0
    return z, zx
