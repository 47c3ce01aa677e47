"""Collective micro-benchmarks through torch.distributed, with nccl-tests' semantics, flags and output.

One sweep measures each op over a range of message sizes on groups of ranks, the way NVIDIA's nccl-tests
(``all_reduce_perf -b 8 -e 64M -f 2 ...``) does, but through PyTorch, so it measures whatever backend the
user's training runs on (NCCL on GPUs, gloo on CPUs) [nccl-tests-perf].

Sizes (as nccl-tests prints them, ``n`` = ranks in the group, ``c`` = ``size // dtype bytes``):

    op              size_bytes is                count (printed, = the count argument of the call)
    all_reduce      the buffer                   c
    all_gather      the gathered output          c // n        size rounded down to a multiple of n elements
    reduce_scatter  the input                    c // n        (same)
    all_to_all      the whole send buffer        c // n        (same)
    sendrecv        the message                  c             rank i sends to i+1, receives from i-1
    broadcast       the buffer                   c             root = -r (index in the group)
    reduce          the buffer                   c

Sizes whose count is 0 (e.g. 8 B all_gather over 4 ranks of fp32) are skipped; nccl-tests prints them as
zero-byte rows.

Time: for each size, ``-w`` warm-ups, a barrier, then ``-n`` iterations timed one by one without
synchronising between them (as nccl-tests' loop: host clock on CPU backends, CUDA events on the stream on
GPUs). Per iteration, the ranks' times are combined as ``-a`` says (default max: an op is done when its
slowest rank is done; nccl-tests' default ``-a 1`` averages ranks). ``time_s`` is the median of those
per-iteration times, with p50/p95/p99 and the coefficient of variation ``cv`` beside it; ``mean_time_s``
is nccl-tests' own number (the ``-a`` reduction over ranks of each rank's average). Then

    algbw = size_bytes / time_s,   busbw = algbw x f(op, n)    (f from :func:`commscope.estimate.bandwidth.busbw_factor`)

Worked example (nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt): all_reduce of 134217728 B over
8 ranks in 1295.41 us -> algbw 103.61 GB/s, busbw 103.61 x 2 x 7/8 = 181.32 GB/s.

Iterations: ``-n`` fixed, or by default a time budget per size (``time_budget_s``, clamped to
``[min_iters, max_iters]``) from the warm-ups' time, agreed by the group (max over its ranks), so small
messages get hundreds of iterations and 64 MiB a handful. Rows with ``cv > noisy_cv`` are flagged
``noisy`` and kept.

Correctness (``-c``, on by default as in nccl-tests): after timing, every input is refilled with a
pattern that depends on the rank and the element index, the op runs once more, and every rank compares
its whole output with the exact expected result (values are chosen so that sums and products are exact
in the dtype; ``avg`` gets a tolerance of a few ulps). ``wrong`` is the number of wrong elements summed
over ranks; any wrong row makes :func:`run_sweep` raise :class:`WrongResultsError` after the sweep
(the rows, wrong counts included, travel with the error).

Groups (``group_sizes``, the communication scale): the world is cut into consecutive groups of g ranks
(``[0..g-1], [g..2g-1], ...``, each a ``new_group``); g must divide the world size. ``concurrent``
(default): all groups of that size run at once, started together after a world barrier, as the TP or
DP groups of a training job do (so links they share are contended); the row pools their iterations.
``sequential``: one group at a time while the others wait, each group's links to itself.

gloo executes reduce_scatter as a full all_reduce of the input followed by a local copy of this rank's
chunk (ProcessGroupGloo::reduce_scatter_tensor_coalesced, pytorch/pytorch#118911), so its wire traffic is
an all_reduce's: such rows say ``backend_op = "all_reduce"``; their busbw still uses reduce_scatter's
factor, as the logical op is what a training job asks for.

The row type, the size arithmetic, the table and the statistics import no torch; running a sweep does. They live
beside this module, and every name below is importable from here too: :mod:`commscope.measure.bench.sweep_config`
(the ops, sizes and configuration, checked before launch), :mod:`commscope.measure.bench.results` (rows, statistics,
nccl-tests' table) and :mod:`commscope.measure.bench.collectives` (one op's buffers, call and check, with torch).
"""

from __future__ import annotations

import math
import platform
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, UTC
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.measure.bench.collectives import _Case, _Pattern, _check, _fill, _make_case, _torch_dtype
from commscope.measure.bench.results import (
    FULL_ROW_WIDTH,
    BenchRow,
    SweepResult,
    WrongResultsError,
    format_footer,
    format_header,
    format_row,
    format_table,
    make_row,
    row_stats,
)
from commscope.measure.bench.sweep_config import (
    AVERAGE_MODES,
    DTYPES,
    MAX_ITERS,
    OPS,
    REDOPS,
    SweepConfig,
    available_memory_bytes,
    backend_op,
    buffer_bytes,
    check_measurable,
    check_memory,
    check_world,
    message_sizes,
    op_count,
    parse_dtype,
    parse_sizes_arg,
    smallest_size_bytes,
)
from commscope.units import dtype_bytes

__all__ = [
    "AVERAGE_MODES",
    "DTYPES",
    "FULL_ROW_WIDTH",
    "MAX_ITERS",
    "OPS",
    "REDOPS",
    "BenchRow",
    "GroupBackend",
    "SweepConfig",
    "SweepResult",
    "WrongResultsError",
    "available_memory_bytes",
    "backend_op",
    "buffer_bytes",
    "check_measurable",
    "check_memory",
    "check_world",
    "format_footer",
    "format_header",
    "format_row",
    "format_table",
    "make_row",
    "message_sizes",
    "op_count",
    "parse_dtype",
    "parse_sizes_arg",
    "row_stats",
    "run_sweep",
    "smallest_size_bytes",
]


def _timed_laps(case: _Case, iters: int, device) -> list[float]:
    """Per-iteration seconds of ``iters`` back-to-back calls (CUDA events on GPUs, the host clock on CPUs)."""
    import torch

    if device.type == "cuda":
        events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
        events[0].record()
        for i in range(iters):
            case.run()
            events[i + 1].record()
        torch.cuda.synchronize(device)
        return [events[i].elapsed_time(events[i + 1]) * 1e-3 for i in range(iters)]
    stamps = [time.perf_counter()]
    for _ in range(iters):
        case.run()
        stamps.append(time.perf_counter())
    return list(np.diff(stamps))


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _measure(cfg: SweepConfig, case: _Case, group, device) -> list[float]:
    """Warm up, agree on the iteration count within the group, then time."""
    import torch
    import torch.distributed as dist

    warm = cfg.warmup_iters if cfg.iters is not None else max(1, cfg.warmup_iters)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(warm):
        case.run()
    _sync(device)
    if cfg.iters is not None:
        iters = cfg.iters
    else:
        estimate = torch.tensor([(time.perf_counter() - t0) / warm], dtype=torch.float64, device=device)
        dist.all_reduce(estimate, op=dist.ReduceOp.MAX, group=group)
        per_op = max(float(estimate[0]), 1e-7)
        iters = int(min(cfg.max_iters, max(cfg.min_iters, math.ceil(cfg.time_budget_s / per_op))))
    dist.barrier(group=group)
    return _timed_laps(case, iters, device)


def _groups_of(world: int, g: int) -> list[tuple[int, ...]]:
    return [tuple(range(start, start + g)) for start in range(0, world, g)]


def _device_for(backend: str):
    import torch

    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _intra_node(groups: Sequence[Sequence[int]], hosts: Sequence[str]) -> bool | None:
    inside = {len({hosts[r] for r in grp}) == 1 for grp in groups}
    return inside.pop() if len(inside) == 1 else None



@dataclass(frozen=True, slots=True, kw_only=True)
class GroupBackend:
    """A backend measured on groups it makes itself rather than on the default group's (``commscope tune``)."""

    name: str
    """The rows' ``backend``."""
    new_group: Callable[[list[int]], Any]
    """Makes the group of these global ranks (every group, the whole world included); every rank calls it for
    every group, in the same order, as ``torch.distributed.new_group``."""


def run_sweep(cfg: SweepConfig, *, emit: Callable[[str], None] | None = None, command: str | None = None,
              group_backend: GroupBackend | None = None,
              progress: Callable[[int, int], None] | None = None, short: bool = False) -> SweepResult:
    """Measure ``cfg`` on the current default process group; every rank calls it and gets the same result.

    ``group_backend``: measure on the groups it makes instead (the default group still synchronises).
    ``emit`` (rank 0 only) receives the table line by line as rows are measured (``short``: the narrow form of
    :func:`format_row`, for a terminal narrower than nccl-tests' lines); ``progress`` (rank 0 only) is
    called as ``progress(done, total)`` after each (op, group size, size). Raises ConfigError for a
    configuration the world cannot run, WrongResultsError (after the whole sweep) when ``cfg.check`` found
    wrong elements.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ConfigError("process group", "not initialised",
                          "call torch.distributed.init_process_group first (or use commscope.measure.launch.spawn)")
    world, me = dist.get_world_size(), dist.get_rank()
    backend = group_backend.name if group_backend is not None else str(dist.get_backend())
    sizes_g = check_world(cfg, world, backend)
    device = _device_for(backend)
    dtype = _torch_dtype(cfg.dtype)
    element_bytes = dtype_bytes(cfg.dtype)
    say = emit if (emit is not None and me == 0) else None

    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    # every rank creates every subgroup, in the same order (torch.distributed requires it)
    layouts: dict[int, tuple[list[tuple[int, ...]], Any, int]] = {}
    for g in sizes_g:
        groups = _groups_of(world, g)
        mine, index = None, -1
        for gi, ranks in enumerate(groups):
            if group_backend is not None:
                pg = group_backend.new_group(list(ranks))
            else:
                pg = None if g == world else dist.new_group(list(ranks))
            if me in ranks:
                mine, index = pg, gi
        layouts[g] = (groups, mine, index)

    iters_text = (f"{cfg.iters} iterations, {cfg.warmup_iters} warm-ups" if cfg.iters is not None else
                  f"iterations for {cfg.time_budget_s:g} s per size ({cfg.min_iters}-{cfg.max_iters}), "
                  f"{max(1, cfg.warmup_iters)} warm-ups")
    meta: dict[str, Any] = {
        "tool": "commscope bench", "backend": backend, "world_size": world, "hostname": socket.gethostname(),
        "hosts": hosts, "num_hosts": len(set(hosts)), "torch_version": torch.__version__,
        "python_version": platform.python_version(), "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": command if command is not None else " ".join(sys.argv), "device": _device_name(device),
        "group_mode": cfg.group_mode, "group_sizes": list(sizes_g), "dtype": cfg.dtype, "redop": cfg.redop,
        "iters": cfg.iters, "warmup_iters": cfg.warmup_iters, "time_budget_s": cfg.time_budget_s,
        "average": AVERAGE_MODES[cfg.average], "check": cfg.check, "noisy_cv": cfg.noisy_cv,
        "iters_text": iters_text,
        "time_definition": "time_s: median over iterations of the per-iteration time combined over ranks "
                           f"({AVERAGE_MODES[cfg.average]}); mean_time_s: nccl-tests' time",
    }
    rows: list[BenchRow] = []
    report = progress if me == 0 else None
    total, done = len(cfg.ops) * len(sizes_g) * len(cfg.sizes), 0
    for op in cfg.ops:
        for g in sizes_g:
            groups, group, gi = layouts[g]
            if say:
                say(format_header(op, g, len(groups), backend=backend, group_mode=cfg.group_mode, dtype=cfg.dtype,
                                  redop=cfg.redop, iters_text=iters_text, average=cfg.average, short=short))
            local = groups[gi].index(me)
            for size in cfg.sizes:
                done += 1
                if report:
                    report(done - 1, total)
                count, size_bytes = op_count(op, size, g, element_bytes)
                if count == 0:
                    continue
                row = _one_row(cfg, op, g, groups, group, gi, local, count, size_bytes, dtype, device, backend,
                               _intra_node(groups, hosts))
                rows.append(row)
                if say:
                    say(format_row(row, short=short))
    result = SweepResult(rows=tuple(rows), meta=meta)
    if report:
        report(total, total)
    if say:
        say(format_footer(rows, cfg.noisy_cv, short=short))
    if cfg.check and result.num_wrong:
        raise WrongResultsError(result)
    return result


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def _one_row(cfg: SweepConfig, op: str, g: int, groups, group, gi: int, local: int, count: int, size_bytes: int,
             dtype, device, backend: str, intra_node: bool | None) -> BenchRow:
    import torch.distributed as dist

    me = dist.get_rank()
    case = _make_case(op, count, g, group, groups[gi], local, cfg.root, cfg.redop, dtype, device)
    pattern = _Pattern.for_op(op, cfg.redop, g, cfg.dtype)
    _fill(case, pattern, local)  # timing runs on real data too (in-place ops let it grow; speed is unaffected)
    laps: list[float] = []
    wrong: int | None = None
    turns = [gi] if cfg.group_mode == "concurrent" else list(range(len(groups)))
    dist.barrier()
    for turn in turns:
        if turn == gi:
            laps = _measure(cfg, case, group, device)
            if cfg.check:
                _fill(case, pattern, local)
                dist.barrier(group=group)
                case.run()
                _sync(device)
                if cfg.inject_error_rank == me and case.check_output:
                    case.output.view(-1)[0] += 1  # the test hook: one wrong element on this rank
                wrong = _check(case, op, cfg.redop, pattern, local, g, count, cfg.root, cfg.dtype)
        if cfg.group_mode == "sequential":
            dist.barrier()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (gi, laps, wrong))
    by_group: dict[int, list[list[float]]] = {}
    for g_index, rank_laps, _ in gathered:
        by_group.setdefault(g_index, []).append(rank_laps)
    stats = row_stats([np.array(v) for _, v in sorted(by_group.items())], cfg.average)
    total_wrong = sum(w for _, _, w in gathered if w is not None) if cfg.check else None
    iters = max(len(v) for _, v, _ in gathered)
    return make_row(op=op, n=g, size_bytes=size_bytes, count=count, dtype=cfg.dtype, redop=cfg.redop, root=cfg.root,
                    backend=backend, stats=stats, iters=iters, wrong=total_wrong, noisy_cv=cfg.noisy_cv,
                    num_groups=len(groups), intra_node=intra_node)
