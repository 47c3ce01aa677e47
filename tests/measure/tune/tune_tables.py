"""Made-up tuning tables with chosen winners, for tests of the selection rule and the mixed runtime."""

from __future__ import annotations

import socket
from collections.abc import Mapping, Sequence

from commscope.measure.tune.table import Candidate, Machine, Measurement, TuningTable

ALGORITHM_NAMES = ("ring", "recursive_doubling", "recursive_halving", "pairwise", "bruck", "binomial")
SIZES = (256, 4096, 65536)
#: op -> winner at each of SIZES. Crossovers at sqrt(256*4096) = 1024 B and sqrt(4096*65536) = 16384 B.
WINNERS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("recursive_doubling", "gloo", "ring"),
    "all_gather": ("ring", "recursive_doubling", "gloo"),
    "reduce_scatter": ("recursive_halving", "ring", "gloo"),
    "all_to_all": ("bruck", "gloo", "pairwise"),
    "broadcast": ("gloo", "binomial", "binomial"),
}
#: Which algorithms run each op (the others are not measured for it).
OP_ALGORITHMS = {"all_reduce": ("ring", "recursive_doubling"), "all_gather": ("ring", "recursive_doubling"),
                 "reduce_scatter": ("ring", "recursive_halving"), "all_to_all": ("pairwise", "bruck"),
                 "broadcast": ("binomial",)}


def fake_machine(**changes) -> Machine:
    base = dict(hostname=socket.gethostname(), torch_version="2.13.0+cpu", python_version="3.11.7",
                backends=("gloo",), device="cpu")
    base.update(changes)
    return Machine(**base)


def synthetic_table(*, machine: Machine | None = None, winners: Mapping[str, Sequence[str]] = WINNERS,
                    group_sizes: Sequence[int] = (2, 4), sizes: Sequence[int] = SIZES, hosts: Sequence[str] | None = None,
                    tie_tolerance: float = 0.05) -> TuningTable:
    """The winner of each (op, size) takes 100 us, gloo otherwise 200 us, every other algorithm 300 us."""
    rows = []
    for op, wins in winners.items():
        for g in group_sizes:
            for size, win in zip(sizes, wins):
                for backend in ("gloo", *OP_ALGORITHMS[op]):
                    t = 100e-6 if backend == win else 200e-6 if backend == "gloo" else 300e-6
                    rows.append(Measurement(op=op, group_size=g, size_bytes=size, backend=backend, time_s=t,
                                            algbw_bytes_per_s=size / t, busbw_bytes_per_s=size / t, cv=0.01,
                                            iters=10, wrong=0))
    candidates = (Candidate(name="gloo", kind="native", transport="gloo", device="cpu"),
                  *(Candidate(name=n, kind="p2p", transport="gloo", device="cpu") for n in ALGORITHM_NAMES))
    world = max(group_sizes)
    return TuningTable(machine=machine or fake_machine(), hosts=tuple(hosts or [socket.gethostname()] * world),
                       world_size=world, group_sizes=tuple(group_sizes), candidates=candidates,
                       measurements=tuple(rows), tie_tolerance=tie_tolerance)
