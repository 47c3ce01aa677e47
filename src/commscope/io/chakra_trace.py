"""One rank's program of a predicted iteration: compute and communication nodes with their dependencies.

The program follows the estimate's schedule and overlaps communication with compute where the estimate does
(:mod:`commscope.estimate`). What :mod:`commscope.io.chakra` encodes into Chakra, node for node.

Order. A rank runs the work list of its pipeline stage, :func:`commscope.estimate.schedule.stage_order` (1F1B, interleaved
1F1B, GPipe); each forward or backward pass runs its model chunk's layers through the kernels of
:mod:`commscope.io.chakra_compute`, the first virtual stage adds the embedding, the last the head (final norm,
logits, cross-entropy). After the last pass: gradient reduction, the embedding sync, the optimizer step and the
parameter all-gather (the end of the iteration).

Dependencies, as two CUDA streams and the events between them:

- compute nodes run in program order: each has a control dependency on the compute node before it (and a data
  dependency on what produced its input: the kernel before it in the same pass, a receive, a collective);
- communication nodes that occupy the network (collectives and sends) run in program order too, one chain per
  rank (``comm_streams=1``, the default: ASTRA-sim runs one of them at a time per NPU, and one order per rank keeps
  every process group's collectives in the same order on all its members, which a simulator matching them by issue
  order needs), or two (``comm_streams=2``: the pipeline's own communication, and DP/ZeRO traffic on its own chain,
  as NCCL runs them on separate streams); a receive occupies nothing and has no dependencies (a simulator posts it
  at once; it completes when its send's data has arrived);
- a node's data dependencies say what it must wait for. Communication that the estimate exposes is waited for by
  the next compute; communication the estimate overlaps is not:

  ======================================  ====================================================================
  overlap (estimate)                      in the trace
  ======================================  ====================================================================
  ``tp_comm_overlap``                     a TP all-gather runs beside the column-parallel GEMM that consumes it,
                                          a reduce-scatter beside the row-parallel GEMM that produces it; the
                                          next kernel waits for both
  ``overlap_grad_reduce``, DDP, FSDP2     gradient buckets start during the last micro-batch's backward, each
                                          when its share of that backward has run (the estimate's rule); the
                                          optimizer step waits for them
  ``overlap_param_gather``                the parameter all-gathers start the iteration, each needed by the
                                          forward kernel where its share of the first forward begins
  ZeRO-3 / FSDP2 per layer               a layer's parameters are gathered one layer ahead (issued when the
                                          layer before starts; a pass's first layer's during the pass before),
                                          its gradients reduce-scattered after its backward, waited for only by
                                          the optimizer step
  context parallelism                     the attention core runs in cp steps, each beside the ring transfer
                                          of the next step's K/V
  interleaved, ``overlap_p2p_comm``       pipeline sends are not waited for; 1F1B's (and GPipe's) are: the next
                                          compute waits for the send as Megatron's blocking p2p does
  ======================================  ====================================================================

With one chain, overlapped communication (the DP buckets, parameter and ZeRO-3 gathers, reduce-scatters) is not put
in front of the blocking ops that follow its ready point: before each blocking op, the deferred ops that end before
the rank reaches it go first, a small list schedule on a clock of the rank's own compute and blocking communication
(the compute model's kernel times and the bandwidth model's op times, each op timed at its op set's slowest group so
that every rank of a stage decides alike); an op that fits no gap goes after the next blocking op, and a gather goes
at the latest right before the compute that needs it.

Every op of the op list (:meth:`commscope.pattern.workload.base.Workload.ops`), ``count`` expanded, is placed once on every
rank it involves: by name where the rules of Megatron-LM or PyTorch give it a place, else (an op this module does not
know) after the iteration's compute, in a fixed order on every rank (``unplaced`` lists them).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from commscope.io.chakra_compute import Kernel, StageKernels
from commscope.io.chakra_ops import OpIndex, TraceJob, TraceNode, a2a_sizes, comm_node_name, rank_ops
from commscope.commop import CommOp
from commscope.estimate.schedule import stage_order
from commscope.pattern.workload.stages import stage_layers

__all__ = ["rank_program"]


@dataclass(slots=True, kw_only=True)
class _Deferred:
    """Overlapped communication waiting for its place in the one chain."""

    instances: list[tuple[CommOp, int]]
    data: list[int]
    ctrl: tuple[int, ...]
    into: list[int]
    ready_s: float
    time_s: float
    born: int
    """Blocking ops issued before it was deferred."""


class _Program:
    """Builds one rank's nodes (see the module docstring)."""

    def __init__(self, job: TraceJob, rank: int) -> None:
        pred = job.prediction
        self.job, self.rank = job, rank
        self.model, self.par = pred.model, pred.parallel
        self.p, self.v, self.m = self.par.pp, self.par.virtual_pipeline_size, self.par.num_micro_batches
        self.stage = int(pred.workload.layout.stage_of()[rank])
        self.k: StageKernels = job.kernels[self.stage]
        self.chunks = [list(r) for r in stage_layers(self.model, self.par, self.stage)]
        self.ops = OpIndex(rank_ops(pred.workload, rank))
        self.a2a = a2a_sizes(pred.workload, rank) if self.model.is_moe else {}
        self.nodes: list[TraceNode] = []
        self.unplaced: list[tuple[CommOp, int]] = []
        self.comp_tail: int | None = None
        self.comm_tail: dict[str, int] = {}
        self.block: list[int] = []  # sends the next compute waits for (blocking p2p)
        self.optimizer_deps: list[int] = []
        self.unwaited: list[list[int]] = []  # gathers no compute waited for (filled when they are issued)
        self.overlap_tp = self.par.tp_comm_overlap and self.par.sequence_parallel and self.par.tp > 1
        self.blocking_p2p = not (self.v > 1 and self.par.overlap_p2p_comm)
        self.fsdp = self.par.framework == "torch-fsdp2"
        self.fsdp_sharded: dict[str, bool] = {}
        # gathers a compute node waits for, by the unit it belongs to; the next unit's gathers to issue after it
        self.pending: dict[Any, list[int]] = {}
        self.prefetch: dict[Any, tuple[Any, list[tuple[CommOp, int]]]] = {}
        self.carry: list[int] | None = None  # the next pass's first gathers, issued during this pass's last unit
        # with one chain and blocking communication inside the layers, overlapped communication waits in the chain
        # for the next blocking op, so that it runs in the compute after that op instead of in front of it
        self.defer = job.comm_streams == 1 and (self.par.tp > 1 or self.par.cp > 1 or self.par.ep > 1)
        self.deferred: deque[_Deferred] = deque()
        self.syncs = 0  # blocking ops issued so far
        # a rough clock of this rank alone (compute, and the blocking communication it waits for), to fit deferred
        # communication into the compute between blocking ops; kernels and op times are the same on every rank of a
        # stage, so all of them order their chain alike
        self.clock_s = 0.0
        self.chain_free_s = 0.0
        self.next_pass: tuple[str, int, int] | None = None
        self._setup_buckets()

    # ------------------------------------------------------------------------------------------- nodes

    def _node(self, type_: str, name: str, data: list[int], ctrl: list[int], **kw: Any) -> int:
        data = list(dict.fromkeys(data))
        ctrl = [c for c in dict.fromkeys(ctrl) if c not in data]
        node = TraceNode(id=len(self.nodes), name=name, type=type_, data_deps=data, ctrl_deps=ctrl, **kw)
        self.nodes.append(node)
        return node.id

    def comp(self, kernel: Kernel, data: list[int], *, phase: str, mb: int | None, layer: int | None = None,
             chunk: int | None = None, recompute: bool = False, unit: Any = "-") -> int:
        if unit != "-":
            if self.deferred and unit in self.pending:
                self.flush([self.pending[unit]])  # the gathers this compute needs, not the rest of the queue
            data = data + self.pending.pop(unit, [])
        if phase == "fwd" and mb == 0 and self.param_buckets:
            data = data + self._params_needed()
        ctrl = ([] if self.comp_tail is None else [self.comp_tail]) + self.block
        self.block = []
        where = f"{phase}:mb{mb}" + ("" if chunk is None or self.v == 1 else f":c{chunk}") + (
            "" if layer is None else f":layer{layer}") + (":recompute" if recompute else "")
        nid = self._node("comp", f"{where}:{kernel.name}", data, ctrl, kernel=kernel, phase=phase, micro_batch=mb,
                         layer=layer, chunk=chunk, recompute=recompute)
        self.comp_tail = nid
        self.clock_s += kernel.time_s
        if phase == "bwd" and mb == self.m - 1:
            self._window_done(kernel.time_s, nid)
        if phase == "fwd" and mb == 0:
            self.fwd0_done_s += kernel.time_s
        if unit != "-" and unit in self.prefetch:
            next_unit, instances = self.prefetch.pop(unit)
            issued: list[int] = []
            if next_unit == _NEXT_PASS:
                self.carry = issued
            else:
                self.pending[next_unit] = issued
            self.overlapped(instances, [], issued, ctrl=(nid,))
        return nid

    def comm(self, op: CommOp, index: int, data: list[int], stream: str = "sync", ctrl: tuple[int, ...] = ()) -> int:
        sync = stream == "sync"
        if sync and self.deferred and self.job.comm_time_s is not None:
            self._fill_gap()
        chain = "sync" if self.job.comm_streams == 1 else stream
        tail = self.comm_tail.get(chain)
        size = self._size(op)
        type_ = "send" if op.op == "send" else "coll"
        tag = self.job.tag(op, index) if type_ == "send" else 0
        nid = self._node(type_, comm_node_name(op, index), data, ([] if tail is None else [tail]) + list(ctrl), op=op,
                         index=index, comm_size=size, tag=tag, phase=op.phase or "", micro_batch=op.micro_batch,
                         layer=op.layer, stream=stream)
        self.comm_tail[chain] = nid
        if sync:
            end = max(self.clock_s, self.chain_free_s) + self.job.op_time_s(op, size, self.stage)
            self.chain_free_s = end
            if self._waited(op):
                self.clock_s = end
            self.syncs += 1
            if self.deferred:
                self._after_blocking()
        return nid

    def _size(self, op: CommOp) -> int:
        if op.op == "all_to_all":
            return self.a2a.get((op.name, op.phase, op.micro_batch, op.layer, op.group), op.size_bytes)
        return op.size_bytes

    def _waited(self, op: CommOp) -> bool:
        """Whether the next compute waits for a blocking op (roughly: for the chain's clock only)."""
        if op.axis == "cp" or (op.axis == "tp" and self.overlap_tp):
            return False
        return op.op != "send" or self.blocking_p2p

    def _fill_gap(self) -> None:
        """Before a blocking op: issue the deferred communication that ends before this rank reaches the op."""
        while self.deferred:
            entry = self.deferred[0]
            if max(self.chain_free_s, entry.ready_s) + entry.time_s > self.clock_s:
                break
            self._issue(self.deferred.popleft())

    def _after_blocking(self) -> None:
        """After a blocking op: what waited a whole gap already goes now (it runs in the compute after this op), the
        rest waits for a gap it fits (without op times: all of it goes now)."""
        while self.deferred and (self.job.comm_time_s is None or self.deferred[0].born < self.syncs - 1):
            self._issue(self.deferred.popleft())

    def _issue(self, entry: _Deferred) -> None:
        entry.into += [self.comm(op, j, entry.data, "async", entry.ctrl) for op, j in entry.instances]
        self.chain_free_s = max(self.chain_free_s, entry.ready_s) + entry.time_s

    def overlapped(self, instances: list[tuple[CommOp, int]], data: list[int], into: list[int],
                   ctrl: tuple[int, ...] = ()) -> None:
        """Communication only later compute (or the optimizer step) waits for: on its own chain, or deferred to
        after the next blocking op of the one chain; the node ids go ``into`` the list given."""
        if self.defer:
            time_s = sum(self.job.op_time_s(op, self._size(op), self.stage) for op, _ in instances)
            self.deferred.append(_Deferred(instances=instances, data=data, ctrl=ctrl, into=into, ready_s=self.clock_s,
                                           time_s=time_s, born=self.syncs))
        else:
            into += [self.comm(op, j, data, "async", ctrl) for op, j in instances]

    def flush(self, only: list[list[int]] | None = None) -> None:
        """Issue the deferred communication (``only``: that which fills these lists)."""
        wanted = None if only is None else {id(x) for x in only}
        queue, self.deferred = self.deferred, deque()
        for entry in queue:
            if wanted is None or id(entry.into) in wanted:
                self._issue(entry)
            else:
                self.deferred.append(entry)

    def recv(self, op: CommOp, index: int) -> int:
        return self._node("recv", comm_node_name(op, index), [], [], op=op, index=index, comm_size=op.size_bytes,
                          tag=self.job.tag(op, index), phase=op.phase or "", micro_batch=op.micro_batch, layer=op.layer)

    def blocking(self, x: list[int], phase: str, mb: int | None, layer: int | None, name: str) -> list[int]:
        """Every instance of a collective the next compute waits for, in a row."""
        for op, j in self.ops.take_all("coll", phase, mb, layer, name):
            x = [self.comm(op, j, x)]
        return x

    # ---------------------------------------------------------------------- the gradient and parameter buckets

    def _setup_buckets(self) -> None:
        """DP buckets overlapped with the last backward (by share, as the estimate's _overlapped_buckets) and
        parameter all-gathers overlapped with the first forward (as its _late_gathers)."""
        par, megatron = self.par, self.par.framework == "megatron"

        def is_grad(kind: str, phase: str, name: str) -> bool:
            if kind != "coll":
                return False
            if megatron:
                return phase == "optim" and "grads_bucket" in name
            return par.framework == "torch-ddp" and phase == "bwd" and name.startswith("grad_bucket")

        overlap = par.overlap_grad_reduce or par.framework == "torch-ddp"
        self.grad_buckets = self.ops.take_once(is_grad)
        self.window: list[tuple[float, CommOp, int]] = []
        self.window_done_s = 0.0
        if overlap and self.grad_buckets:
            total = sum(op.size_bytes for op, _ in self.grad_buckets)
            share = 0.0
            for op, j in self.grad_buckets:
                share += op.size_bytes / total if total else 1 / len(self.grad_buckets)
                self.window.append((share * self._window_s(), op, j))
            self.grad_buckets = []
        self.param_buckets: list[tuple[float, list[int]]] = []
        self.fwd0_done_s = 0.0
        if megatron and par.overlap_param_gather:
            params = self.ops.take_once(lambda kind, phase, name: kind == "coll" and phase == "optim"
                                        and "params_bucket" in name)
            total = sum(op.size_bytes for op, _ in params)
            needed = 0.0
            for op, j in params:
                ids: list[int] = []
                self.param_buckets.append((needed * self._forward_s(), ids))
                self.overlapped([(op, j)], [], ids)
                needed += op.size_bytes / total if total else 1 / len(params)

    def _window_s(self) -> float:
        """Compute seconds of one micro-batch's backward on this stage (every chunk): the window of the last one."""
        k = self.k
        total = sum(k.layer(self.model, layer).backward_s for chunk in self.chunks for layer in chunk)
        total += sum(x.time_s for x in k.head_backward if self._has_head) + (k.embedding[1].time_s if k.embedding else 0)
        return total + sum(a.time_s for a in k.accumulate if a is not None)

    def _forward_s(self) -> float:
        k = self.k
        total = sum(k.layer(self.model, layer).forward_s for chunk in self.chunks for layer in chunk)
        return total + sum(x.time_s for x in k.head_forward if self._has_head) + (k.embedding[0].time_s if k.embedding else 0)

    @property
    def _has_head(self) -> bool:
        return self.stage == self.p - 1

    def _window_done(self, time_s: float, nid: int) -> None:
        self.window_done_s += time_s
        while self.window and self.window[0][0] <= self.window_done_s * (1 + 1e-9) + 1e-15:
            _, op, j = self.window.pop(0)
            self.overlapped([(op, j)], [nid], self.optimizer_deps)

    def _params_needed(self) -> list[int]:
        needed = []
        while self.param_buckets and self.param_buckets[0][0] <= self.fwd0_done_s * (1 + 1e-9) + 1e-15:
            needed.append(self.param_buckets.pop(0)[1])
        if self.deferred and needed:
            self.flush(needed)
        return [nid for ids in needed for nid in ids]

    # ------------------------------------------------------------------------- per-layer parameter gathers

    def _units(self, phase: str, vs: int, layers: list[int]) -> list[Any]:
        """The units whose parameters a pass uses, in use order: its layers, and ``None`` (the embedding / head
        parameters) where the pass runs them."""
        units: list[Any] = list(layers) if phase == "fwd" else list(reversed(layers))
        first, last = vs == 0, vs == self.p * self.v - 1
        if phase == "fwd":
            if first:
                units.insert(0, None)
            elif last:
                units.append(None)
        elif last:
            units.insert(0, None)
        elif first:
            units.append(None)
        return units

    def _gathers(self, phase: str, mb: int, unit: Any) -> list[tuple[CommOp, int]]:
        if self.fsdp:
            name = _unit_name(unit)
            if not self.fsdp_sharded.get(name, True):
                return []
            got = self._take_fsdp_gather(name)
            if got:
                self.fsdp_sharded[name] = False
            return got
        out = []
        for name in ("params_fwd", "expert_params_fwd") if phase == "fwd" else ("params_bwd", "expert_params_bwd"):
            out += self.ops.take_all("coll", phase, mb, unit, name)
        return out

    def _start_gathers(self, phase: str, mb: int, vs: int, layers: list[int]) -> None:
        """Chain the pass's gathers one unit ahead: the first unit's were issued during the pass before (or go now),
        each next unit's when the one before it starts, the next pass's first unit's when this pass's last starts."""
        units = self._units(phase, vs, layers)
        carried, self.carry = self.carry, None
        gathers = [(u, [] if i == 0 and carried is not None else self._gathers(phase, mb, u)) for i, u in enumerate(units)]
        self.pending, self.prefetch = {}, {}
        if not units:
            return
        if carried is not None:
            self.pending[units[0]] = carried
            if self.fsdp:
                self.fsdp_sharded[_unit_name(units[0])] = False
        elif gathers[0][1]:
            self.pending[units[0]] = []
            self.overlapped(gathers[0][1], [], self.pending[units[0]])
        for (u, _), (nxt, g) in pairwise(gathers):
            if g:
                self.prefetch[u] = (nxt, g)
        if self.next_pass is not None:
            kind, mb2, chunk = self.next_pass
            vs2 = chunk * self.p + self.stage
            following = self._units(kind, vs2, self.chunks[chunk])
            if following:
                first = following[0]
                if self.fsdp:  # what this pass leaves the unit in decides whether the next one gathers it
                    sharded = self._sharded_after(phase, mb, first) if first in units else self.fsdp_sharded.get(
                        _unit_name(first), True)
                    ahead = self._take_fsdp_gather(_unit_name(first)) if sharded else []
                else:
                    ahead = self._gathers(kind, mb2, first)
                if ahead:
                    self.prefetch[units[-1]] = (_NEXT_PASS, ahead)

    def _end_pass(self, phase: str, mb: int, vs: int, layers: list[int]) -> None:
        """Gathers of the pass no compute issued (a unit without kernels) go now; FSDP2's units reshard."""
        for unit, (nxt, instances) in list(self.prefetch.items()):
            issued: list[int] = []
            self.overlapped(instances, [], issued)
            if nxt == _NEXT_PASS:
                self.carry = issued
            else:
                self.unwaited.append(issued)
            del self.prefetch[unit]
        self.unwaited += list(self.pending.values())
        self.pending = {}
        if self.fsdp:
            for unit in self._units(phase, vs, layers):
                self.fsdp_sharded[_unit_name(unit)] = self._sharded_after(phase, mb, unit)

    def _sharded_after(self, phase: str, mb: int, unit: Any) -> bool:
        """FSDP2: whether a unit a pass used is sharded after it. Blocks reshard after forward, the root keeps its
        parameters; pipelining keeps them after every backward but the last micro-batch's."""
        if phase == "fwd":
            return unit is not None
        return mb == self.m - 1 or self.p == 1

    def _take_fsdp_gather(self, name: str) -> list[tuple[CommOp, int]]:
        """One of the unit's all-gathers (an op of count k: k gathers over the iteration)."""
        q = self.ops.slots.get(("coll", "fwd", None, None, f"{name}_params"))
        return [q.popleft()] if q else []

    def _reduce_scatters(self, mb: int, unit: Any, after: int) -> None:
        """The gradient reduce-scatters of a unit after its backward: ZeRO-3 every micro-batch, FSDP2 the last."""
        if self.fsdp:
            found = self.ops.take_all("coll", "bwd", None, None, f"{_unit_name(unit)}_grads") if mb == self.m - 1 else []
        else:
            found = self.ops.take_all("coll", "bwd", mb, unit, "grads") + self.ops.take_all(
                "coll", "bwd", mb, unit, "expert_grads")
        self.overlapped(found, [after], self.optimizer_deps)

    # --------------------------------------------------------------------------------------- layers

    def col_gemm(self, kernel: Kernel, x: list[int], coll: tuple[str, int | None, int | None, str], **where: Any) -> list[int]:
        """A column-parallel GEMM with the TP all-gather of its input before it (beside it with TP overlap)."""
        got = self.ops.take("coll", *coll)
        if got is None:
            return [self.comp(kernel, x, **where)]
        if self.overlap_tp:
            a = self.comm(*got, x)
            return [a, self.comp(kernel, x, **where)]
        return [self.comp(kernel, [self.comm(*got, x)], **where)]

    def row_gemm(self, kernel: Kernel, x: list[int], coll: tuple[str, int | None, int | None, str], **where: Any) -> list[int]:
        """A row-parallel GEMM with the TP reduce-scatter (all-reduce) of its output after it (beside it with TP
        overlap)."""
        g = self.comp(kernel, x, **where)
        got = self.ops.take("coll", *coll)
        if got is None:
            return [g]
        if self.overlap_tp:
            return [g, self.comm(*got, x)]
        return [self.comm(*got, [g])]

    def attention(self, kernel: Kernel, x: list[int], name: str, steps: int | None, **where: Any) -> list[int]:
        """The attention core; with context parallelism in cp steps, each beside the ring transfer of the next
        step's K/V (``steps``: how many ring transfers of ``name`` it sends, None: all left)."""
        c = self.par.cp
        phase, mb, layer = where["phase"], where["mb"], where["layer"]
        sends = self.ops.take_all("send", phase, mb, layer, name)
        recvs = self.ops.take_all("recv", phase, mb, layer, name)
        if steps is not None:
            for lst, kind in ((sends, "send"), (recvs, "recv")):
                if len(lst) > steps:
                    self.ops.slots[(kind, phase, mb, layer, name)] = deque(lst[steps:])
                    del lst[steps:]
        if c == 1 or not (sends or recvs):
            out = [self.comp(kernel, x, **where)]
            for op, j in sends:
                out.append(self.comm(op, j, x))
            for op, j in recvs:
                out.append(self.recv(op, j))
            return out
        part = Kernel(name=kernel.name, kernel=kernel.kernel, time_s=kernel.time_s / c, flop=kernel.flop / c,
                      hbm_bytes=kernel.hbm_bytes / c)
        per_step = [[] for _ in range(c - 1)]  # type: list[list[int]]
        for i in range(max(len(sends), len(recvs))):
            per_step[i % (c - 1)].append(i)
        a: list[int] = []
        arrived: list[int] = []
        for step in range(c):
            if step < c - 1:
                feed = x if step == 0 else arrived
                got = []
                for i in per_step[step]:
                    if i < len(sends):
                        self.comm(*sends[i], feed)
                    if i < len(recvs):
                        got.append(self.recv(*recvs[i]))
            a = [self.comp(part, (x if step == 0 else a + arrived), **where)]
            if step < c - 1:
                arrived = got
        return a

    def layer_forward(self, mb: int, layer: int, x: list[int], chunk: int, recompute: bool = False) -> list[int]:
        plan = self.k.layer(self.model, layer)
        kernels = plan.recompute if recompute else plan.forward
        k = {kern.name: kern for kern in kernels}
        phase = "bwd" if recompute else "fwd"
        sfx = "_recompute" if recompute else ""
        where: dict[str, Any] = dict(phase=phase, mb=mb, layer=layer, chunk=chunk, recompute=recompute)
        if "attn_norm" not in k:  # selective recomputation: the attention core alone, placed by layer_backward
            return x
        x = [self.comp(k["attn_norm"], x, unit=layer, **where)]
        x = self.col_gemm(k["qkv"], x, (phase, mb, layer, "attn_in" + sfx), **where)
        x = self.attention(k["attention"], x, "kv_and_grad" if recompute else "kv",
                           self.par.cp - 1 if recompute else None, **where)
        x = self.row_gemm(k["attn_proj"], x, (phase, mb, layer, "attn_out" + sfx), **where)
        x = [self.comp(k["mlp_norm"], x, **where)]
        if "router" in k:
            x = self.col_gemm(k["router"], x, (phase, mb, layer, "mlp_in" + sfx), **where)
            x = self.blocking(x, phase, mb, layer, "dispatch_counts")
            x = self.blocking(x, phase, mb, layer, "dispatch")
            x = [self.comp(k["experts_up"], x, **where)]
            x = [self.comp(k["mlp_act"], x, **where)]
            x = [self.comp(k["experts_down"], x, **where)]
            x = self.blocking(x, phase, mb, layer, "combine")
            x = self.blocking(x, phase, mb, layer, "mlp_out" + sfx)
        else:
            x = self.col_gemm(k["mlp_up"], x, (phase, mb, layer, "mlp_in" + sfx), **where)
            x = [self.comp(k["mlp_act"], x, **where)]
            x = self.row_gemm(k["mlp_down"], x, (phase, mb, layer, "mlp_out" + sfx), **where)
        x = [self.comp(k["residual"], x, **where)]
        if "launch_gap" in k:  # the host launching the layer's kernels slower than they run (compute.effects)
            x = [self.comp(k["launch_gap"], x, **where)]
        return x

    def layer_backward(self, mb: int, layer: int, x: list[int], chunk: int) -> list[int]:
        plan = self.k.layer(self.model, layer)
        k = {kern.name: kern for kern in plan.backward}
        where: dict[str, Any] = dict(phase="bwd", mb=mb, layer=layer, chunk=chunk)
        if self.par.recompute == "full":
            x = self.layer_forward(mb, layer, x, chunk, recompute=True)
            x = [self.comp(k["residual"], x, **where)]
        else:
            x = [self.comp(k["residual"], x, unit=layer, **where)]
        if "router" in k:
            x = self.blocking(x, "bwd", mb, layer, "mlp_out_grad")
            x = self.blocking(x, "bwd", mb, layer, "combine_grad")
            x = [self.comp(k["experts_down"], x, **where)]
            x = [self.comp(k["mlp_act"], x, **where)]
            x = [self.comp(k["experts_up"], x, **where)]
            x = self.blocking(x, "bwd", mb, layer, "dispatch_grad")
            x = self.row_gemm(k["router"], x, ("bwd", mb, layer, "mlp_in_grad"), **where)
        else:
            x = self.col_gemm(k["mlp_down"], x, ("bwd", mb, layer, "mlp_out_grad"), **where)
            x = [self.comp(k["mlp_act"], x, **where)]
            x = self.row_gemm(k["mlp_up"], x, ("bwd", mb, layer, "mlp_in_grad"), **where)
        x = [self.comp(k["mlp_norm"], x, **where)]
        x = self.col_gemm(k["attn_proj"], x, ("bwd", mb, layer, "attn_out_grad"), **where)
        if self.par.recompute == "selective":
            for kern in plan.recompute:
                x = [self.comp(kern, x, recompute=True, **where)]
        x = self.attention(k["attention"], x, "kv_and_grad", None, **where)
        x = self.row_gemm(k["qkv"], x, ("bwd", mb, layer, "attn_in_grad"), **where)
        x = [self.comp(k["attn_norm"], x, **where)]
        if "launch_gap" in k:
            x = [self.comp(k["launch_gap"], x, **where)]
        self._reduce_scatters(mb, layer, x[0])
        return x

    # ---------------------------------------------------------------------------------------- passes

    def forward(self, mb: int, chunk: int) -> None:
        vs = chunk * self.p + self.stage
        last = self.p * self.v - 1
        layers = self.chunks[chunk]
        where: dict[str, Any] = dict(phase="fwd", mb=mb, chunk=chunk)
        x: list[int] = []
        if vs > 0:
            got = self.ops.take("recv", "fwd", mb, None, f"activation_vstage{vs - 1}")
            if got is not None:
                x = [self.recv(*got)]
            x = self.blocking(x, "fwd", mb, None, f"activation_gather_vstage{vs}")
        self._start_gathers("fwd", mb, vs, layers)
        if vs == 0:
            assert self.k.embedding is not None
            x = [self.comp(self.k.embedding[0], x, unit=None, **where)]
            x = self.blocking(x, "fwd", mb, None, "embedding")
        for layer in layers:
            x = self.layer_forward(mb, layer, x, chunk)
        if vs == last:
            x = self.head_forward(mb, x, chunk)
        self._end_pass("fwd", mb, vs, layers)
        if vs < last:
            got = self.ops.take("send", "fwd", mb, None, f"activation_vstage{vs}")
            if got is not None:
                s = self.comm(*got, x)
                if self.blocking_p2p:
                    self.block.append(s)
        self.flush()

    def head_forward(self, mb: int, x: list[int], chunk: int) -> list[int]:
        where: dict[str, Any] = dict(phase="fwd", mb=mb, chunk=chunk)
        norm, logits, ce = self.k.head_forward
        x = [self.comp(norm, x, unit=None, **where)]
        x = self.blocking(x, "fwd", mb, None, "output_input")
        x = self.col_gemm(logits, x, ("fwd", mb, None, "logits_in"), **where)
        x = self.blocking(x, "fwd", mb, None, "logits")
        # vocabulary-parallel cross-entropy: an all-reduce after the max, the target logit and the sum of exps
        ars = self.ops.take_all("coll", "fwd", mb, None, "cross_entropy")
        part = Kernel(name=ce.name, kernel=ce.kernel, time_s=ce.time_s / (len(ars) + 1), flop=ce.flop / (len(ars) + 1),
                      hbm_bytes=ce.hbm_bytes / (len(ars) + 1))
        for op, j in ars:
            x = [self.comm(op, j, [self.comp(part, x, **where)])]
        return [self.comp(part, x, **where)]

    def head_backward(self, mb: int, x: list[int], chunk: int) -> list[int]:
        where: dict[str, Any] = dict(phase="bwd", mb=mb, chunk=chunk)
        ce, logits, norm = self.k.head_backward
        x = [self.comp(ce, x, unit=None, **where)]
        x = self.row_gemm(logits, x, ("bwd", mb, None, "logits_in_grad"), **where)
        x = self.blocking(x, "bwd", mb, None, "output_input_grad")
        return [self.comp(norm, x, **where)]

    def backward(self, mb: int, chunk: int) -> None:
        vs = chunk * self.p + self.stage
        last = self.p * self.v - 1
        layers = self.chunks[chunk]
        where: dict[str, Any] = dict(phase="bwd", mb=mb, chunk=chunk)
        x: list[int] = []
        if vs < last:
            got = self.ops.take("recv", "bwd", mb, None, f"activation_grad_vstage{vs + 1}")
            if got is not None:
                x = [self.recv(*got)]
            x = self.blocking(x, "bwd", mb, None, f"activation_grad_gather_vstage{vs}")
        self._start_gathers("bwd", mb, vs, layers)
        if vs == last:
            x = self.head_backward(mb, x, chunk)
            if vs != 0:
                self._reduce_scatters(mb, None, x[0])
        for layer in reversed(layers):
            x = self.layer_backward(mb, layer, x, chunk)
        if vs == 0:
            assert self.k.embedding is not None
            x = self.blocking(x, "bwd", mb, None, "embedding_grad")
            x = [self.comp(self.k.embedding[1], x, unit=None, **where)]
            self._reduce_scatters(mb, None, x[0])
        acc = self.k.accumulate[chunk] if chunk < len(self.k.accumulate) else None
        if acc is not None:
            x = [self.comp(acc, x, **where)]
        x = self.blocking(x, "bwd", mb, None, "norm_weight_grad")
        self._end_pass("bwd", mb, vs, layers)
        if vs > 0:
            got = self.ops.take("send", "bwd", mb, None, f"activation_grad_vstage{vs}")
            if got is not None:
                s = self.comm(*got, x)
                if self.blocking_p2p:
                    self.block.append(s)
        elif x and self.nodes[x[0]].type != "comp":
            self.block += x  # the pass ends in a collective: the next compute waits for it
        self.flush()

    def tail(self) -> None:
        """Gradient reduction, the sync of replicated parameters, the optimizer step, the parameter gathers."""
        self.flush()
        self.optimizer_deps += [nid for ids in self.unwaited for nid in ids]
        last = [] if self.comp_tail is None else [self.comp_tail]
        for _, op, j in self.window:  # buckets the window did not reach (rounding): at its end
            self.optimizer_deps.append(self.comm(op, j, last, "async"))
        self.window = []
        for op, j in self.grad_buckets:
            self.optimizer_deps.append(self.comm(op, j, last, "async"))
        for name in ("norm_weight_grad", "sequence_parallel_grads", "embedding_grads"):
            for phase in ("bwd", "optim"):
                for op, j in self.ops.take_all("coll", phase, None, None, name):
                    self.optimizer_deps.append(self.comm(op, j, last))
        for _, ids in self.param_buckets:  # gathers the first forward never reached (none of its kernels take time)
            self.optimizer_deps += ids
        self.param_buckets = []
        opt = self.comp(self.k.optimizer, self.optimizer_deps, phase="optim", mb=None)
        for op, j in self.ops.take_once(lambda kind, phase, name: kind == "coll" and phase == "optim"
                                        and "params_bucket" in name):
            self.comm(op, j, [opt], "async")
        for op, j in self.ops.rest():
            self.unplaced.append((op, j))
            if op.op == "recv":
                self.recv(op, j)
            else:
                self.comm(op, j, [opt])

    def build(self) -> None:
        order = stage_order(self.job.schedule, self.p, self.m, self.stage, self.v)
        for i, (kind, mb, chunk) in enumerate(order):
            self.next_pass = order[i + 1] if i + 1 < len(order) else None
            (self.forward if kind == "fwd" else self.backward)(mb, chunk)
        self.tail()


#: The "unit" after a pass's last: the next pass's first, whose gathers run during this pass's last unit.
_NEXT_PASS = "next pass"


def _unit_name(unit: Any) -> str:
    """FSDP2's name of a unit: ``root`` (embedding, head) or ``layer<i>``."""
    return "root" if unit is None else f"layer{unit}"


def rank_program(job: TraceJob, rank: int) -> tuple[list[TraceNode], list[tuple[CommOp, int]]]:
    """The nodes of ``rank`` in program order (ids are positions; every dependency points to an earlier node), and
    the op instances no rule placed (see the module docstring)."""
    prog = _Program(job, rank)
    prog.build()
    return prog.nodes, prog.unplaced
