"""The tuning suite: measure every (op, size, group size, backend) with the bench harness, into a table.

    table = run_tuning(TuneConfig(sweep=SweepConfig(ops=("all_reduce",), min_bytes=1024, max_bytes=1 << 20)), nproc=4)
    write_table(table, "tuning.json")

Candidates: every native torch.distributed backend that can run here (gloo; NCCL with one GPU per rank)
and each of commscope's point-to-point algorithms for the requested ops, run over gloo. MPI, where torch
has it, needs ranks started by mpirun, so it is listed as skipped with that reason.

Each candidate is timed by :func:`commscope.measure.bench.sweep.run_sweep` (nccl-tests' semantics: warm-ups, the
median of per-iteration times of the slowest rank, busbw, the data check) on groups it makes itself
(:class:`~commscope.measure.bench.sweep.GroupBackend`): a native backend on plain groups of that backend, an
algorithm on ``commscope-mixed`` groups forced to it, so the time includes what the mixed runtime adds
(the hand-over to its worker thread). Group sizes default to 2 and the world (those dividing it); groups
of one size run concurrently, as a training job's TP or DP groups do (``--group-mode``).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from datetime import datetime, UTC
from typing import Any

from commscope.measure.bench.sweep import GroupBackend, SweepConfig, WrongResultsError, run_sweep
from commscope.errors import ConfigError
from commscope.measure.tune.table import TUNABLE_OPS, Candidate, Machine, Measurement, TuningTable, machine_here

__all__ = ["TuneConfig", "default_group_sizes", "measure", "num_gpus", "plan_candidates", "run_tuning",
           "table_from_rows"]

#: Why a native backend torch has here is not measured.
_MPI_SKIPPED = "needs ranks started by mpirun; commscope's fork launcher cannot start MPI ranks"


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneConfig:
    """What ``commscope tune`` measures."""

    sweep: SweepConfig
    """Sizes, iterations, check, group sizes (nccl-tests' flags, as ``commscope bench``); ops among :data:`TUNABLE_OPS`."""
    candidates: tuple[str, ...] | None = None
    """Backends to measure (``gloo``, ``nccl``, algorithm names); None: every one that can run here."""
    tie_tolerance: float = 0.05
    """The selection rule's tie tolerance, stored in the table."""

    def __post_init__(self) -> None:
        bad = [op for op in self.sweep.ops if op not in TUNABLE_OPS]
        if bad:
            raise ConfigError("ops", ",".join(self.sweep.ops), f"commscope tune chooses backends for "
                                                                f"{', '.join(TUNABLE_OPS)}")
        if not 0 <= self.tie_tolerance < 1:
            raise ConfigError("tie_tolerance", self.tie_tolerance, "must be in [0, 1)")


def default_group_sizes(nproc: int) -> tuple[int, ...]:
    """2 and ``nproc``, those that divide ``nproc`` (the sweep's groups tile the world)."""
    return tuple(sorted({g for g in (2, nproc) if g >= 2 and nproc % g == 0}))


def plan_candidates(ops: Sequence[str], nproc: int, machine: Machine, *, only: Sequence[str] | None = None,
                    num_gpus: int = 0) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates to measure, natives first then algorithms in registry order, and the skipped ones (why)."""
    from commscope.measure.tune.algorithms import ALGORITHMS

    candidates: list[Candidate] = []
    skipped: dict[str, str] = {}
    if "gloo" in machine.backends:
        candidates.append(Candidate(name="gloo", kind="native", transport="gloo", device="cpu"))
    if "nccl" in machine.backends:
        if num_gpus >= nproc:
            candidates.append(Candidate(name="nccl", kind="native", transport="nccl", device="cuda"))
        else:
            skipped["nccl"] = f"needs one GPU per rank: {nproc} ranks, {num_gpus} GPU(s)"
    if "mpi" in machine.backends:
        skipped["mpi"] = _MPI_SKIPPED
    names: list[str] = []
    for op, algorithms in ALGORITHMS.items():
        if op in ops:
            names += [n for n in algorithms if n not in names]
    candidates += [Candidate(name=n, kind="p2p", transport="gloo", device="cpu") for n in names]
    if only is not None:
        known = [c.name for c in candidates] + list(skipped)
        unknown = [n for n in only if n not in known]
        if unknown:
            raise ConfigError("backend", ",".join(unknown), f"expected among {', '.join(known)}")
        dropped = [c.name for c in candidates if c.name not in only]
        skipped.update({n: "not requested" for n in dropped})
        candidates = [c for c in candidates if c.name in only]
    return candidates, skipped


def _runs(candidate: Candidate, cfg: SweepConfig, group_sizes: tuple[int, ...]) -> list[tuple[SweepConfig, dict]]:
    """The sweeps that measure ``candidate``: (config, forced algorithm per op); natives in one sweep, an
    algorithm in one per set of group sizes it runs on."""
    if candidate.kind == "native":
        return [(replace(cfg, group_sizes=group_sizes), {})]
    from commscope.measure.tune.algorithms import ALGORITHMS

    by_sizes: dict[tuple[int, ...], list[str]] = {}
    for op in cfg.ops:
        algorithm = ALGORITHMS.get(op, {}).get(candidate.name)
        if algorithm is not None:
            sizes = tuple(g for g in group_sizes if algorithm.applies_to(g))
            if sizes:
                by_sizes.setdefault(sizes, []).append(op)
    return [(replace(cfg, ops=tuple(ops), group_sizes=sizes), {op: candidate.name for op in ops})
            for sizes, ops in by_sizes.items()]


def _points(sweep: SweepConfig) -> int:
    """The (op, group size, size) points of one sweep, as run_sweep counts its progress."""
    return len(sweep.ops) * len(sweep.group_sizes or ()) * len(sweep.sizes)


def _shifted(progress: Callable[[int, int], None], base: int, total: int, done: int, _sweep_total: int) -> None:
    """One sweep's progress as part of all of them."""
    progress(min(base + done, total), total)


def measure(cfg: TuneConfig, candidates: Sequence[Candidate], *, emit: Callable[[str], None] | None = None,
            command: str | None = None, progress: Callable[[int, int], None] | None = None,
            short: bool = False) -> tuple[list[Any], list[str]]:
    """Every rank of an initialised default group calls this; returns (bench rows, host of each rank).
    ``progress(done, total)`` (rank 0) counts the (op, group size, size) points of all the candidates' sweeps;
    ``emit`` gets the bench table's lines (``short``: their narrow form, see :func:`commscope.measure.bench.sweep.run_sweep`).

    Rows whose data check failed are kept (with ``wrong`` set); they never win a selection.
    """
    import torch
    import torch.distributed as dist

    from commscope.measure.tune.mixed import MIXED_BACKEND, MixedOptions, register

    register()
    world = dist.get_world_size()
    group_sizes = cfg.sweep.group_sizes or default_group_sizes(world)
    if any(c.name == "nccl" for c in candidates) and torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank())) % torch.cuda.device_count())
    rows: list[Any] = []
    hosts: list[str] = []
    total = sum(_points(s) for c in candidates for s, _ in _runs(c, cfg.sweep, tuple(group_sizes)))
    finished = 0
    for candidate in candidates:
        for sweep, force in _runs(candidate, cfg.sweep, tuple(group_sizes)):
            made: list[Any] = []

            def new_group(ranks: list[int], name: str = candidate.name, force: dict = force, made: list[Any] = made) -> Any:
                if force:
                    pg = dist.new_group(ranks, backend=MIXED_BACKEND, pg_options=MixedOptions(force=force))
                else:
                    pg = dist.new_group(ranks, backend=name)
                made.append(pg)
                return pg

            try:
                result = run_sweep(sweep, emit=emit, command=command,
                                   group_backend=GroupBackend(name=candidate.name, new_group=new_group),
                                   progress=None if progress is None else partial(_shifted, progress, finished, total),
                                   short=short)
            except WrongResultsError as exc:
                result = exc.result
            rows += result.rows
            hosts = list(result.meta["hosts"])
            finished += _points(sweep)
            for pg in made:  # every rank is past the sweep's last collective on them
                dist.destroy_process_group(pg)
    if progress is not None:
        progress(total, total)
    return rows, hosts


def table_from_rows(rows: Sequence[Any], *, machine: Machine, hosts: Sequence[str], world_size: int,
                    group_sizes: Sequence[int], candidates: Sequence[Candidate], skipped: dict[str, str],
                    cfg: TuneConfig, command: str = "") -> TuningTable:
    """The table of a tuning run from its bench rows."""
    measurements = tuple(Measurement(op=r.op, group_size=r.group_size, size_bytes=r.size_bytes, backend=r.backend,
                                     time_s=r.time_s, algbw_bytes_per_s=r.algbw_bytes_per_s,
                                     busbw_bytes_per_s=r.busbw_bytes_per_s, cv=r.cv, iters=r.iters, wrong=r.wrong,
                                     noisy=r.noisy) for r in rows)
    return TuningTable(machine=machine, hosts=tuple(hosts), world_size=world_size, group_sizes=tuple(group_sizes),
                       candidates=tuple(candidates), measurements=measurements, tie_tolerance=cfg.tie_tolerance,
                       dtype=cfg.sweep.dtype, skipped=skipped, command=command,
                       date=datetime.now(UTC).isoformat(timespec="seconds"))


def _rank_main(rank: int, world: int, cfg: TuneConfig, candidates: list[Candidate], quiet: bool, command: str,
               progress: Callable[[int, int], None] | None = None, short: bool = False):
    emit = None if quiet else _print_line
    rows, hosts = measure(cfg, candidates, emit=emit, command=command, progress=progress if rank == 0 else None,
                          short=short)
    return (rows, hosts) if rank == 0 else None


def _print_line(line: str) -> None:
    print(line, flush=True)


def run_tuning(cfg: TuneConfig, nproc: int, *, timeout_s: float = 1800.0, quiet: bool = True,
               command: str = "", progress: Callable[[int, int], None] | None = None,
               oversubscribe: bool = False, short: bool = False) -> TuningTable:
    """Start ``nproc`` local ranks, measure every candidate, return the table (rank 0 prints rows unless ``quiet``,
    ``short``: in their narrow form); ``oversubscribe``: start them even beyond :func:`commscope.measure.launch.max_local_ranks`."""
    from commscope.measure.bench.sweep import check_memory, check_world
    from commscope.measure.launch import check_nproc, spawn

    if nproc < 2:
        raise ConfigError("nproc", nproc, "a collective needs at least 2 ranks")
    group_sizes = cfg.sweep.group_sizes or default_group_sizes(nproc)
    cfg = replace(cfg, sweep=replace(cfg.sweep, group_sizes=tuple(group_sizes)))
    check_world(cfg.sweep, nproc, "gloo")
    check_nproc(nproc, oversubscribe=oversubscribe)
    check_memory(cfg.sweep, group_sizes, nproc, "gloo")  # candidates run one after another, each in host memory
    machine = machine_here()
    gpus = num_gpus() if "nccl" in machine.backends else 0
    candidates, skipped = plan_candidates(cfg.sweep.ops, nproc, machine, only=cfg.candidates, num_gpus=gpus)
    if not candidates:
        raise ConfigError("backend", ",".join(cfg.candidates or ()), "nothing left to measure")
    # a CUDA context does not survive fork (machine_here has made one where there is a GPU)
    start = "spawn" if machine.device != "cpu" else None
    out = spawn(_rank_main, nproc, args=(cfg, candidates, quiet, command, progress, short), backend="gloo",
                timeout_s=timeout_s,
                start_method=start, oversubscribe=oversubscribe)
    rows, hosts = out[0]
    return table_from_rows(rows, machine=machine, hosts=hosts or [socket.gethostname()] * nproc, world_size=nproc,
                           group_sizes=group_sizes, candidates=candidates, skipped=skipped, cfg=cfg, command=command)


def num_gpus() -> int:
    import torch

    return torch.cuda.device_count()
