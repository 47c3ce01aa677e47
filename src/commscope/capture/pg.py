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

BACKEND_NAME = "commscope"
INNER_BACKEND_ENV = "COMMSCOPE_INNER_BACKEND"

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                torch.int64: "int64", torch.int32: "int32", torch.uint8: "uint8", torch.int8: "int8", torch.bool: "bool"}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _dtype(t: torch.Tensor) -> str:
    name = _DTYPE_NAMES.get(t.dtype)  # (not .get(dtype, default): that would build the default string every op)
    return name if name is not None else str(t.dtype).removeprefix("torch.")


class RecordingProcessGroup(dist.ProcessGroup):
    """Forwards every op to ``inner`` and reports it to ``sink(record_dict)``."""

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
        self._forms: dict[tuple[str, str, str | None], tuple[str, ...]] = {}  # the writer's line forms

    # ----- identity -----
    def getBackendName(self) -> str:  # c10d's name
        return BACKEND_NAME

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
    def _record(self, op: str, work, size_bytes: int, dtype: str, bytes_in: int, bytes_out: int,
                peer: int | None = None, splits=None, backend_op: str | None = None, root: int | None = None,
                opts=None):
        """Record one op issued as ``work``; returns the Work to hand back to the job. (Arguments are passed on
        by position: this runs once per op, and every microsecond here is the job's.)"""
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:  # recording stopped: the op runs as it would without commscope
            return work
        return self._issued(work, self._make_record(op, sink, size_bytes, dtype, bytes_in, bytes_out, peer, splits,
                                                     backend_op, root), sink, opts)

    def _issued(self, work, rec: dict, sink, opts):
        """Follow the op of ``rec``, issued as ``work``, to its completion; the Work to hand back to the job."""
        if _INFLIGHT:
            observe_completions()
        if opts is not None and not getattr(opts, "asyncOp", True) and self._inner_name != "nccl":  # (torch < 2.7: none)
            # a blocking call (``dist.all_reduce(t)``: c10d waits on the Work as soon as it has it): waited here,
            # where the job's thread would wait a moment later, so no Work of ours stands between (a CUDA Work's
            # wait() only orders streams: those keep the wrapper, which looks at completion)
            try:
                work.wait()
            except BaseException:
                sink(rec)  # the record goes out without an end; the job sees the backend's error as it would
                raise
            rec["t_end_ns"] = time.time_ns()
            sink(rec)
            return work
        key = id(rec)
        _INFLIGHT[key] = (work, rec, sink, self._inner_name)
        tw = _TimedWork()  # (attributes set here, not in a Python __init__: one frame less per op)
        tw._inner, tw._key, tw._keys = work, key, None
        return tw

    def _record_batch(self, op: str, work, members: list[dict]):
        """One record per member of a coalesced batch, all completing with the batch's one Work."""
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        return _track(work, [self._make_record(op, sink, **fields) for fields in members], sink, self._inner_name)

    def _make_record(self, op: str, sink, size_bytes: int, dtype: str, bytes_in: int, bytes_out: int,
                     peer: int | None = None, splits=None, backend_op: str | None = None,
                     root: int | None = None) -> dict:
        self._seq = seq = self._seq + 1
        # (sizes are ints already: every caller counts them with _nbytes or from ints)
        rec = {"op": op, "group": self._ranks, "rank": self._me, "size_bytes": size_bytes, "dtype": dtype,
               "t_start_ns": self._t0, "backend": self._inner_name, "group_name": self._group_name, "seq": seq,
               "bytes_in": bytes_in, "bytes_out": bytes_out}
        if backend_op is not None and backend_op != op:
            rec["backend_op"] = backend_op
        else:
            backend_op = None
        if peer is None and splits is None and root is None:
            # the common shape: the constant text of its log line is prepared once per op, dtype and backend op
            form = self._forms.get((op, dtype, backend_op))
            rec["_form"] = form if form is not None else self._form(op, dtype, backend_op)
        else:
            if peer is not None:
                rec["peer"] = self._ranks[peer]
            if splits is not None:
                rec["splits"] = [int(x) for x in splits]
            if root is not None:
                rec["root"] = self._ranks[root]
        # the training step is the one current when the op is issued: the op can be seen complete after the job
        # has moved on to the next step (DDP's last bucket, say)
        step = getattr(sink, "_step", _NO_STEP)  # a RankLog's current step (its attribute, not the property: faster)
        if step is not _NO_STEP:
            rec["step"] = step
        return rec

    def _form(self, op: str, dtype: str, backend_op: str | None) -> tuple[str, ...]:
        from commscope.io.oplog import line_forms

        form = self._forms[(op, dtype, backend_op)] = line_forms(op, self._ranks, self._me, dtype, self._group_name,
                                                                 self._inner_name, backend_op)
        return form

    def _start(self) -> None:
        self._t0 = time.time_ns()

    def _call(self, name: str, *args, opts=None):
        """The inner backend's op ``name``; its options only when c10d passed some (the bindings default them)."""
        fn = getattr(self._inner, name)
        return fn(*args) if opts is None else fn(*args, opts)

    # ----- collectives (names as c10d's Python process-group trampoline calls them) -----
    def allreduce(self, tensors, opts=None):
        t0 = time.time_ns()
        work = self._inner.allreduce(tensors) if opts is None else self._inner.allreduce(tensors, opts)
        sink = self._sink if self._sink is not _current_sink else _SINK
        if sink is None:
            return work
        # the most frequent op (DDP's buckets, TP): its record made here, in one frame (as _make_record would)
        t = tensors[0]
        n = t.numel() * t.element_size() if len(tensors) == 1 else sum(_nbytes(x) for x in tensors)
        dtype = _DTYPE_NAMES.get(t.dtype)
        if dtype is None:
            dtype = _dtype(t)
        form = self._forms.get(("all_reduce", dtype, None))
        self._seq = seq = self._seq + 1
        rec = {"op": "all_reduce", "group": self._ranks, "rank": self._me, "size_bytes": n, "dtype": dtype,
               "t_start_ns": t0, "backend": self._inner_name, "group_name": self._group_name, "seq": seq,
               "bytes_in": n, "bytes_out": n,
               "_form": form if form is not None else self._form("all_reduce", dtype, None)}
        step = getattr(sink, "_step", _NO_STEP)
        if step is not _NO_STEP:
            rec["step"] = step
        return self._issued(work, rec, sink, opts)

    def allreduce_coalesced(self, tensors, opts=None):
        self._start()
        work = self._call("allreduce_coalesced", tensors, opts=opts)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("all_reduce", work, size_bytes=n, dtype=_dtype(tensors[0]), bytes_in=n, bytes_out=n, opts=opts)

    def allgather(self, output_lists, input_tensors, opts=None):
        self._start()
        work = self._call("allgather", output_lists, input_tensors, opts=opts)
        n_in = sum(_nbytes(t) for t in input_tensors)
        n_out = sum(_nbytes(t) for lst in output_lists for t in lst)
        return self._record("all_gather", work, size_bytes=n_out, dtype=_dtype(input_tensors[0]), bytes_in=n_in, bytes_out=n_out, opts=opts)

    def all_gather_single(self, output, input, opts=None):  # C++ _allgather_base
        self._start()
        work = self._call("_allgather_base", output, input, opts=opts)
        return self._record("all_gather", work, size_bytes=_nbytes(output), dtype=_dtype(input), bytes_in=_nbytes(input),
                            bytes_out=_nbytes(output), opts=opts)

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
        self._start()
        work = self._coalesced("allgather_into_tensor_coalesced", outputs, inputs, opts)
        if len(outputs) == 1:  # FSDP2's all-gathers: one record, made as any op's
            out, inp = outputs[0], inputs[0]
            return self._record("all_gather", work, _nbytes(out), _dtype(inp), _nbytes(inp), _nbytes(out), opts=opts)
        return self._record_batch("all_gather", work, [
            dict(size_bytes=_nbytes(out), dtype=_dtype(inp), bytes_in=_nbytes(inp), bytes_out=_nbytes(out))
            for out, inp in zip(outputs, inputs)])

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        self._start()
        work = self._call("reduce_scatter", outputs, input_lists, opts=opts)
        n_in = sum(_nbytes(t) for lst in input_lists for t in lst)
        return self._record("reduce_scatter", work, size_bytes=n_in, dtype=_dtype(outputs[0]), bytes_in=n_in,
                            bytes_out=sum(_nbytes(t) for t in outputs), backend_op=self._rs_backend_op(), opts=opts)

    def reduce_scatter_single(self, output, input, opts=None):  # C++ _reduce_scatter_base
        self._start()
        work = self._call("_reduce_scatter_base", output, input, opts=opts)
        return self._record("reduce_scatter", work, size_bytes=_nbytes(input), dtype=_dtype(input), bytes_in=_nbytes(input),
                            bytes_out=_nbytes(output), backend_op=self._rs_backend_op(), opts=opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        self._start()
        work = self._coalesced("reduce_scatter_tensor_coalesced", outputs, inputs, opts)
        if len(outputs) == 1:  # FSDP2's reduce-scatters: one record, made as any op's
            out, inp = outputs[0], inputs[0]
            return self._record("reduce_scatter", work, _nbytes(inp), _dtype(inp), _nbytes(inp), _nbytes(out), None, None,
                                self._rs_backend_op(), opts=opts)
        return self._record_batch("reduce_scatter", work, [
            dict(size_bytes=_nbytes(inp), dtype=_dtype(inp), bytes_in=_nbytes(inp), bytes_out=_nbytes(out),
                 backend_op=self._rs_backend_op()) for out, inp in zip(outputs, inputs)])

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def _rs_backend_op(self) -> str:
        # gloo has no native reduce-scatter: it all-reduces the whole input and keeps its slice (DESIGN.md)
        return "all_reduce" if self._inner_name == "gloo" else "reduce_scatter"

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):  # C++ alltoall_base
        self._start()
        out_splits = list(output_split_sizes or [])
        in_splits = list(input_split_sizes or [])
        work = self._call("alltoall_base", output, input, out_splits, in_splits, opts=opts)
        n = self.size()
        row_bytes = (input.numel() // max(input.shape[0], 1)) * input.element_size() if input.dim() else input.element_size()
        sends = [s * row_bytes for s in in_splits] if in_splits else [_nbytes(input) // n] * n
        return self._record("all_to_all", work, size_bytes=_nbytes(input), dtype=_dtype(input), bytes_in=_nbytes(input),
                            bytes_out=_nbytes(output), splits=sends, opts=opts)

    def alltoall(self, outputs, inputs, opts=None):
        self._start()
        work = self._call("alltoall", outputs, inputs, opts=opts)
        sends = [_nbytes(t) for t in inputs]
        return self._record("all_to_all", work, size_bytes=sum(sends), dtype=_dtype(inputs[0]), bytes_in=sum(sends),
                            bytes_out=sum(_nbytes(t) for t in outputs), splits=sends, opts=opts)

    def broadcast(self, tensors, opts=None):
        self._start()
        work = self._call("broadcast", tensors, opts=opts)
        n = sum(_nbytes(t) for t in tensors)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("broadcast", work, size_bytes=n, dtype=_dtype(tensors[0]), bytes_in=n, bytes_out=n, root=root, opts=opts)

    def reduce(self, tensors, opts=None):
        self._start()
        work = self._call("reduce", tensors, opts=opts)
        n = sum(_nbytes(t) for t in tensors)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("reduce", work, size_bytes=n, dtype=_dtype(tensors[0]), bytes_in=n, bytes_out=n, root=root, opts=opts)

    def gather(self, output_lists, inputs, opts=None):
        self._start()
        work = self._call("gather", output_lists, inputs, opts=opts)
        n_in = sum(_nbytes(t) for t in inputs)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("gather", work, size_bytes=n_in * self.size(), dtype=_dtype(inputs[0]), bytes_in=n_in,
                            bytes_out=sum(_nbytes(t) for lst in output_lists for t in lst), root=root, opts=opts)

    def scatter(self, outputs, input_lists, opts=None):
        self._start()
        work = self._call("scatter", outputs, input_lists, opts=opts)
        n_out = sum(_nbytes(t) for t in outputs)
        root = getattr(opts, "rootRank", 0) if opts is not None else 0
        return self._record("scatter", work, size_bytes=n_out * self.size(), dtype=_dtype(outputs[0]),
                            bytes_in=sum(_nbytes(t) for lst in input_lists for t in lst), bytes_out=n_out, root=root,
                            opts=opts)

    def barrier(self, opts=None):
        self._start()
        work = self._call("barrier", opts=opts)
        return self._record("barrier", work, size_bytes=0, dtype="none", bytes_in=0, bytes_out=0, opts=opts)

    def send(self, tensors, dst, tag=0):
        self._start()
        work = self._inner.send(tensors, dst, tag)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("send", work, size_bytes=n, dtype=_dtype(tensors[0]), bytes_in=n, bytes_out=0, peer=dst)

    def recv(self, tensors, src, tag=0):
        self._start()
        work = self._inner.recv(tensors, src, tag)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("recv", work, size_bytes=n, dtype=_dtype(tensors[0]), bytes_in=0, bytes_out=n, peer=src)

    def recv_anysource(self, tensors, tag=0):
        self._start()
        work = self._inner.recv_anysource(tensors, tag)
        n = sum(_nbytes(t) for t in tensors)
        return self._record("recv", work, size_bytes=n, dtype=_dtype(tensors[0]), bytes_in=0, bytes_out=n)


def _inner_backend_name() -> str:
    name = os.environ.get(INNER_BACKEND_ENV)
    if name:
        return name
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


_SINK = None  # set by commscope.capture.recorder when recording starts; one per process

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

_INFLIGHT: dict[int, tuple[Any, dict, Any, str]] = {}
"""Recorded ops not yet seen complete: key -> (inner work, record, sink, inner backend name)."""
_NO_TIMEOUT = timedelta(0)  # Work.wait's default: no timeout


def _track(work, recs: list[dict], sink, backend: str) -> _TimedWork:
    if _INFLIGHT:
        observe_completions()
    keys = [id(rec) for rec in recs]
    for key, rec in zip(keys, recs):
        _INFLIGHT[key] = (work, rec, sink, backend)
    tw = _TimedWork()
    tw._inner, tw._key, tw._keys = work, keys[0], keys
    return tw


def _finish(key: int, completed: bool) -> None:
    entry = _INFLIGHT.pop(key, None)
    if entry is not None:
        _, rec, sink, _ = entry
        if completed:
            rec["t_end_ns"] = time.time_ns()
        sink(rec)


def _is_completed(work) -> bool:
    try:
        return bool(work.is_completed())
    except Exception:  # noqa: BLE001 - a backend that cannot tell: seen complete when waited on, or at the end
        return False


def observe_completions() -> int:
    """Stamp the completion time of every recorded op in flight that is now complete; how many were."""
    done = [key for key, entry in list(_INFLIGHT.items()) if _is_completed(entry[0])]
    for key in done:
        _finish(key, True)
    return len(done)


def wait_inflight(timeout_s: float = 2.0, sink=None) -> bool:
    """Wait until every recorded op (of ``sink``, or all) is seen complete; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        observe_completions()
        if not any(sink is None or entry[2] is sink for entry in list(_INFLIGHT.values())):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.001)


def finish_inflight(sink=None) -> int:
    """Hand on the records (of ``sink``, or all) still in flight, without a completion time; how many."""
    keys = [key for key, entry in list(_INFLIGHT.items()) if sink is None or entry[2] is sink]
    for key in keys:
        _finish(key, False)
    return len(keys)


class _TimedWork(dist.Work):
    """The Work returned to the job: the backend's own, seen through, so that wait() stamps completion."""

    __slots__ = ("_inner", "_key", "_keys")  # one per op: no instance dict; set by who makes it (see _issued)
    _inner: Any
    """The backend's Work."""
    _key: int
    """The record's key in _INFLIGHT (the first member's for a coalesced batch)."""
    _keys: list[int] | None
    """Every member's key of a coalesced batch; None for one op."""

    def _seen_complete(self) -> None:
        for key in self._keys or (self._key,):
            _finish(key, True)

    def wait(self, timeout: timedelta = _NO_TIMEOUT):
        try:
            ok = self._inner.wait(timeout) if timeout else self._inner.wait()
        except BaseException:  # the backend's error (a peer gone, a timeout): the job sees it as it would, and the
            for key in self._keys or (self._key,):  # record goes out without an end (gloo marks a failed Work
                _finish(key, False)  # completed: a later look would stamp it as if it had succeeded)
            raise
        if self._keys is None:  # one op: _finish(key, True), inline (this runs once per op the job waits on)
            entry = _INFLIGHT.pop(self._key, None)
            if entry is not None:
                if entry[3] == "nccl" and not _is_completed(self._inner):  # wait() only ordered the streams
                    _INFLIGHT[self._key] = entry
                else:
                    rec = entry[1]
                    rec["t_end_ns"] = time.time_ns()
                    entry[2](rec)
        elif self._key in _INFLIGHT and (_INFLIGHT[self._key][3] != "nccl" or _is_completed(self._inner)):
            self._seen_complete()
        return ok

    def is_completed(self) -> bool:
        done = self._inner.is_completed()
        if done:
            self._seen_complete()
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

    def __del__(self) -> None:
        # the job let go of an op it has not seen complete. With a future, something follows it (DDP's reducer):
        # it is seen complete later. Without one, nothing will ever show it complete (gloo's reduce-scatter
        # works never say so), so its record goes out now, with an end only if it has one
        try:
            entry = _INFLIGHT.get(self._key)
            if entry is None:
                return
            try:
                entry[0].get_future()
                return
            except Exception:  # noqa: BLE001, S110 - a work without a future: it is finished below
                pass
            completed = _is_completed(entry[0])
            for key in self._keys or (self._key,):
                _finish(key, completed)
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown: the log's close() writes what is left
            pass


def set_sink(sink) -> None:
    global _SINK
    _SINK = sink


def _current_sink(rec: dict) -> None:
    """Stands for "the active sink" (set_sink) in process groups the backend creator builds."""
    sink = _SINK
    if sink is not None:
        sink(rec)


_NO_STEP = object()


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
