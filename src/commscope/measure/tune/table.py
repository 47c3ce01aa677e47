"""The tuning table: what ``commscope tune`` measured, on what, and the check that it fits the machine using it.

File format (JSON, ``format = "commscope-tuning"``, ``schema_version = 1``):

    fingerprint    the machine and job it was measured on: hostname, hosts, num_hosts, torch_version,
                   python_version, backends (the torch.distributed backends usable there), device
                   ("cpu" or the CUDA device name), world_size, group_sizes
    candidates     every backend measured: a native one (gloo, nccl) or one of commscope's point-to-point
                   algorithms (kind "p2p", with the native backend it runs on as its transport)
    skipped        backends usable there but not measured, with the reason (e.g. MPI needs mpirun)
    measurements   one row per (op, group_size, size_bytes, backend): time_s (median, slowest rank),
                   algbw/busbw in bytes/s, cv, iters, wrong (the data check), noisy
    tie_tolerance  the selection rule's parameter (see :mod:`commscope.measure.tune.select`)
    selection      derived from the measurements by that rule, written for people to read; a file whose
                   selection does not follow from its measurements is refused (:mod:`commscope.measure.tune.files`
                   writes and reads the file; this module knows the data, not the rule)

A table is refused on a machine that differs from the one it was measured on (another torch version,
another set of backends, another device) unless the caller passes ``allow_mismatch``: the measurements
describe that machine, and applying them elsewhere would silently pick backends for the wrong reasons. The
host name is recorded but not compared: the nodes of one cluster share one table. Group sizes and the
number of hosts are checked where the job's groups are made (:mod:`commscope.measure.tune.mixed`).

Nothing here imports torch at import time; :func:`machine_here` does.
"""

from __future__ import annotations

import hashlib
import json
import platform
import socket
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from commscope.errors import ConfigError

__all__ = [
    "FORMAT",
    "SCHEMA_VERSION",
    "TUNABLE_OPS",
    "Candidate",
    "Machine",
    "Measurement",
    "TuningTable",
    "differences",
    "ensure_compatible",
    "machine_here",
    "uncovered_group_size",
]

FORMAT = "commscope-tuning"
SCHEMA_VERSION = 1
#: The collectives a tuning table chooses backends for (those commscope has algorithms for).
TUNABLE_OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A backend a table measured: a native torch.distributed backend or a point-to-point algorithm."""

    name: str
    """``gloo``, ``nccl``, or an algorithm's name (``ring``, ``bruck``...; see :data:`~commscope.measure.tune.algorithms.ALGORITHMS`)."""
    kind: Literal["native", "p2p"]
    transport: str
    """The native backend its messages travel on (itself for a native backend)."""
    device: Literal["cpu", "cuda"]
    """Where the tensors it was measured with live; the runtime offers it only tensors of that device."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measured (op, group size, size, backend), from the bench harness's row (nccl-tests' semantics)."""

    op: str
    group_size: int
    size_bytes: int
    backend: str
    """A :class:`Candidate` name."""
    time_s: float
    """Median per-iteration time of the slowest rank."""
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    cv: float
    iters: int
    wrong: int | None = None
    """Wrong elements found by the data check (a row with any never wins); None when not checked."""
    noisy: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Machine:
    """What a table's measurements depend on besides the job: the software and the device."""

    hostname: str
    torch_version: str
    python_version: str
    backends: tuple[str, ...]
    """torch.distributed backends usable here: gloo; nccl with CUDA present; mpi where torch was built with it."""
    device: str
    """``cpu``, or the name of CUDA device 0."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TuningTable:
    """Measurements of every candidate backend, the machine and job they came from, and the rule's parameter."""

    machine: Machine
    hosts: tuple[str, ...]
    """Host name of each rank of the tuning job."""
    world_size: int
    group_sizes: tuple[int, ...]
    """Group sizes measured (the communication scales)."""
    candidates: tuple[Candidate, ...]
    """Natives first; the order breaks ties (see :mod:`commscope.measure.tune.select`)."""
    measurements: tuple[Measurement, ...]
    tie_tolerance: float = 0.05
    """Candidates within this fraction of the fastest time count as tied."""
    dtype: str = "fp32"
    skipped: Mapping[str, str] = field(default_factory=dict)
    """Backends usable on the machine but not measured -> why."""
    command: str = ""
    date: str = ""

    def __post_init__(self) -> None:
        names = [c.name for c in self.candidates]
        if len(set(names)) != len(names):
            raise ConfigError("candidates", names, "each backend may appear once")
        unknown = sorted({m.backend for m in self.measurements} - set(names))
        if unknown:
            raise ConfigError("measurements", unknown, f"backends not among the candidates {names}")
        bad_ops = sorted({m.op for m in self.measurements} - set(TUNABLE_OPS))
        if bad_ops:
            raise ConfigError("measurements", bad_ops, f"ops must be among {', '.join(TUNABLE_OPS)}")
        if not 0 <= self.tie_tolerance < 1:
            raise ConfigError("tie_tolerance", self.tie_tolerance, "must be in [0, 1)")

    @property
    def num_hosts(self) -> int:
        return len(set(self.hosts))

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for op in TUNABLE_OPS if any(m.op == op for m in self.measurements))

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def group_sizes_of(self, op: str) -> tuple[int, ...]:
        """Group sizes at which ``op`` was measured."""
        return tuple(sorted({m.group_size for m in self.measurements if m.op == op}))

    @property
    def digest(self) -> str:
        """SHA-256 of the canonical JSON: ranks compare it to be sure they route by the same table."""
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        """The table's own fields; the file adds the derived selection (:func:`commscope.measure.tune.files.table_document`)."""
        data: dict[str, Any] = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "fingerprint": {**asdict(self.machine), "backends": list(self.machine.backends),
                            "hosts": list(self.hosts), "num_hosts": self.num_hosts, "world_size": self.world_size,
                            "group_sizes": list(self.group_sizes)},
            "command": self.command,
            "date": self.date,
            "dtype": self.dtype,
            "tie_tolerance": self.tie_tolerance,
            "candidates": [asdict(c) for c in self.candidates],
            "skipped": dict(self.skipped),
            "measurements": [asdict(m) for m in self.measurements],
        }
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> TuningTable:
        if data.get("format") != FORMAT:
            raise ConfigError("format", data.get("format"), f"expected {FORMAT!r}: not a commscope tuning table",
                              source=source)
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError("schema_version", data.get("schema_version"),
                              f"this commscope reads schema {SCHEMA_VERSION}; re-run `commscope tune` to write one",
                              source=source)
        try:
            fp = data["fingerprint"]
            machine = Machine(hostname=str(fp["hostname"]), torch_version=str(fp["torch_version"]),
                              python_version=str(fp["python_version"]), backends=tuple(fp["backends"]),
                              device=str(fp["device"]))
            table = cls(machine=machine, hosts=tuple(fp["hosts"]), world_size=int(fp["world_size"]),
                        group_sizes=tuple(int(g) for g in fp["group_sizes"]),
                        candidates=tuple(Candidate(**c) for c in data["candidates"]),
                        measurements=tuple(Measurement(**m) for m in data["measurements"]),
                        tie_tolerance=float(data["tie_tolerance"]), dtype=str(data.get("dtype", "fp32")),
                        skipped=dict(data.get("skipped", {})), command=str(data.get("command", "")),
                        date=str(data.get("date", "")))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise ConfigError(exc.field, exc.value, exc.expected, source=source) from None
            raise ConfigError("tuning table", type(exc).__name__, f"malformed ({exc})", source=source) from None
        return table


def machine_here() -> Machine:
    """This machine's :class:`Machine` (imports torch)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    backends = [name for name, usable in (("gloo", dist.is_gloo_available()),
                                          ("nccl", dist.is_nccl_available() and cuda),
                                          ("mpi", dist.is_mpi_available())) if usable]
    return Machine(hostname=socket.gethostname(), torch_version=torch.__version__,
                   python_version=platform.python_version(), backends=tuple(backends),
                   device=torch.cuda.get_device_name(0) if cuda else "cpu")


def differences(table: TuningTable, here: Machine) -> list[str]:
    """What makes ``table`` describe another machine than ``here`` (empty: it describes this one)."""
    there = table.machine
    out = []
    if there.torch_version != here.torch_version:
        out.append(f"torch {there.torch_version} there, {here.torch_version} here")
    if set(there.backends) != set(here.backends):
        out.append(f"backends {','.join(sorted(there.backends)) or 'none'} there, "
                   f"{','.join(sorted(here.backends)) or 'none'} here")
    if there.device != here.device:
        out.append(f"device {there.device!r} there, {here.device!r} here")
    return out


def ensure_compatible(table: TuningTable, here: Machine, *, allow_mismatch: bool = False,
                      source: str | None = None) -> list[str]:
    """Raise ConfigError naming what differs, unless nothing does or ``allow_mismatch``; return the differences."""
    diff = differences(table, here)
    if diff and not allow_mismatch:
        raise ConfigError("tuning table", source or "(in memory)",
                          f"was measured on another machine ({'; '.join(diff)}, measured on host "
                          f"{table.machine.hostname!r}): re-run `commscope tune` here, or pass allow_mismatch=True "
                          "(--force) to apply it anyway", source=None)
    return diff


def uncovered_group_size(table: TuningTable, group_size: int, ops: Iterable[str] | None = None) -> str | None:
    """Why ``group_size`` is outside what ``table`` measured for ``ops`` (None: it is covered).

    A group size is covered when it lies between the smallest and the largest size measured for the op
    (the selection then takes the nearest measured one); a group of one rank never communicates.
    """
    if group_size <= 1:
        return None
    for op in table.ops if ops is None else ops:
        measured = table.group_sizes_of(op)
        if measured and not measured[0] <= group_size <= measured[-1]:
            return (f"{op} was measured on groups of {','.join(map(str, measured))} ranks; a group of {group_size} "
                    "lies outside them")
    return None
