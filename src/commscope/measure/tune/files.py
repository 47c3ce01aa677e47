"""The tuning table's file: the table's fields plus the selection derived from them, written and read back.

The file format is described in :mod:`commscope.measure.tune.table`. This module sits above both the table and the
selection rule (:mod:`commscope.measure.tune.select`): the table is data and does not know the rule, the file shows what
the rule makes of the table, and a file whose ``selection`` does not follow from its measurements is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.measure.tune.select import selection_summary
from commscope.measure.tune.table import Machine, TuningTable, ensure_compatible, machine_here

__all__ = ["load_table", "read_table", "table_document", "write_table"]


def table_document(table: TuningTable) -> dict[str, Any]:
    """What a tuning-table file holds: the table's fields and, derived from them, the selection."""
    return {**table.to_dict(), "selection": selection_summary(table)}


def write_table(table: TuningTable, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    from commscope.io.atomic import write_text

    write_text(out, json.dumps(table_document(table), indent=1) + "\n")
    return out


def read_table(path: str | Path) -> TuningTable:
    """The table in ``path``, not checked against this machine (for reading and reporting)."""
    from commscope.io.checks import read_json_document

    p = Path(path)
    data = read_json_document(p, "tuning table", what="a tuning table that `commscope tune --out` wrote")
    if not isinstance(data, dict):
        raise ConfigError("tuning table", str(p), f"holds a JSON {type(data).__name__}, not a tuning table (a JSON "
                                                  "object that `commscope tune --out` wrote)")
    table = TuningTable.from_dict(data, source=str(p))
    stored = data.get("selection")
    if stored is not None and json.loads(json.dumps(stored)) != json.loads(json.dumps(selection_summary(table))):
        raise ConfigError("selection", "edited", "does not follow from the measurements by the selection rule; "
                          "re-run `commscope tune`, or delete the selection field to derive it again", source=str(p))
    return table


def load_table(path: str | Path, *, allow_mismatch: bool = False, here: Machine | None = None) -> TuningTable:
    """The table in ``path``, refused (ConfigError) when it was measured on another machine than ``here``
    (default: this one) unless ``allow_mismatch``."""
    table = read_table(path)
    ensure_compatible(table, machine_here() if here is None else here, allow_mismatch=allow_mismatch, source=str(path))
    return table
