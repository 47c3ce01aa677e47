"""Choosing the best communication backend per op and message size, and mixing backends in one job (MCR-DL).

    commscope tune --nproc 4 --ops all_reduce,all_gather,reduce_scatter,all_to_all -b 1K -e 64M --out tuning.json

    import commscope.measure.tune
    commscope.measure.tune.init(tuning="tuning.json")   # init_process_group with the "commscope-mixed" backend
    # DDP, FSDP2, DTensor and pipelining code runs unchanged; each op goes to its selected backend

:mod:`~commscope.measure.tune.algorithms`: collectives built from point-to-point ops (ring, recursive doubling and
halving, pairwise, Bruck, binomial tree). :mod:`~commscope.measure.tune.suite`: measures every (op, size, group
size, backend) with the bench harness into a :class:`TuningTable` (:mod:`~commscope.measure.tune.table`, the file
format and the machine check). :mod:`~commscope.measure.tune.select`: the selection rule. :mod:`~commscope.measure.tune.mixed`:
the process group that routes by it, and its ordering rule. [mcr-dl]

Names resolve on first use, so reading a table or building the CLI imports no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ALGORITHMS": "algorithms",
    "ALLOW_MISMATCH_ENV": "mixed",
    "MIXED_BACKEND": "mixed",
    "TUNING_ENV": "mixed",
    "MixedOptions": "mixed",
    "MixedProcessGroup": "mixed",
    "init": "mixed",
    "register": "mixed",
    "OpSelection": "select",
    "Segment": "select",
    "select_backend": "select",
    "selection_for": "select",
    "TuneConfig": "suite",
    "run_tuning": "suite",
    "Candidate": "table",
    "Machine": "table",
    "Measurement": "table",
    "TuningTable": "table",
    "load_table": "files",
    "read_table": "files",
    "table_document": "files",
    "write_table": "files",
}

__all__ = tuple(sorted(_WHERE))


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'commscope.measure.tune' has no attribute {name!r}")
    return getattr(importlib.import_module(f"commscope.measure.tune.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return list(__all__)
