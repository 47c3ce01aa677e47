"""commscope fit of many rows: bench JSON checked on all rows at once reads what the row-by-row reader reads, a
damaged row among thousands is named by its row, columns fit as FitPoints do, and the TOML's numbers are written
as before (benchmarks/bench_fit.py times a million rows)."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from commscope.cli.main import main
from commscope.errors import ConfigError
from commscope.measure.bench import fit_input
from commscope.measure.bench.fit import FitRows, fit, to_toml
from commscope.measure.bench.fit import _toml_float, _toml_floats  # the writer, and its faster form
from commscope.units import GB, US

SIZES = [2**k for k in range(3, 28)]


def _rows(count: int, seed: int = 0) -> list[dict]:
    """``count`` bench rows of all_reduce over 8 ranks cycling through SIZES, times with 2% noise, and a few of
    all_gather over 4."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        op, n = ("all_gather", 4) if i % 10 == 7 else ("all_reduce", 8)
        size = SIZES[i % len(SIZES)]
        t = (20 * US + size * 1.75 / (100 * GB)) * (1 + rng.uniform(-0.02, 0.02))
        out.append({"op": op, "group_size": n, "size_bytes": size, "time_s": t, "dtype": "float32", "redop": "sum",
                    "busbw_bytes_per_s": size * 1.75 / t, "wrong": 0})
    return out


def _damaged(rows: list[dict]) -> list[dict]:
    rows = [dict(r) for r in rows]
    rows[0]["time_s"] = -1.0  # the first row of its kind damaged: the kind is learnt from a later row
    rows[1]["time_s"] = float("nan")  # and the next one too
    rows[1500]["time_s"] = float("nan")
    rows[1501]["busbw_bytes_per_s"] = float("inf")
    rows[1502]["size_bytes"] = 1024.0  # a whole number written as a float: valid, checked in full
    rows[1503]["time_s"] = 0.0
    rows[2000]["noisy"] = True  # a kind of its own
    rows[2500]["size_bytes"] = 2**41  # larger than any real message
    return rows


def _read(data: dict, monkeypatch: pytest.MonkeyPatch, at_once: bool, **kw) -> tuple:
    with monkeypatch.context() as m:
        if not at_once:
            m.setattr(fit_input, "_bench_at_once", lambda *args: None)
        try:
            rows, info = fit_input._rows_from_bench(data, "b.json", **kw)
        except ConfigError as exc:
            return ("refused", str(exc))
    return (rows.curves, rows.curve.tolist(), rows.size_bytes.tolist(), rows.time_s.tolist(), rows.noisy.tolist(),
            info)


@pytest.mark.parametrize("case", ["plain", "damaged", "one collective damaged", "wrong results", "another group size",
                                  "bool and int", "a row not an object"])
def test_bench_rows_at_once_read_what_one_by_one_reads(monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    """Bench JSON of 3,000 rows checked on all rows at once gives the rows, the problems (each naming its row) and
    the refusals the row-by-row reader gives, whatever the damage."""
    rows = _rows(3000)
    if case == "damaged":
        rows = _damaged(rows)
    elif case == "one collective damaged":  # every row of one kind but the damaged ones
        rows = _damaged([r for r in _rows(3400) if r["op"] == "all_reduce"])
    elif case == "wrong results":
        rows[1800]["wrong"] = 2
    elif case == "another group size":
        rows[2900]["group_size"] = 4
    elif case == "bool and int":  # equal as keys, told apart by the reader: True is a placement, 1 is not
        for i in (10, 3000 - 10):
            rows[i]["intra_node"] = True
        rows[500]["intra_node"] = 1
        rows[600].update(intra_node=1, size_bytes=float(rows[600]["size_bytes"]))  # checked in full: 1 is no placement
    elif case == "a row not an object":
        rows[2100] = [1, 2]  # type: ignore[call-overload]
    data = {"meta": {"backend": "nccl"}, "rows": rows}
    kw = {"group_size": 8} if case == "another group size" else {}
    at_once, one_by_one = _read(data, monkeypatch, True, **kw), _read(data, monkeypatch, False, **kw)
    assert at_once == one_by_one
    try:  # all at once but where a row is no object, or a later row names its kind otherwise
        by_columns = fit_input._bench_at_once(rows, "b.json", kw.get("group_size"), None, [])
        assert (by_columns is None) == (case in ("a row not an object", "bool and int"))
    except ConfigError:
        assert at_once[0] == "refused"
    if case.endswith("damaged"):
        problems = at_once[-1]["problems"]
        assert [re.search(r"rows\[(\d+)\]", p)[1] for p in problems] == [  # type: ignore[index]
            "1", "2", "1501", "1502", "1504", "2501"]  # rows[i] from 1: each damaged row named
        assert len(at_once[2]) == len(rows) - 6


def test_a_damaged_row_among_thousands_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`commscope fit` of 3,000 bench rows, one with a NaN time, warns naming the file, the row and the value, and
    fits the others."""
    rows = _rows(3000)
    rows[1776]["time_s"] = float("nan")
    path = tmp_path / "many.json"
    path.write_text(json.dumps({"meta": {"backend": "nccl"}, "rows": rows}))
    assert main(["fit", str(path), "--out", str(tmp_path / "m.toml")]) == 0
    err = capsys.readouterr().err
    assert "many.json rows[1777].time_s=nan: not a finite number: row skipped" in err


def test_columns_fit_as_points_do() -> None:
    """fit() of FitRows (columns) and of the same rows as FitPoints: the same TOML, row for row (repeated sizes as
    their median, odd and even counts)."""
    rows, _ = fit_input._rows_from_bench({"rows": _rows(2000, seed=3)[:1999]}, "b.json")
    by_columns, by_points = fit(rows, source="b"), fit(rows.points(), source="b")
    assert to_toml(by_columns).split("created")[1] == to_toml(by_points).split("created")[1]
    assert FitRows.of_points(rows.points()).size_bytes.tolist() == rows.size_bytes.tolist()


def test_toml_numbers_are_written_as_before() -> None:
    """The TOML writer's fast form gives the old writer's text for every value: around each power of ten from
    1e-320 to 1e300, where format's 6 digits turn into an exponent, and inf, nan, subnormals, negative zero."""
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(200_000) * 10.0 ** rng.integers(-320, 300, 200_000)).tolist()
    values += [v * k for v in (10.0 ** e for e in range(-320, 300)) for k in (0.9999995, 1.0, 1.0000005)]
    values += [0.0, -0.0, math.inf, -math.inf, math.nan, 5e-324, 999999.4, 999999.6, 1e16, 123456.5, 0.1, 1 / 3]
    assert _toml_floats(np.array(values)) == [_toml_float(v) for v in values]
