"""A process group that records every op and hands it to the real backend.

``RecordingProcessGroup`` subclasses ``torch.distributed.ProcessGroup``; the creator registered as the
``commscope`` backend builds the real backend (gloo on CPU, NCCL on CUDA) for the same store and ranks and
wraps it. Because c10d dispatches through the process group object, this sees every op of DDP's C++
reducer, FSDP2, DTensor (its functional collectives included) and pipelining, not only direct
``torch.distributed`` calls (DESIGN.md, "Real components").

Nothing about the op changes: the wrapper forwards the same tensors and options to the real backend and
returns its Work seen through a thin wrapper that notes when the job's thread sees the op complete (see
"completion times" below). It waits itself only on a blocking CPU op (``opts.asyncOp`` false:
``dist.all_reduce(t)``), which c10d would wait on the moment it returns; that one needs no wrapper.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from commscope.measure.capture.oprecord import R_END, R_SINK, R_WORK

BACKEND_NAME = "commscope"
INNER_BACKEND_ENV = "COMMSCOPE_INNER_BACKEND"

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                torch.int64: "int64", torch.int32: "int32", torch.uint8: "uint8", torch.int8: "int8", torch.bool: "bool"}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    return name if name is not None else str(dtype).removeprefix("torch.")


class _OpByOp:
    """A backend as :meth:`RecordingProcessGroup._get_backend` shows it: the inner one, but not coalescing."""

    supports_coalescing = False

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class RecordingProcessGroup(dist.ProcessGroup):
    """Forwards every op to ``inner`` and records it into ``sink`` (a :class:`commscope.measure.capture.recorder.RankLog`, or
    ``_current_sink``: the one :func:`set_sink` set); records are lists (:mod:`commscope.measure.capture.oprecord`)."""

    def __init__(self, inner: Any, rank: int, size: int, global_ranks: list[int], group_name: str, inner_name: str,
                 sink) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # torch's stub lists only (store, rank, size)
        self._inner = inner
        self._ranks = list(global_ranks)
        self._group_name = group_name
        self._inner_name = inner_name
        self._sink = sink
        self._seq = 0
        self._me = self._ranks[rank]
        self._rank_in_group = rank
        self._view: Any = None  # a c10d ProcessGroup over ``inner``, made when first needed (see _coalesced)
        self._shapes: dict[tuple[str, Any, str | None], tuple] = {}  # (op, dtype, backend op) -> a record's R_SHAPE
        self._follows: dict[str, type[_TimedWork]] = {}  # op -> the wrapper of its Works (see _follow_class)
        self._waits = inner_name != "nccl" and _HAS_ASYNC_OP  # blocking CPU ops are waited inside (see _one)
        # gloo has no native reduce-scatter: it all-reduces the whole input and keeps its slice (DESIGN.md)
        self._rs_backend_op = "all_reduce" if inner_name == "gloo" else "reduce_scatter"
        self._t0 = 0

    # ----- identity -----
    def getBackendName(self) -> str:  # c10d's name
        return BACKEND_NAME

    def _get_backend(self, device: Any) -> Any:
        """The backend of ``device``, as torch's own Python code asks a group for it (torch 2.14's batch_isend_irecv,
        which pipelining's stages use, and FSDP2's buffers; this group registers none with c10d, so the base
        method raised 'No backend type associated with device type cpu'): the inner backend, seen as one that does
        not coalesce, so that a batch of sends and receives comes to this group op by op and each is recorded, as
        torch 2.13 and earlier send it to a group of a ProcessGroup subclass."""
        return _OpByOp(self._inner)

    @property
    def group_name(self) -> GroupName:
        return GroupName(self._group_name)

    @property
    def group_desc(self) -> str:
        return getattr(self, "_desc", self._group_name)

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc
        super()._set_group_desc(desc)

    @property
    def inner(self) -> Any:
        return self._inner

    def __repr__(self) -> str:
        return f"RecordingProcessGroup({self._inner_name}, ranks={self._ranks})"

    # ----- recording -----
    def _one(self, sink, t0: int, work, op: str, dtype, size: int, n_in: int, n_out: int, opts,
             backend_op: str | None = None, shape: tuple | None = None):
        """Record into ``sink`` one op issued at ``t0`` as ``work`` (``dtype``: the tensor's, or a name); returns the
        Work to hand back to the job. This runs once per op inside the job's step, where the caches are cold: one
        frame, one list for the record, no lookups it can do without (arguments by position from the ops)."""
        if shape is None:  # the common shape: its fields and line text made once per op, dtype and backend op
            shape = self._shapes.get((op, dtype, backend_op))
            if shape is None:
                shape = self._shape(op, dtype, backend_op)
        self._seq = seq = self._seq + 1
        if _INFLIGHT:
            observe_completions()
        if len(sink.buf) >= sink.batch or t0 >= sink.flush_due_ns:  # (sink.due(t0), inline)
            sink.flush()
        if opts is not None and self._waits and not opts.asyncOp:
            # a blocking call (``dist.all_reduce(t)``: c10d waits on the Work as soon as it has it): waited here,
            # where the job's thread would wait a moment later, so no Work of ours stands between (a CUDA Work's
            # wait() only orders streams: those keep the wrapper, which looks at completion)
            rec = [shape, size, t0, seq, n_in, n_out, sink._step, None, None, sink]
            try:
                work.wait()
            except BaseException:
                sink.buf.append(rec)  # the record goes out without an end; the job sees the backend's error as it would
                raise
            rec[R_END] = end = time.time_ns()
            sink.buf.append(rec)
            if end >= sink.flush_due_ns or len(sink.buf) >= sink.batch:
                sink.flush()
            return work
        rec = [shape, size, t0, seq, n_in, n_out, sink._step, None, work, sink]
        _INFLIGHT[id(rec)] = rec
        cls = self._follows.get(op)
        if cls is None:
            cls = self._follow_class(op, work)
        tw = cls()  # (attributes set here, not in a Python __init__: one frame less per op)
        tw._inner, tw._rec = work, rec
        return tw

    def _shape(self, op: str, dtype, backend_op: str | None) -> tuple:
        from commscope.io.oplog import line_forms

        fields = self._fields(op, dtype, backend_op)
        shape = self._shapes[(op, dtype, backend_op)] = (
            line_forms(op, self._ranks, self._me, fields["dtype"], self._group_name, self._inner_name,
                       fields.get("backend_op")),
            fields)
        return shape

    def _fields(self, op: str, dtype, backend_op: str | None) -> dict[str, Any]:
        """The constant fields of ``op``'s records (``dtype``: the tensor's, or a name)."""
        fields = {"op": op, "group": self._ranks, "rank": self._me,
                  "dtype": dtype if isinstance(dtype, str) else _dtype_name(dtype), "backend": self._inner_name,
                  "group_name": self._group_name}
        if backend_op is not None and backend_op != op:
            fields["backend_op"] = backend_op
        return fields

    def _follow_class(self, op: str, work) -> type[_TimedWork]:
        """The Work wrapper for ``op``'s Works on this backend: whether they have a future (something follows an
        op the job does not wait on, DDP's buckets) is asked once per op (gloo's reduce-scatter and p2p have none),
        which takes every Work of one op of one backend to be alike (so they are in gloo's and NCCL's sources: gloo's
        reduce-scatters are all LambdaWorks, NCCL's getFuture returns the Work's future)."""
        try:
            work.get_future()
            followed = True
        except Exception:  # noqa: BLE001 - a backend's "not supported" for this op
            followed = False
        cuda = self._inner_name == "nccl"
        cls = self._follows[op] = ((_TimedCudaWork if cuda else _TimedWork) if followed
                                   else (_UnfollowedCudaWork if cuda else _UnfollowedWork))
        return cls

    def _record(self, op: str, work, size_bytes: int, dtype, bytes_in: int, bytes_out: int,
                peer: int | None = None, splits=None, backend_op: str | None = None, root: int | None = None,
                opts=None):
        """Record one op issued (at :meth:`_start`) as ``work``, of any shape; the Work to hand back to the job."""
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:  # recording stopped: the op runs as it would without commscope
            return work
        shape = None
        if peer is not None or splits is not None or root is not None:
            fields = self._fields(op, dtype, backend_op)
            if peer is not None:
                fields["peer"] = self._ranks[peer]
            if splits is not None:
                fields["splits"] = [int(x) for x in splits]
            if root is not None:
                fields["root"] = self._ranks[root]
            shape = (None, fields)
        return self._one(sink, self._t0, work, op, dtype, size_bytes, bytes_in, bytes_out, opts, backend_op, shape)

    def _record_batch(self, sink, op: str, work, members: list[tuple]):
        """One record per member ``(size_bytes, dtype, bytes_in, bytes_out, backend_op)`` of a coalesced batch, all
        completing with the batch's one Work, into ``sink``."""
        if _INFLIGHT:
            observe_completions()
        recs = []
        for size, dtype, n_in, n_out, backend_op in members:
            shape = self._shapes.get((op, dtype, backend_op)) or self._shape(op, dtype, backend_op)
            self._seq += 1
            rec = [shape, size, self._t0, self._seq, n_in, n_out, sink._step, None, work, sink]
            _INFLIGHT[id(rec)] = rec
            recs.append(rec)
        tw = _TimedBatch()
        tw._inner, tw._rec, tw._cuda = work, recs, self._inner_name == "nccl"
        tw._followed = not issubclass(self._follows.get(op) or self._follow_class(op, work), _LetGo)
        return tw

    def _start(self) -> None:
        self._t0 = time.time_ns()

    def _call(self, name: str, *args, opts=None):
        """The inner backend's op ``name``; its options only when c10d passed some (the bindings default them)."""
        fn = getattr(self._inner, name)
        return fn(*args) if opts is None else fn(*args, opts)

    # ----- collectives (names as c10d's Python process-group trampoline calls them) -----
    # The frequent ones (all_reduce; all-gather and reduce-scatter of FSDP2, sequence parallelism and DTensor) take
    # the time and hand the record to _one in their own frame; the others go through _start and _record.
    def allreduce(self, tensors, opts=None):
        t0 = time.time_ns()
        work = self._inner.allreduce(tensors) if opts is None else self._inner.allreduce(tensors, opts)
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        t = tensors[0]
        n = t.numel() * t.element_size() if len(tensors) == 1 else sum(_nbytes(x) for x in tensors)
        return self._one(sink, t0, work, "all_reduce", t.dtype, n, n, n, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        self._start()
        work = self._call("allreduce_coalesced", tensors, opts=opts)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("all_reduce", work, n, tensors[0].dtype, n, n, opts=opts)

    def allgather(self, output_lists, input_tensors, opts=None):
        self._start()
        work = self._call("allgather", output_lists, input_tensors, opts=opts)
        n_in = sum(_nbytes(t) for t in input_tensors)
        n_out = sum(_nbytes(t) for lst in output_lists for t in lst)
        return self._record("all_gather", work, n_out, input_tensors[0].dtype, n_in, n_out, opts=opts)

    def all_gather_single(self, output, input, opts=None):  # C++ _allgather_base
        t0 = time.time_ns()
        inner = self._inner
        work = inner._allgather_base(output, input) if opts is None else inner._allgather_base(output, input, opts)
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        n_out = output.numel() * output.element_size()
        return self._one(sink, t0, work, "all_gather", input.dtype, n_out, input.numel() * input.element_size(), n_out, opts)

    def _coalesced(self, name: str, outputs, inputs, opts):
        """Issue several ops as one coalesced batch of the inner backend, one Work, asynchronous as without
        commscope: c10d's own coalescing where the backend has it (NCCL), else the backend's own coalesced op
        (gloo's, reached through a process group over it: its Python binding has none)."""
        inner = self._inner
        if getattr(inner, "supports_coalescing", False):
            single = "_allgather_base" if name == "allgather_into_tensor_coalesced" else "_reduce_scatter_base"
            device = outputs[0].device
            inner._start_coalescing(device)
            for out, inp in zip(outputs, inputs):
                self._call(single, out, inp, opts=opts)
            return inner._end_coalescing(device)
        view = self._view
        if view is None:
            view = self._view = _backend_view(inner, self._rank_in_group, self.size(), outputs[0].device,
                                              self._inner_name)
        fn = getattr(view, name)
        return fn(outputs, inputs) if opts is None else fn(outputs, inputs, opts)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        t0 = time.time_ns()
        work = self._coalesced("allgather_into_tensor_coalesced", outputs, inputs, opts)
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        if len(outputs) == 1:  # FSDP2's all-gathers: one record, made as any op's
            out, inp = outputs[0], inputs[0]
            n_out = out.numel() * out.element_size()
            return self._one(sink, t0, work, "all_gather", inp.dtype, n_out, inp.numel() * inp.element_size(), n_out, opts)
        self._t0 = t0
        return self._record_batch(sink, "all_gather", work, [(_nbytes(out), inp.dtype, _nbytes(inp), _nbytes(out), None)
                                                       for out, inp in zip(outputs, inputs)])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        self._start()
        work = self._call("reduce_scatter", outputs, input_lists, opts=opts)
        n_in = sum(_nbytes(t) for lst in input_lists for t in lst)
        return self._record("reduce_scatter", work, n_in, outputs[0].dtype, n_in, sum(_nbytes(t) for t in outputs),
                            backend_op=self._rs_backend_op, opts=opts)

    def reduce_scatter_single(self, output, input, opts=None):  # C++ _reduce_scatter_base
        t0 = time.time_ns()
        inner = self._inner
        work = inner._reduce_scatter_base(output, input) if opts is None else inner._reduce_scatter_base(output, input,
                                                                                                         opts)
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        n_in = input.numel() * input.element_size()
        return self._one(sink, t0, work, "reduce_scatter", input.dtype, n_in, n_in, output.numel() * output.element_size(),
                         opts, self._rs_backend_op)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        t0 = time.time_ns()
        work = self._coalesced("reduce_scatter_tensor_coalesced", outputs, inputs, opts)
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        if len(outputs) == 1:  # FSDP2's reduce-scatters: one record, made as any op's
            out, inp = outputs[0], inputs[0]
            n_in = inp.numel() * inp.element_size()
            return self._one(sink, t0, work, "reduce_scatter", inp.dtype, n_in, n_in, out.numel() * out.element_size(), opts,
                             self._rs_backend_op)
        self._t0 = t0
        return self._record_batch(sink, "reduce_scatter", work, [
            (_nbytes(inp), inp.dtype, _nbytes(inp), _nbytes(out), self._rs_backend_op)
            for out, inp in zip(outputs, inputs)])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # C++ alltoall_base
        self._start()
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])
        work = self._call("alltoall_base", output, input, out_splits, in_splits, opts=opts)
        n = self.size()
        row_bytes = (input.numel() // max(input.shape[0], 1)) * input.element_size() if input.dim() else input.element_size()
        sends = [s * row_bytes for s in in_splits] if in_splits else [_nbytes(input) // n] * n
        return self._record("all_to_all", work, _nbytes(input), input.dtype, _nbytes(input), _nbytes(output),
                            splits=sends, opts=opts)

    def alltoall(self, outputs, inputs, opts=None):
        self._start()
        work = self._call("alltoall", outputs, inputs, opts=opts)
        sends = [_nbytes(t) for t in inputs]
        return self._record("all_to_all", work, sum(sends), inputs[0].dtype, sum(sends),
                            sum(_nbytes(t) for t in outputs), splits=sends, opts=opts)

    def broadcast(self, tensors, opts=None):
        self._start()
        work = self._call("broadcast", tensors, opts=opts)
        n = sum(_nbytes(t) for t in tensors)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("broadcast", work, n, tensors[0].dtype, n, n, root=root, opts=opts)

    def reduce(self, tensors, opts=None):
        self._start()
        work = self._call("reduce", tensors, opts=opts)
        n = sum(_nbytes(t) for t in tensors)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("reduce", work, n, tensors[0].dtype, n, n, root=root, opts=opts)

    def gather(self, output_lists, inputs, opts=None):
        self._start()
        work = self._call("gather", output_lists, inputs, opts=opts)
        n_in = sum(_nbytes(t) for t in inputs)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("gather", work, n_in * self.size(), inputs[0].dtype, n_in,
                            sum(_nbytes(t) for lst in output_lists for t in lst), root=root, opts=opts)

    def scatter(self, outputs, input_lists, opts=None):
        self._start()
        work = self._call("scatter", outputs, input_lists, opts=opts)
        n_out = sum(_nbytes(t) for t in outputs)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("scatter", work, n_out * self.size(), outputs[0].dtype,
                            sum(_nbytes(t) for lst in input_lists for t in lst), n_out, root=root, opts=opts)

    def barrier(self, opts=None):
        self._start()
        work = self._call("barrier", opts=opts)
        return self._record("barrier", work, 0, "none", 0, 0, opts=opts)

    def send(self, tensors, dst, tag=0):
        self._start()
        work = self._inner.send(tensors, dst, tag)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("send", work, n, tensors[0].dtype, n, 0, peer=dst)

    def recv(self, tensors, src, tag=0):
        self._start()
        work = self._inner.recv(tensors, src, tag)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("recv", work, n, tensors[0].dtype, 0, n, peer=src)

    def recv_anysource(self, tensors, tag=0):
        self._start()
        work = self._inner.recv_anysource(tensors, tag)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("recv", work, n, tensors[0].dtype, 0, n)


def _inner_backend_name() -> str:
    name = os.environ.get(INNER_BACKEND_ENV)
    if name:
        return name
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


_SINK = None  # set by commscope.measure.capture.recorder when recording starts; one per process

# ----- completion times -----
# An op's completion time is stamped by the job's own thread, the first time it sees the op complete: when
# the recorder's own wait on a blocking op returns (gloo), when
# wait() on the op's Work returns (gloo; on NCCL wait() only orders streams, so there the Work must report
# itself completed), or when commscope looks at the ops still in flight: at each op issued on this process,
# at each step mark and when the log closes. Ops the job waits on get exact times; ops it follows through
# their future (DDP's buckets) get the first moment commscope looked, an upper bound.
#
# Not done on purpose: a done-callback on the Work's future. It runs on the backend's completion thread and
# needs the GIL there: the backend's thread then waits for the training thread to release the GIL before it
# can complete the next op. With 8 ranks on 2 cores that cost 30-45% of step time; this costs ~2%
# (benchmarks/bench_capture.py).

_INFLIGHT: dict[int, list] = {}
"""Recorded ops not yet seen complete: id of the record -> the record (its R_WORK the backend's Work)."""
_NO_TIMEOUT = timedelta(0)  # Work.wait's default: no timeout
_HAS_ASYNC_OP = hasattr(dist.AllreduceOptions(), "asyncOp")  # (torch < 2.7: no blocking flag; every op is followed)


def _finish(rec: list, completed: bool) -> None:
    """Hand ``rec`` to its log, seen complete now or (``completed`` false) without an end; once."""
    if _INFLIGHT.pop(id(rec), None) is not None:
        if completed:
            rec[R_END] = time.time_ns()
        rec[R_WORK] = None  # the backend's Work (and its tensors) no longer held
        rec[R_SINK].take(rec)


def _is_completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - a backend that cannot tell: seen complete when waited on, or at the end
        return False


def observe_completions() -> int:
    """Stamp the completion time of every recorded op in flight that is now complete; how many were."""
    done = [rec for rec in list(_INFLIGHT.values()) if _is_completed(rec[R_WORK])]
    for rec in done:
        _finish(rec, True)
    return len(done)


def wait_inflight(timeout_s: float = 2.0, sink=None) -> bool:
    """Wait until every recorded op (of ``sink``, or all) is seen complete; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        observe_completions()
        if not any(sink is None or rec[R_SINK] is sink for rec in list(_INFLIGHT.values())):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)


def finish_inflight(sink=None) -> int:
    """Hand on the records (of ``sink``, or all) still in flight, without a completion time; how many."""
    recs = [rec for rec in list(_INFLIGHT.values()) if sink is None or rec[R_SINK] is sink]
    for rec in recs:
        _finish(rec, False)
    return len(recs)


class _TimedWork(dist.Work):
    """The Work returned to the job for one op: the backend's own, seen through, so that wait() stamps completion.
    (Subclasses: a CUDA op's, whose wait() only orders streams; those of ops whose Work has no future; a coalesced
    batch's.)"""

    __slots__ = ("_inner", "_rec")  # one per op: no instance dict; set by who makes it (see _one)
    _inner: Any
    """The backend's Work."""
    _rec: Any
    """The op's record (the list of its members' records for a coalesced batch: :class:`_TimedBatch`)."""

    def _recs(self) -> tuple | list:
        """The records this Work completes."""
        return (self._rec,)

    def _seen(self, completed: bool) -> None:
        for rec in self._recs():
            _finish(rec, completed)

    def wait(self, timeout: timedelta = _NO_TIMEOUT):
        try:
            ok = self._inner.wait(timeout) if timeout else self._inner.wait()
        except BaseException:  # the backend's error (a peer gone, a timeout): the job sees it as it would, and the
            self._seen(False)  # record goes out without an end (gloo marks a failed Work completed: a later look
            raise  # would stamp it as if it had succeeded)
        rec = self._rec  # _finish(rec, True), inline: this runs once per op the job waits on
        if _INFLIGHT.pop(id(rec), None) is not None:
            rec[R_END] = end = time.time_ns()
            rec[R_WORK] = None
            sink = rec[R_SINK]
            sink.buf.append(rec)
            if end >= sink.flush_due_ns or len(sink.buf) >= sink.batch:  # (sink.due(end), inline)
                sink.flush()
        return ok

    def _inner_wait(self, timeout: timedelta):
        """The backend's wait(); when it raises, the records go out without an end (see wait)."""
        try:
            return self._inner.wait(timeout) if timeout else self._inner.wait()
        except BaseException:
            self._seen(False)
            raise

    def is_completed(self) -> bool:
        done = self._inner.is_completed()
        if done:
            self._seen(True)
        return done

    def get_future(self):
        return self._inner.get_future()

    def is_success(self) -> bool:
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def source_rank(self) -> int:
        return self._inner.source_rank()

    def result(self):
        return self._inner.result()

    def synchronize(self):
        return self._inner.synchronize()

    def block_current_stream(self):
        return self._inner.block_current_stream()

    def get_future_result(self):
        return self._inner.get_future_result()

    def _get_duration(self) -> float:
        return self._inner._get_duration()

    def _get_op_type(self):
        return self._inner._get_op_type()


class _TimedCudaWork(_TimedWork):
    """A CUDA op's: wait() only makes the current stream wait for it, so it is stamped when the Work says it is
    complete (then, or at a later look)."""

    __slots__ = ()

    def wait(self, timeout: timedelta = _NO_TIMEOUT):
        ok = self._inner_wait(timeout)
        if _is_completed(self._inner):
            self._seen(True)
        return ok


class _LetGo:
    """For ops whose Work has no future (gloo's reduce-scatter and p2p): nothing follows such an op that the job
    lets go of unwaited, and gloo's reduce-scatter Works never say they completed, so its record goes out when the
    job lets go of it, with an end only if it has one. (Only these pay for a __del__, once per op.)"""

    __slots__ = ()

    def __del__(self) -> None:
        try:
            for rec in self._recs():  # type: ignore[attr-defined]
                if id(rec) in _INFLIGHT:
                    _finish(rec, _is_completed(rec[R_WORK]))
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: the log's close() writes what is left
            pass


class _UnfollowedWork(_LetGo, _TimedWork):
    __slots__ = ()


class _UnfollowedCudaWork(_LetGo, _TimedCudaWork):
    __slots__ = ()


class _TimedBatch(_TimedWork):
    """The one Work of a coalesced batch (its ``_rec``: the members' records, all completing with it)."""

    __slots__ = ("_cuda", "_followed")
    _cuda: bool
    _followed: bool
    """Whether the Work has a future (see :class:`_LetGo`: without one, the records go out when it is let go)."""

    def _recs(self) -> tuple | list:
        return self._rec

    def wait(self, timeout: timedelta = _NO_TIMEOUT):
        ok = self._inner_wait(timeout)
        if not self._cuda or _is_completed(self._inner):
            self._seen(True)
        return ok

    def __del__(self) -> None:
        if not self._followed:
            _LetGo.__del__(self)  # type: ignore[arg-type]


def set_sink(sink) -> None:
    global _SINK
    _SINK = sink


class _CurrentSink:
    """Stands for "the active sink" (set_sink) in process groups the backend creator builds."""


_current_sink = _CurrentSink()


def _backend_view(inner: Any, rank: int, size: int, device: torch.device, inner_name: str) -> Any:
    """A c10d ProcessGroup whose one backend is ``inner``: its methods reach the backend's C++ ops that the
    backend's own Python binding leaves out (gloo's coalesced all-gather and reduce-scatter)."""
    view = dist.ProcessGroup(rank, size)  # type: ignore[call-arg]  # torch's stub lists only (store, rank, size)
    kind = dist.ProcessGroup.BackendType.NCCL if inner_name == "nccl" else dist.ProcessGroup.BackendType.GLOO
    view._register_backend(device, kind, inner)
    view._set_default_backend(kind)
    return view


RUN_ID_ENV = "COMMSCOPE_RUN_ID"
_RUN: dict[str, Any] = {}
"""What the first process group made in this process (the default one, every rank's) says of the run: its
``run_id``, which every rank of the run shares, and its ``world_size``; rank logs put both in their header."""


os.register_at_fork(after_in_child=_RUN.clear)  # a forked rank is a process of its own run, not its parent's


def run_info() -> dict[str, Any]:
    """``run_id`` and ``world_size`` of the run this process recorded in (empty before its first group)."""
    return dict(_RUN)


def _note_run(store: Any, rank: int, size: int) -> None:
    """On the first group of the process (all ranks make the default group together): the run's id, from the
    launcher (``commscope record``, ``workload``) or agreed through the group's store (rank 0 draws it)."""
    if _RUN:
        return
    run_id = os.environ.get(RUN_ID_ENV)
    if not run_id:
        import uuid

        key = "commscope_run_id"
        try:
            if rank == 0:
                run_id = uuid.uuid4().hex
                store.set(key, run_id)
            else:  # bounded: a job that records on some ranks only has no rank 0 to set it; never hang on it
                store.wait([key], timedelta(seconds=10))
                run_id = store.get(key).decode()
        except Exception:  # noqa: BLE001 - a store that cannot, or no rank 0 recording: logs without an id (as before)
            run_id = None
    _RUN.update(run_id=run_id, world_size=size)


def _create(opts, pg_options=None):
    """Creator registered with c10d (extended API: it gets the group's global ranks)."""
    inner_name = _inner_backend_name()
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    _note_run(store, rank, size)
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=1800)
    if inner_name == "gloo":
        inner = dist.ProcessGroupGloo(store, rank, size, timeout)
    elif inner_name == "nccl":
        from torch.distributed import ProcessGroupNCCL

        nccl_opts = ProcessGroupNCCL.Options()
        nccl_opts._timeout = timeout
        inner = ProcessGroupNCCL(store, rank, size, nccl_opts)
    else:
        raise ValueError(f"{INNER_BACKEND_ENV}={inner_name!r}: valid: gloo, nccl")
    ranks = list(opts.global_ranks_in_group) or list(range(size))
    return RecordingProcessGroup(inner, rank, size, ranks, str(opts.group_id), inner_name, _current_sink)


def register() -> None:
    """Make ``commscope`` a torch.distributed backend (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])
