"""The closed form: the refined estimate of Megatron jobs with balanced routing, on (configurations, stages) arrays.

:func:`commscope.estimate.estimate` answers one configuration with it (:func:`estimate_one`), and
:mod:`commscope.estimate.many` many at once. The structure of each job (the spans of its layout, what each stage
holds under its layer split: :mod:`commscope.estimate.stage_structure`) is computed once per layout and per split;
the configurations are read as columns (:class:`_Arrays`); the op sets of :mod:`commscope.pattern.workload.dense`
then reduce to counts per stage x op time (:func:`_communication`), and the pipeline schedule of the op-by-op path
(:mod:`commscope.estimate.op_by_op`) runs on those arrays (:func:`_evaluate`). No Python loop runs per stage or
layer, so the cost does not grow with the pipeline depth or the layers; tests/estimate/test_estimate_many.py holds
it equal to the op-by-op path on random jobs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np

from commscope.estimate.bandwidth import _alpha_beta_numbers, _alpha_beta_terms
from commscope.estimate.compute.effects import comm_sm_time_s
from commscope.estimate.compute.model import StageCompute, first_max
from commscope.estimate.flops import token_flops
from commscope.estimate.overlap import HIDDEN_MIN_S, OVERLAP_NOTES, _late_gathers, _overlapped_buckets
from commscope.estimate.stage_structure import _spans, _Spans, _stages, _Stages
from commscope.estimate.terms import Estimate, finish_many
from commscope.units import dtype_bytes

if TYPE_CHECKING:
    from commscope.estimate.gpus import GpuSpec
    from commscope.spec.cluster import ClusterSpec
    from commscope.spec.model import ModelSpec
    from commscope.spec.parallel import ParallelSpec

#: More gradient buckets than this on one stage (a tiny ``grad_bucket_size`` on a large model) go op by op: the
#: bucket overlap is a recurrence over buckets, and the arrays hold one entry per bucket.
MAX_GRAD_BUCKETS = 256

#: The axes of the reported mean bus bandwidth, in the order the op-by-op path meets their op sets (layers: TP, CP,
#: EP; stages: PP; step: DP, embedding sync), so that both print them alike.
_EFF_AXES = ("tp", "cp", "ep", "pp", "dp", "emb")


# --------------------------------------------------------------------------------------- configurations as columns


#: What the closed form reads of a ParallelSpec, one column each (properties included).
_FIELDS = ("tp", "pp", "dp", "cp", "ep", "virtual_pipeline_size", "order", "pipeline_layers",
           "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers", "micro_batch_size",
           "global_batch_size", "sequence_parallel", "recompute", "zero_stage", "shards_optimizer", "framework",
           "attention", "fp8_format", "grad_reduce_dtype", "gradient_accumulation_fusion",
           "scatter_gather_tensors_in_pipeline", "tp_comm_overlap", "overlap_p2p_comm", "overlap_grad_reduce",
           "overlap_param_gather", "grad_bucket_elements", "world_size", "stack")
_ROW = attrgetter(*_FIELDS)
#: The columns each key is made of: the layout (spans), the layer split (stages), the job's validity
#: (:func:`commscope.pattern.workload.dense.check_job`).
_SPANS_KEY = ("tp", "pp", "dp", "cp", "ep", "order")
_STAGES_KEY = ("tp", "ep", "pp", "virtual_pipeline_size", "pipeline_layers", "decoder_first_pipeline_num_layers",
               "decoder_last_pipeline_num_layers")
_CHECK_KEY = ("micro_batch_size", "cp", "sequence_parallel", *_STAGES_KEY)


def _keys(columns: dict[str, tuple[Any, ...]], names: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """The distinct keys made of columns ``names`` (in order of first appearance) and each row's index into them."""
    keys = list(zip(*(columns[n] for n in names)))
    first = {k: i for i, k in enumerate(dict.fromkeys(keys))}
    return list(first), np.fromiter(map(first.__getitem__, keys), dtype=np.int64, count=len(keys))


#: The columns the arrays read as numbers (the others stay Python values).
_NUMERIC = ("tp", "cp", "ep", "dp", "pp", "micro_batch_size", "global_batch_size", "virtual_pipeline_size",
            "sequence_parallel", "zero_stage", "shards_optimizer", "scatter_gather_tensors_in_pipeline",
            "tp_comm_overlap", "overlap_p2p_comm", "overlap_grad_reduce", "overlap_param_gather", "world_size")


def _numeric(columns: dict[str, tuple[Any, ...]]) -> dict[str, np.ndarray]:
    """The :data:`_NUMERIC` columns as int64 arrays (flags as 0/1), with the gradient bucket size (0: one bucket per
    stage) and full recomputation."""
    out = dict(zip(_NUMERIC, np.array([columns[name] for name in _NUMERIC], dtype=np.int64)))  # (rows of one array)
    out["grad_bucket_elements"] = np.array([b or 0 for b in columns["grad_bucket_elements"]], dtype=np.int64)
    out["full_recompute"] = np.array([r == "full" for r in columns["recompute"]])
    return out


def _distinct(items: Sequence[Any] | dict[int, Any], index: np.ndarray) -> tuple[list[Any], np.ndarray | None]:
    """The distinct ``items`` that rows ``index`` into, and each row's index among them (None: one item for all)."""
    if len(index) == 1 or len(items) == 1:
        return [items[int(index[0])]], None
    keys, local = np.unique(index, return_inverse=True)
    return [items[k] for k in keys.tolist()], local


def _first_rows(index: np.ndarray, count: int) -> list[int]:
    """The first row of each of ``count`` keys."""
    first = np.full(count, len(index))
    np.minimum.at(first, index, np.arange(len(index)))
    out: list[int] = first.tolist()
    return out


def estimate_one(model: ModelSpec, cluster: ClusterSpec, par: ParallelSpec, compute: StageCompute | None, u: float,
                 notes: list[str], gpu: GpuSpec | None = None,
                 layers: tuple[np.ndarray, ...] | None = None) -> Estimate | None:
    """:func:`estimate` of one Megatron job with balanced routing, whose compute per stage the caller has
    (``compute``: ``gpu``'s compute model; None: FLOP / (u x peak)) and whose job is checked; None where the op-by-op
    path must answer (more than :data:`MAX_GRAD_BUCKETS` gradient buckets on a stage). ``layers``: the job's
    :func:`~commscope.estimate.stage_structure._stage_layers`, where the caller has them."""
    st = _stages(model, par, zero3=par.zero_stage == 3, layers=layers)
    if st.num_buckets(par.grad_bucket_elements) > MAX_GRAD_BUCKETS:
        return None
    columns = dict(zip(_FIELDS, ((x,) for x in _ROW(par))))
    zero = np.zeros(1, dtype=np.int64)
    a = _Arrays(model, [par], _numeric(columns), columns, zero, {0: _spans(par, cluster.gpus_per_node, model.is_moe)},
                zero, [st], zero, one=True)
    if compute is None:
        peak = cluster.peak_flops_for(model.dtype)
        return _evaluate(model, cluster, a, _flop_arrays(model, a, u, peak), [()], None, u, notes)[0]
    zeros = np.zeros(par.pp)
    keys, values = zip(*(
        ("fwd", compute.forward_s), ("bwd", compute.backward_s), ("att", compute.attention_s),
        ("lin_f", compute.linear_forward_s), ("lin_b", compute.linear_backward_s), ("opt", compute.optimizer_s),
        ("gemm", compute.gemm_s), ("mem", compute.memory_s), ("rec", compute.recompute_s), ("flop", compute.flop),
        ("clock", compute.clock_s), ("chunks", compute.chunks_s), ("gaps", compute.gaps_s), ("stack", compute.stack_s),
        ("stack_opt", compute.stack_opt_s)))
    # one (kinds, 1, pp) array, each kind a (1, pp) view of it
    c = dict(zip(keys, np.array([zeros if v is None else v for v in values], dtype=np.float64)[:, None, :]))
    return _evaluate(model, cluster, a, c, [compute.notes], gpu, u, notes)[0]


# ------------------------------------------------------------------------------------- arrays of configurations


class _Arrays:
    """The configurations of one pipeline depth as columns (n, 1), their structure as (n, p) arrays. With ``one``
    (one configuration: :func:`estimate_one`) the columns are numpy scalars in place of (1, 1) arrays: the same
    arithmetic, to the bit (numpy's scalars compute as its arrays do), without an array's overhead on each of the
    few hundred operations of one estimate; what reads a column per configuration goes through :func:`_per_config`,
    what broadcasts one over buckets through :func:`_per_bucket`."""

    def __init__(self, model: ModelSpec, parallels: Sequence[ParallelSpec], numeric: dict[str, np.ndarray],
                 columns: dict[str, tuple[Any, ...]], rows: np.ndarray, spans: dict[int, _Spans], spans_index: np.ndarray,
                 stages: Sequence[_Stages], stages_index: np.ndarray, one: bool = False) -> None:
        self.n = len(rows)
        self.rows = rows
        self.columns, self.numeric = columns, numeric
        self.pars = [parallels[i] for i in rows.tolist()]
        # every configuration of the columns, in order (one estimate's, often all of a sweep's at one depth): the
        # columns themselves, not copies picked row by row
        n_all = len(numeric["tp"])
        self._all = self.n == n_all and (n_all == 1 or bool((rows == np.arange(n_all)).all()))

        def col(name: str) -> Any:
            column = self.column(name)
            return column[0] if one else column[:, None]

        self.tp, self.cp, self.ep, self.dp = col("tp"), col("cp"), col("ep"), col("dp")
        self.p = int(numeric["pp"][rows[0]])
        self.mb, self.gb, self.v = col("micro_batch_size"), col("global_batch_size"), col("virtual_pipeline_size")
        self.m = self.gb // (self.mb * self.dp)
        self.sp = (col("sequence_parallel") > 0) & (self.tp > 1)
        self.full = col("full_recompute")
        self.zero3 = col("zero_stage") == 3
        self.shards = col("shards_optimizer") > 0
        self.gather = (col("scatter_gather_tensors_in_pipeline") > 0) & (self.tp > 1) & ~self.sp
        self.bucket = col("grad_bucket_elements")
        # bytes of a reduced gradient element (commscope.pattern.workload.framework.grad_dtype)
        reduce_dtype = self.values("grad_reduce_dtype")
        size = {g: dtype_bytes(g or ("fp32" if model.dtype == "bf16" else model.dtype)) for g in set(reduce_dtype)}
        G = np.array([size[g] for g in reduce_dtype], dtype=np.int64)
        self.G = G[0] if one else G[:, None]
        # the distinct structures of these rows, stacked once and indexed per row (one: a view repeated n times)
        st, st_local = _distinct(stages, stages_index)
        sp, sp_local = _distinct(spans, spans_index)

        def per_row(items: list[Any], local: np.ndarray | None, name: str) -> np.ndarray:
            if local is None:
                one = getattr(items[0], name)
                return one[None] if self.n == 1 else np.broadcast_to(one, (self.n, *one.shape))
            out: np.ndarray = np.stack([getattr(x, name) for x in items])[local]
            return out

        for name in ("layers", "moe_layers", "dense_params", "expert_params", "replicated", "body_flop", "core_flop"):
            setattr(self, "st_" + name, per_row(st, st_local, name))
        for name in ("zero3", "zero3_expert"):  # (None: no configuration here shards its parameters)
            setattr(self, "st_" + name, None if st[0].zero3 is None else per_row(st, st_local, name))
        self.split_notes = ([st[0].split_note] * self.n if st_local is None
                            else [st[k].split_note for k in st_local.tolist()])
        # (n, p) each of n, num_nodes, per_node; (n, 1) where every stage's groups sit alike in every layout here
        alike = all(x.alike for x in sp)
        for name in ("tp", "cp", "dp", "edp", "ep"):
            if alike or sp_local is None:
                x = per_row(sp, sp_local, name)
            else:  # (some layouts' columns to their stages)
                x = np.stack([y.axis(name, self.p) for y in sp])[sp_local]
            if one and x.shape[2] == 1:  # one configuration whose stages sit alike: its group's numbers
                setattr(self, "span_" + name, tuple(x[0, :, 0].tolist()))
            else:
                setattr(self, "span_" + name, (x[:, 0], x[:, 1], x[:, 2]))
        self.pp_across = per_row(sp, sp_local, "pp_across")
        x = per_row(sp, sp_local, "emb")
        self.span_emb = tuple(x[0].tolist()) if one else (x[:, 0:1], x[:, 1:2], x[:, 2:3])

    def column(self, name: str) -> np.ndarray:
        """A numeric column's values for these rows, (n,)."""
        column = self.numeric[name]
        out: np.ndarray = column if self._all else column[self.rows]
        return out

    def any(self, name: str) -> bool:
        """Whether a numeric column is set (non-zero) in any of these rows."""
        column = self.column(name)
        return bool(column[0]) if self.n == 1 else bool(column.any())

    def flags(self, name: str) -> np.ndarray:
        """A boolean column."""
        out: np.ndarray = self.column(name)[:, None] > 0
        return out

    def values(self, name: str) -> list[Any]:
        """A column's values for these rows."""
        column = self.columns[name]
        return list(column) if self._all else [column[i] for i in self.rows.tolist()]

    # set in __init__ (typed here for mypy)
    st_layers: np.ndarray
    st_moe_layers: np.ndarray
    st_dense_params: np.ndarray
    st_expert_params: np.ndarray
    st_replicated: np.ndarray
    st_body_flop: np.ndarray
    st_core_flop: np.ndarray
    st_zero3: np.ndarray | None
    st_zero3_expert: np.ndarray | None
    # (n, num_nodes, per_node) of each axis's groups: (n, p) or (n, 1) arrays each, or one group's numbers
    span_tp: tuple[Any, Any, Any]
    span_cp: tuple[Any, Any, Any]
    span_dp: tuple[Any, Any, Any]
    span_edp: tuple[Any, Any, Any]
    span_ep: tuple[Any, Any, Any]


class _Times:
    """Alpha-beta op times and bus bandwidths (:func:`commscope.estimate.bandwidth.alpha_beta_time_s`, the same arithmetic in
    the same order) with each (op, span)'s latency, bus factor and bandwidth worked out once: on numbers where the
    span is one (one configuration whose stages sit alike, or a pair on fixed nodes), else on its arrays."""

    def __init__(self, cluster: ClusterSpec, spans: dict[str, tuple[Any, Any, Any]]) -> None:
        self.cluster, self.spans = cluster, spans
        self._terms: dict[tuple[str, str], tuple[Any, ...]] = {}
        self._busbw: dict[tuple[str, str], Any] = {}
        self._numbers: dict[str, tuple[int, int, int] | None] = {}
        self._alone: dict[str, Any] = {}

    def _plain(self, span: str) -> tuple[int, int, int] | None:
        """``span`` as one group's numbers (n, num_nodes, per_node) where it is one (every entry of its arrays the
        one), else None; read once per span."""
        if span not in self._numbers:
            n, nodes, k = self.spans[span]
            if not isinstance(n, np.ndarray):  # given as numbers
                self._numbers[span] = (int(n), int(nodes), int(k))
            else:
                self._numbers[span] = (int(n[0, 0]), int(nodes[0, 0]), int(k[0, 0])) if n.shape == (1, 1) else None
        return self._numbers[span]

    def per_bucket(self, span: str) -> str:
        """The span of ``span``'s groups for (n, p, k) arrays (gradient buckets, ZeRO-3 gather sizes): one given as
        numbers broadcasts as it is; arrays gain an axis."""
        if self._plain(span) is not None:
            return span
        name = span + "3"
        if name not in self.spans:
            self.spans[name] = tuple(x[:, :, None] for x in self.spans[span])
        return name

    def alone(self, span: str) -> Any:
        """Where ``span``'s groups are of one rank (they send nothing): np.True_ (one group's numbers) or a boolean
        array, None where none is."""
        if span not in self._alone:
            numbers = self._plain(span)
            if numbers is not None:
                self._alone[span] = np.True_ if numbers[0] < 2 else None
            else:
                alone = np.asarray(self.spans[span][0]) < 2
                self._alone[span] = alone if alone.any() else None
        return self._alone[span]

    def terms(self, op: str, span: str) -> tuple[Any, ...]:
        """(latency, bus factor, bus bandwidth, group of one) of ``op`` on ``span`` (the last None where no group
        is of one rank)."""
        # all_gather and reduce_scatter have one formula (steps n - 1, bus factor (n - 1) / n: bandwidth.py's docstring)
        key = ("all_gather" if op == "reduce_scatter" else op, span)
        out = self._terms.get(key)
        if out is None:
            numbers = self._plain(span)
            if numbers is not None:
                n, nodes, k = numbers
                steps, alpha, f, bw = _alpha_beta_numbers(self.cluster, op, n, nodes, k)
            else:
                n_arr, nodes_arr, k_arr = self.spans[span]
                steps, alpha, f, bw = _alpha_beta_terms(self.cluster, op, np.ones(np.shape(n_arr)), n_arr, nodes_arr,
                                                        k_arr)
            out = self._terms[key] = (steps * alpha, f, bw, self.alone(span))
        return out

    def t(self, op: str, size: Any, span: str) -> Any:
        latency, f, bw, alone = self.terms(op, span)
        if isinstance(latency, float) and not isinstance(size, np.ndarray):  # a number on a plain span: a float
            x = float(size)
            return 0.0 if alone is not None or x <= 0 else latency + x * f / bw
        # (an integer array is converted by the arithmetic itself: int64 x float64 is float64(size) x float64)
        size = size if isinstance(size, np.ndarray) else np.asarray(size, dtype=np.float64)
        if size.size == 1 and isinstance(latency, float):  # one number on a plain span: the same arithmetic on floats
            x = float(size.reshape(-1)[0])
            return np.array(0.0 if alone is not None or x <= 0 else latency + x * f / bw).reshape(size.shape)
        return np.where(size <= 0 if alone is None else alone | (size <= 0), 0.0, latency + size * f / bw)

    def busbw(self, op: str, span: str) -> Any:
        """:func:`commscope.estimate.bandwidth.alpha_beta_busbw_bytes_per_s`."""
        key = ("all_gather" if op == "reduce_scatter" else op, span)
        out = self._busbw.get(key)
        if out is None:
            _, _, bw, alone = self.terms(op, span)
            out = self._busbw[key] = bw if alone is None else np.where(alone, self.cluster.intra_node.bandwidth_bytes_per_s, bw)
            if not isinstance(out, np.ndarray) or out.ndim == 0:
                out = self._busbw[key] = float(out)
        return out


def _flop_arrays(model: ModelSpec, a: _Arrays, u: float, peak: float) -> dict[str, np.ndarray]:
    """The FLOP / (u x peak) compute of :func:`commscope.estimate.estimate_op_by_op` for every configuration (n, p)."""
    tf = token_flops(model)
    p = a.p
    tokens_mb = a.mb * model.seq_len / a.cp
    rate = a.tp * u * peak
    f = a.st_body_flop + np.where(np.arange(p) == p - 1, tf.logits, 0.0)[None, :]
    rc = np.array(a.values("recompute"))[:, None]
    extra = np.where(rc == "selective", a.st_core_flop, np.where(rc == "full", a.st_body_flop, 0.0))
    fwd = tokens_mb * f / rate
    bwd = tokens_mb * (2 * f + extra) / rate
    att = tokens_mb * (3 * a.st_core_flop) / rate
    return {"fwd": fwd, "bwd": bwd, "att": att, "lin_f": fwd, "lin_b": bwd, "opt": np.zeros_like(fwd)}


# ---------------------------------------------------------------------------------------------- communication


class _BusBw:
    """Each axis's bus bandwidth summed over its op sets, and how many op sets, per configuration: what the mean bus
    bandwidth of :attr:`Estimate.effective_bandwidth_bytes_per_s` is made of (:func:`_dicts`)."""

    __slots__ = ("counts", "sums", "times")

    def __init__(self, times: _Times) -> None:
        self.times = times
        self.sums: dict[str, Any] = {}
        self.counts: dict[str, Any] = {}

    def add(self, axis: str, op: str, span: str, count: Any) -> None:
        """Add ``count`` op sets per stage (n, p) at ``span`` to the axis's mean bus bandwidth (a group of one
        rank has no op set)."""
        T = self.times
        alone = T.alone(span)
        cnt = count if alone is None else np.where(alone, 0, count)
        sums, counts = (cnt * T.busbw(op, span)).sum(axis=1), cnt.sum(axis=1)
        self.sums[axis] = self.sums[axis] + sums if axis in self.sums else sums
        self.counts[axis] = self.counts[axis] + counts if axis in self.counts else counts


#: One axis's communication per stage, (n, p) each: in the forward passes, the backward passes, once per iteration.
_AxisComm = dict[str, np.ndarray]


def _communication(model: ModelSpec, a: _Arrays, T: _Times, bb: _BusBw,
                   z: np.ndarray) -> tuple[dict[str, _AxisComm], list[np.ndarray], list[np.ndarray]]:
    """Every configuration's communication op by op in closed form: the op sets of
    :mod:`commscope.pattern.workload.dense` as counts per stage x op time, for each axis (``z``: zeros, (n, p), for
    what an axis does not send); and the data-parallel step's gradient and parameter buckets, (n, p) each."""
    p = a.p
    B = model.dtype_bytes
    tokens = a.mb * model.seq_len // a.cp
    act = tokens * model.hidden_size * B
    stage = np.arange(p)[None, :]
    first, last = stage == 0, stage == p - 1
    comm = {axis: {"fwd": z, "bwd": z, "iter": z} for axis in _EFF_AXES}
    has_layers = a.st_layers > 0
    if _any(a.tp > 1):
        comm["tp"] = _tp_comm(a, T, bb, tokens, act, first, last, has_layers)
    if _any(a.cp > 1):
        comm["cp"] = _cp_comm(model, a, T, bb, tokens, has_layers, z)
    if model.is_moe and _any(a.ep > 1):
        comm["ep"] = _ep_comm(model, a, T, bb, tokens, z)
    if p > 1:
        comm["pp"] = _pp_comm(a, T, bb, act, last, z)
    comm["dp"], grad_buckets, param_buckets = _dp_comm(model, a, T, bb, z)
    if p > 1 and model.tied_embeddings:
        t_emb = T.t("all_reduce", _emb_elements(model, a.tp) * a.G, "emb")
        comm["emb"] = {"fwd": z, "bwd": z, "iter": (first | last) * t_emb}
        bb.add("emb", "all_reduce", "emb", np.ones((a.n, 1), dtype=np.int64))
    return comm, grad_buckets, param_buckets


def _tp_comm(a: _Arrays, T: _Times, bb: _BusBw, tokens: np.ndarray, act: np.ndarray, first: np.ndarray,
             last: np.ndarray, has_layers: np.ndarray) -> _AxisComm:
    """Tensor parallelism: each layer's all-reduces (all-gathers and reduce-scatters with sequence parallelism), the
    embedding's and the logits' on the first and last stage, and the gradients of the replicated parameters."""
    t, L, m, sp, full = T.t, a.st_layers, a.m, a.sp, a.full
    # (all_gather and reduce_scatter of one size take one time: the reduce-scatters below are the all-gathers' times)
    t_ar, t_ag = t("all_reduce", act, "tp"), t("all_gather", act, "tp")
    t_ce = t("all_reduce", tokens * dtype_bytes("fp32"), "tp")
    lm = L * m
    rec = 1 + full
    ag_m = t_ag * m
    # each layer's 2 all-gathers and 2 reduce-scatters with SP (4 t_ag lm: a power of two times t_ag lm, the same
    # float whichever is multiplied first), else its 2 all-reduces
    f = _where(sp, 4 * t_ag, 2 * t_ar) * lm
    b = f * rec
    either, sp_only = _where(sp, ag_m, t_ar * m), _where(sp, ag_m, 0.0)
    f = f + first * either
    b = b + first * sp_only
    f = f + last * (sp_only + t_ce * (3 * m))
    b = b + last * either
    repl = a.st_replicated * a.G
    # (t is 0 s where nothing is sent: the replicated gradients' all-reduce is its time where SP runs)
    none = np.zeros(np.shape(f))  # (no configuration here with SP: no all-reduce timed)
    out = {"fwd": f, "bwd": b, "iter": _where(sp, t("all_reduce", repl, "tp"), none) if _any(sp) else none}
    # the layers' op sets (of each of AG and RS with SP, of AR twice that without) and the embedding's on the first
    # stage (counts as integers: numpy adds two boolean arrays as a logical or, which would count the last stage's
    # cross-entropy and sequence-parallel gradient all-reduces as one)
    sets = has_layers * (2 * (2 + full)) + first
    if _any(sp):
        # as many reduce-scatters as all-gathers, at the same bus bandwidth: one add of twice the count (the axis's
        # first add: 0 + 2 S is (0 + S) + S to the bit)
        bb.add("tp", "all_gather", "tp", 2 * _where(sp, sets + last, 0))
    bb.add("tp", "all_reduce", "tp", _where(sp, last.astype(np.int64) + (repl > 0), sets + 2 * last))
    return out


def _cp_comm(model: ModelSpec, a: _Arrays, T: _Times, bb: _BusBw, tokens: np.ndarray, has_layers: np.ndarray,
             z: np.ndarray) -> _AxisComm:
    """Context parallelism: the ring attention's K/V sends of every layer, cp - 1 steps forward, twice that backward
    (and once more with full recomputation)."""
    L, m, full = a.st_layers, a.m, a.full
    kv = 2 * tokens * np.maximum(1, model.kv_heads // a.tp) * model.head_size * model.dtype_bytes
    t_kv = T.t("send", kv, "cp")
    steps_bwd = 2 * (a.cp - 1) + _where(full, a.cp - 1, 0)
    bb.add("cp", "send", "cp", has_layers * 2)
    return {"fwd": t_kv * (L * m * (a.cp - 1)), "bwd": t_kv * (L * m * steps_bwd), "iter": z}


def _ep_comm(model: ModelSpec, a: _Arrays, T: _Times, bb: _BusBw, tokens: np.ndarray, z: np.ndarray) -> _AxisComm:
    """Expert parallelism under balanced routing: each MoE layer's token counts all-gathered, and its dispatch and
    combine all-to-alls forward and backward."""
    t, m = T.t, a.m
    nm = a.st_moe_layers
    routed = _where(a.sp, tokens // a.tp, tokens)  # commscope.moe.routing.routed_tokens_per_rank
    # balanced routing: every rank sends routed x top_k tokens in all (balanced_routing's rows sum to that)
    t_a2a = t("all_to_all", routed * model.top_k * model.hidden_size * model.dtype_bytes, "ep")
    t_cnt = t("all_gather", a.ep * model.num_experts * 8, "ep")
    with_moe = nm > 0
    bb.add("ep", "all_gather", "ep", with_moe)
    bb.add("ep", "all_to_all", "ep", 4 * with_moe)
    nm_m = nm * m
    a2a = 2 * t_a2a * nm_m  # ((2 t) nm is 2 (t nm) to the bit: a power of two)
    return {"fwd": t_cnt * nm_m + a2a, "bwd": a2a, "iter": z}


def _pp_comm(a: _Arrays, T: _Times, bb: _BusBw, act: np.ndarray, last: np.ndarray, z: np.ndarray) -> _AxisComm:
    """Pipeline parallelism: the activations and gradients sent across every stage boundary (inside a node or across
    nodes), and Megatron's scatter/gather of them over the receiver's TP group."""
    t, m = T.t, a.m
    size = _where(a.sp | a.gather, act // a.tp, act)  # (the pieces a TP rank sends)
    # boundaries from stage s to (s + 1) mod p: v - 1 of them from the last stage (chunk k to chunk k + 1), v from
    # every other; half of each transfer counts on the sender's stage, half on the receiver's
    count = a.v - last  # (n, p)
    across = a.pp_across
    if across.all():  # (boundaries of one kind: the other kind's add 0 s and no op set)
        parts = [("across", count)]
    elif not across.any():
        parts = [("inside", count)]
    else:
        parts = [("inside", count * ~across), ("across", count * across)]
    half = z
    for span, k in parts:
        half = _total(z, half, (k + _roll1(k)) * (t("send", size, span) * m / 2))
        bb.add("pp", "send", span, 2 * k)
    out = {"fwd": half, "bwd": half, "iter": z}
    if _any(a.gather):  # Megatron's scatter/gather: the receiver all-gathers the pieces over its TP group
        into, out_of = _roll1(count) * a.gather, count * a.gather
        t_gather = t("all_gather", act, "tp") * m
        out = {"fwd": half + into * t_gather, "bwd": half + out_of * t_gather, "iter": z}
        bb.add("pp", "all_gather", "tp", into + out_of)
    return out


def _where(cond: Any, x: Any, y: Any) -> Any:
    """``np.where(cond, x, y)``, or ``x`` or ``y`` itself where ``cond`` holds everywhere or nowhere (a group of
    configurations that all have a feature, or none; one estimate's flag, a number), which is what np.where would
    pick."""
    if not isinstance(cond, np.ndarray):
        return x if cond else y
    if cond.all():
        return x
    return y if not cond.any() else np.where(cond, x, y)


def _any(x: Any) -> bool:
    """Whether a flag holds for any configuration (an array of them, or one estimate's number)."""
    return bool(x.any()) if isinstance(x, np.ndarray) else bool(x)


def _per_config(x: Any) -> np.ndarray:
    """A column's entry per configuration, (n,): of an (n, 1) array, or of one estimate's number."""
    out: np.ndarray = x[:, 0] if isinstance(x, np.ndarray) else np.array([x])
    return out


def _per_bucket(x: Any) -> Any:
    """A column or (n, p) array given an axis of buckets (or ZeRO-3 gather sizes), (n, p, 1); one estimate's
    number broadcasts as it is."""
    return x[:, :, None] if isinstance(x, np.ndarray) else x


def _total(z: np.ndarray, *terms: np.ndarray) -> np.ndarray:
    """``z + terms[0] + terms[1] + ...`` in that order, the terms that are ``z`` itself (zeros: what an axis that
    sends nothing, or an overlap that hides nothing, comes to) left out: adding zeros changes no sum."""
    out = z
    for x in terms:
        if x is not z:
            out = x if out is z else out + x
    return out


def _roll1(x: np.ndarray) -> np.ndarray:
    """``np.roll(x, 1, axis=1)`` (stage s's entry from stage s - 1's) without np.roll's overhead on small arrays."""
    return np.concatenate((x[:, -1:], x[:, :-1]), axis=1)


def _dp_comm(model: ModelSpec, a: _Arrays, T: _Times, bb: _BusBw,
             z: np.ndarray) -> tuple[_AxisComm, list[np.ndarray], list[np.ndarray]]:
    """Data parallelism, of the dense parameters over dp x cp and of the experts' over the expert-data-parallel
    group: the gradient buckets reduced and the parameter buckets gathered once per iteration (returned apart: their
    overlap is a recurrence over them), and ZeRO-3's per-layer gathers and reduce-scatters in the passes."""
    t, m, B = T.t, a.m, model.dtype_bytes
    grad_buckets: list[np.ndarray] = []  # (n, p) per bucket: the dense parameters' buckets, then the experts'
    param_buckets: list[np.ndarray] = []
    dp_fwd, dp_bwd = z, z
    # what no configuration here does is not masked in (where a flag holds for none or all, np.where picks one side)
    z3_any, z3_all, buckets_any = _any(a.zero3), not _any(~a.zero3), _any(a.bucket > 0)
    shards_any, shards_all = _any(a.shards), not _any(~a.shards)
    for elements, span, entries in ((a.st_dense_params, "dp", a.st_zero3), (a.st_expert_params, "edp", a.st_zero3_expert)):
        if not elements.any():  # none of these parameters (a dense model's experts)
            continue
        alone = T.alone(span)
        present = elements > 0 if alone is None else (elements > 0) & ~alone
        if not present.any():
            continue
        # gradient buckets of at most grad_bucket_elements (one per stage without), the last holding the rest (none
        # where every configuration is ZeRO-3's, which reduces and gathers in the passes: its step's buckets would be
        # 0 s each, and their op sets 0, which add nothing)
        if not z3_all:
            num = (np.where(a.bucket > 0, -(-elements // np.maximum(a.bucket, 1)), 1) * present if buckets_any
                   else present.astype(np.int64))
            plain = ~a.zero3
            if not buckets_any or num.max() == 1:  # one bucket per stage: (n, p)
                span3, sizes, G, shards = span, elements if alone is None else elements * present, a.G, a.shards
            else:  # (n, p, buckets)
                k = np.arange(int(num.max()))[None, None, :]
                full_size = np.where(a.bucket > 0, a.bucket, elements)[:, :, None]
                rest = (elements - (num - 1) * a.bucket)[:, :, None]
                sizes = np.where(k < num[:, :, None] - 1, full_size, np.where(k < num[:, :, None], rest, 0))
                span3, G, shards, plain = T.per_bucket(span), _per_bucket(a.G), _per_bucket(a.shards), _per_bucket(plain)
            if shards_all or not shards_any:
                grads = t("reduce_scatter" if shards_all else "all_reduce", sizes * G, span3)
            else:
                grads = np.where(shards, t("reduce_scatter", sizes * G, span3), t("all_reduce", sizes * G, span3))
            if z3_any:
                grads = grads * plain
            params = (_where(plain & shards, t("all_gather", sizes * B, span3), np.zeros(grads.shape)) if shards_any
                      else np.zeros(grads.shape))
            if grads.ndim == 2:
                grad_buckets.append(grads)
                param_buckets.append(params)
            else:
                grad_buckets += list(np.moveaxis(grads, 2, 0))
                param_buckets += list(np.moveaxis(params, 2, 0))
        if z3_any:
            # (n, p, sizes) each: elements, gathers per micro-batch and op sets of each gather size
            assert entries is not None, "_stages(zero3=True) for every configuration with ZeRO-3"
            zn, per_mb, sets = entries[:, 0], entries[:, 1], entries[:, 2]
            span3 = T.per_bucket(span)
            t_ag = t("all_gather", zn * B, span3)
            t_rs = t("reduce_scatter", zn * _per_bucket(a.G), span3)
            cnt = per_mb * _per_bucket(m) * present[:, :, None]
            gathers = t_ag * cnt
            # (the first parameter group's sums are not added to zeros: _total)
            dp_fwd = _total(z, dp_fwd, _where(a.zero3, gathers.sum(axis=2), 0.0))
            dp_bwd = _total(z, dp_bwd, _where(a.zero3, (gathers + t_rs * cnt).sum(axis=2), 0.0))
            z3_sets = sets.sum(axis=2) * present
            # (an op set counted 0 times everywhere adds 0 to the sums: left out)
            if z3_all:
                bb.add("dp", "all_gather", span, 2 * z3_sets)
                bb.add("dp", "reduce_scatter", span, z3_sets)
            else:
                bb.add("dp", "all_gather", span, np.where(a.zero3, 2 * z3_sets, num * a.shards))
                bb.add("dp", "reduce_scatter", span, np.where(a.zero3, z3_sets, num * a.shards))
                bb.add("dp", "all_reduce", span, np.where(a.zero3 | a.shards, 0, num))
        else:
            if shards_any:
                sharded = _where(a.shards, num, 0)
                bb.add("dp", "all_gather", span, sharded)
                bb.add("dp", "reduce_scatter", span, sharded)  # (not one add of twice: the experts' add to the dense)
            if not shards_all:
                bb.add("dp", "all_reduce", span, np.where(a.shards, 0, num) if shards_any else num)
    return {"fwd": dp_fwd, "bwd": dp_bwd, "iter": z}, grad_buckets, param_buckets


# --------------------------------------------------------------------------------------------------- schedule


def _evaluate(model: ModelSpec, cluster: ClusterSpec, a: _Arrays, c: dict[str, np.ndarray],
              compute_notes: Sequence[tuple[str, ...]], gpu: GpuSpec | None, u_flops: float,
              base_notes: list[str]) -> list[Estimate]:
    """Every configuration's communication op by op in closed form (:func:`_communication`), and the pipeline
    schedule of :func:`commscope.estimate.estimate_op_by_op`, on (configurations, stages) arrays. ``c``: the compute
    per stage (``gpu``: the GPU whose compute model gave it, None for FLOP / (u x peak))."""
    n, p = a.n, a.p
    peak = cluster.peak_flops_for(model.dtype)
    fwd, bwd, m = c["fwd"], c["bwd"], a.m
    z = np.zeros((n, p))
    T = _Times(cluster, {"tp": a.span_tp, "cp": a.span_cp, "dp": a.span_dp, "edp": a.span_edp, "ep": a.span_ep,
                         "emb": a.span_emb, "inside": (2, 1, 1), "across": (2, 2, 1)})
    bb = _BusBw(T)
    comm, grad_buckets, param_buckets = _communication(model, a, T, bb, z)

    # --- the pipeline schedule (estimate.estimate_op_by_op, on arrays of configurations) ---
    v = a.v
    # (an axis that sends nothing here is zeros, z itself: what follows from it is z too; an overlap that no
    # configuration here turns on hides nothing)
    sends = {axis: comm[axis]["fwd"] is not z for axis in ("tp", "cp", "pp", "ep", "dp")}  # (dp: ZeRO-3's gathers)
    tp_all = comm["tp"]["fwd"] + comm["tp"]["bwd"] if sends["tp"] else z
    tp_exp = _where(a.flags("tp_comm_overlap"), np.maximum(0.0, comm["tp"]["fwd"] - m * c["lin_f"])
                      + np.maximum(0.0, comm["tp"]["bwd"] - m * c["lin_b"]), tp_all) \
        if sends["tp"] and a.any("tp_comm_overlap") else tp_all
    cp_all = comm["cp"]["fwd"] + comm["cp"]["bwd"] if sends["cp"] else z
    cp_exp = np.maximum(0.0, cp_all - m * c["att"]) if sends["cp"] else z
    pp_all = comm["pp"]["fwd"] + comm["pp"]["bwd"] if sends["pp"] else z
    p2p_overlap = (v > 1) & a.flags("overlap_p2p_comm")
    pp_exp = _where(p2p_overlap, np.maximum(0.0, pp_all - m * (fwd + bwd)), pp_all) \
        if sends["pp"] and _any(p2p_overlap) else pp_all  # (the flag hides nothing without interleaving)
    ep_all = comm["ep"]["fwd"] + comm["ep"]["bwd"] if sends["ep"] else z
    dp_layer = comm["dp"]["fwd"] + comm["dp"]["bwd"] if sends["dp"] else z
    dp_layer_exp = (np.maximum(0.0, comm["dp"]["fwd"] - m * fwd) + np.maximum(0.0, comm["dp"]["bwd"] - m * bwd)
                    if sends["dp"] else z)
    # compute slowed by the SMs that overlapped collectives take (compute.effects, point 2), of the axes that hide
    # some of their communication (the others' exposed time is all of it: 0 s hidden, which adds 0 s)
    hid = {axis: all_s - exposed for axis, all_s, exposed in (("tp", tp_all, tp_exp), ("cp", cp_all, cp_exp),
                                                              ("pp", pp_all, pp_exp), ("dp", dp_layer, dp_layer_exp))
           if exposed is not all_s}
    sm = comm_sm_time_s(gpu, **hid) if gpu is not None and hid else z
    per_mb = fwd + bwd + _total(z, sm, tp_exp, pp_exp, cp_exp, ep_all, dp_layer_exp) / m
    crit = first_max(per_mb)
    at_crit = _at(crit)
    bubble = (per_mb.sum(axis=1) - at_crit(per_mb)) / _per_config(v)
    grad_t, param_t = _total(z, *grad_buckets), _total(z, *param_buckets)
    grad_exp = (_where(a.flags("overlap_grad_reduce"), _overlapped_buckets(grad_buckets, bwd), grad_t)
                if a.any("overlap_grad_reduce") else grad_t) if grad_buckets else z
    param_exp = (_where(a.flags("overlap_param_gather"), _late_gathers(param_buckets, fwd), param_t)
                 if a.any("overlap_param_gather") else param_t) if param_buckets else z
    dp_tail = _total(z, grad_exp, param_exp, comm["dp"]["iter"])
    # the last backward (and the next forward) slowed by the buckets reduced (gathered) beside them (none: 0 s)
    sm_tail = (z if gpu is None or (grad_exp is grad_t and param_exp is param_t)
               else comm_sm_time_s(gpu, dp=grad_t - grad_exp + param_t - param_exp))
    tail = _total(z, dp_tail, comm["emb"]["iter"], comm["tp"]["iter"], comm["cp"]["iter"], comm["ep"]["iter"], sm_tail,
                  c["opt"])
    lead = np.arange(p)[None, :] * bwd / v
    end = first_max(tail - lead)
    at_end = _at(end)
    hide = np.minimum(at_end(lead), at_end(tail))
    terms = {"dp": at_end(dp_tail), "emb": at_end(comm["emb"]["iter"]),
             "tp": at_end(comm["tp"]["iter"]) + at_end(comm["cp"]["iter"]) + at_end(comm["ep"]["iter"]),
             "sm": at_end(sm_tail), "opt": at_end(c["opt"])}
    for key, value in terms.items():
        cut = np.minimum(hide, value)
        terms[key] = value - cut
        hide = hide - cut
    # what each axis hid on the critical stage (all - exposed there; the axes that hide nothing are 0 s, left out),
    # and DP's step under the last backward (its buckets and tail less what stays exposed)
    hidden_cols = {axis: at_crit(x) for axis, x in hid.items()}
    dp_hidden = hidden_cols["dp"] + at_end(grad_t) if "dp" in hid else at_end(grad_t)
    hidden_cols["dp"] = dp_hidden + at_end(param_t) + at_end(comm["dp"]["iter"]) - terms["dp"]
    m_col = _per_config(m)
    work = at_crit(fwd) + at_crit(bwd)
    comp = m_col * work + at_crit(sm) + terms["sm"]
    if gpu is not None:
        u: Any = np.where(work > 0, at_crit(c["flop"]) / (np.where(work > 0, work, 1.0) * peak), u_flops)
        breakdown = _gpu_breakdown(c, at_crit, m_col, at_crit(sm) + terms["sm"], crit)
    else:
        u, breakdown = u_flops, [{}] * n
    flags = zip(a.values("tp_comm_overlap"), (p2p_overlap[:, 0]).tolist(), a.values("overlap_grad_reduce"),
                a.values("overlap_param_gather"))
    return finish_many(model, "refined", u, peak, global_batch_size=_per_config(a.gb), world_size=a.column("world_size"),
                       recompute=a.values("recompute"), comp=comp, tp=at_crit(tp_exp) + terms["tp"],
                       pp=at_crit(pp_exp), dp=at_crit(dp_layer_exp) + terms["dp"], ep=at_crit(ep_all),
                       cp=at_crit(cp_exp), emb=terms["emb"], bubble=bubble, optimizer=terms["opt"],
                       micro_batch=at_crit(per_mb),
                       tail=terms["dp"] + terms["emb"] + terms["tp"] + terms["sm"] + terms["opt"],
                       stage=crit, eff=_dicts(_EFF_AXES, bb.sums, bb.counts, n),
                       notes=_notes(base_notes, compute_notes, flags, a.split_notes),
                       hidden=_hidden(hidden_cols, n), breakdown=breakdown,
                       compute_model="gpu" if gpu is not None else "flops",
                       stage_micro_batch=per_mb)


#: The kinds of :attr:`Estimate.compute_breakdown_s`, in StageCompute.breakdown's order, then what the collectives'
#: SMs took, with the key of the compute array each is read from (None: worked out apart).
_BREAKDOWN = (("gemm_s", "gemm"), ("attention_s", "att"), ("memory_bound_s", "mem"), ("recompute_s", "rec"),
              ("optimizer_s", None), ("clock_s", "clock"), ("overlap_chunks_s", "chunks"),
              ("launch_gaps_s", "gaps"), ("stack_s", None), ("comm_sms_s", None))
_BREAKDOWN_NAMES = tuple(name for name, _ in _BREAKDOWN)


def _gpu_breakdown(c: dict[str, np.ndarray], at_crit: Callable[[np.ndarray], np.ndarray], m_col: np.ndarray,
                   comm_sms: np.ndarray, crit: np.ndarray) -> list[dict[str, float]]:
    """Each configuration's compute on its critical stage by kind (:attr:`Estimate.compute_breakdown_s`), in
    StageCompute.breakdown's order, then what the collectives' SMs took (``comm_sms``)."""
    make = _dict_maker(_BREAKDOWN_NAMES)
    if len(m_col) == 1:  # one configuration: its entries as numbers, the same products
        col, m = int(crit[0]), int(m_col[0])
        v = {key: float(c[key][0, col]) for _, key in _BREAKDOWN if key} | {
            key: float(c[key][0, col]) for key in ("opt", "stack", "stack_opt")}
        one = {"optimizer_s": v["opt"], "comm_sms_s": float(comm_sms[0]), "stack_s": v["stack"] * m + v["stack_opt"]}
        return [make(*(v[key] * m if key else one[name] for name, key in _BREAKDOWN))]
    apart = {"optimizer_s": at_crit(c["opt"]), "comm_sms_s": comm_sms,
             "stack_s": at_crit(c["stack"]) * m_col + at_crit(c["stack_opt"])}
    columns = [(at_crit(c[key]) * m_col if key else apart[name]).tolist() for name, key in _BREAKDOWN]
    return list(map(make, *columns))


def _at(cols: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """``lambda x: x[rows, cols]``: each row's entry in its own column (of one row, a plain slice: fancy indexing
    costs several times as much, and one estimate reads a few dozen such entries)."""
    if len(cols) == 1:
        col = int(cols[0])
        return lambda x: x[:, col]
    rows = np.arange(len(cols))
    return lambda x: x[rows, cols]


def _dicts(axes: tuple[str, ...], sums: dict[str, Any], counts: dict[str, Any], n: int) -> list[dict[str, float]]:
    """Each configuration's mean bus bandwidth per axis (axes without an op set left out), in ``axes`` order."""
    present = tuple(axis for axis in axes if axis in sums)
    if n == 1:  # one configuration: the same division on numbers
        ones = [(axis, float(sums[axis][0]), int(counts[axis][0])) for axis in present]
        return [{axis: total / max(count, 1) for axis, total, count in ones if count > 0}]
    means = [np.divide(sums[axis], np.maximum(counts[axis], 1)) for axis in present]
    return _rows_of_dicts(present, means, [counts[axis] > 0 for axis in present], n)


def _hidden(columns: dict[str, np.ndarray], n: int) -> list[dict[str, float]]:
    """Each configuration's hidden communication per axis, what is below HIDDEN_MIN_S left out."""
    if n == 1:  # one configuration: its numbers
        ones = [(name, float(v[0])) for name, v in columns.items()]
        return [{name: x for name, x in ones if x > HIDDEN_MIN_S}]
    values = list(columns.values())
    return _rows_of_dicts(tuple(columns), values, [v > HIDDEN_MIN_S for v in values], n)


def _rows_of_dicts(names: tuple[str, ...], values: Sequence[np.ndarray], keep: Sequence[np.ndarray],
                   n: int) -> list[dict[str, float]]:
    """One dict per row: ``names`` in order, each with its value in that row where ``keep`` holds there. The rows
    are grouped by which names they keep (a few patterns among thousands of rows), each group's dicts built at once."""
    if not names:
        return [{} for _ in range(n)]
    if n <= 8:  # a few rows (one estimate): grouping would cost more than it saves
        rows = zip(*(v.tolist() for v in values), *(k.tolist() for k in keep))
        width = len(names)
        return [{name: row[i] for i, name in enumerate(names) if row[width + i]} for row in rows]
    pattern = sum((np.asarray(k, dtype=np.int64) << i for i, k in enumerate(keep)), np.zeros(n, dtype=np.int64))
    codes = np.unique(pattern).tolist()
    out: list[Any] = [None] * n
    for code in codes:
        kept = [i for i in range(len(names)) if code >> i & 1]
        index = np.flatnonzero(pattern == code) if len(codes) > 1 else None
        if not kept:  # distinct empty dicts, not one shared
            made: list[dict[str, float]] = [{} for _ in range(n if index is None else len(index))]
        else:
            columns = (values[i].tolist() if index is None else values[i][index].tolist() for i in kept)
            made = list(map(_dict_maker(tuple(names[i] for i in kept)), *columns))
        if index is None:
            return made
        for i, d in zip(index.tolist(), made):
            out[i] = d
    return out


_MAKERS: dict[tuple[str, ...], Callable[..., dict[str, float]]] = {}


def _dict_maker(names: tuple[str, ...]) -> Callable[..., dict[str, float]]:
    """A function of len(names) values that returns ``{names[0]: value0, ...}`` as a dict display of constant keys
    (about twice as fast as ``dict(zip(names, values))``, which thousands of Estimates' dicts would spend); the
    names are this module's own axis and kind names, never user text."""
    maker = _MAKERS.get(names)
    if maker is None:
        if not all(name.isidentifier() for name in names):
            raise ValueError(f"not identifiers: {names}")
        args = ", ".join(f"v{i}" for i in range(len(names)))
        body = ", ".join(f"{name!r}: v{i}" for i, name in enumerate(names))
        maker = _MAKERS[names] = eval(f"lambda {args}: {{{body}}}")  # (names: identifiers, checked above)
    return maker


def _emb_elements(model: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Word-embedding elements on one TP rank (the vocabulary padded for tp), per configuration."""
    multiple = model.make_vocab_size_divisible_by * tp
    out: np.ndarray = -(-model.vocab_size // multiple) * multiple * model.hidden_size // tp
    return out


def _notes(base: list[str], compute: Sequence[tuple[str, ...]], flags: Any,
           split: Sequence[str | None]) -> list[tuple[str, ...]]:
    """Each configuration's notes, in the op-by-op path's order (built once per distinct combination)."""
    keys = list(zip(map(id, compute), flags, split))
    made = {}
    for key, cn in dict(zip(keys, compute)).items():  # (the same id: the same tuple of notes)
        _, fl, sn = key
        lines = [*base, *cn, *(text for on, text in zip(fl, OVERLAP_NOTES) if on)]
        made[key] = tuple(lines + ([sn] if sn else []))
    return list(map(made.__getitem__, keys))
