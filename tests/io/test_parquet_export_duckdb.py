"""A recorded run exported rank file by rank file to Parquet, and queried with DuckDB as one table:
the guide's example for logs too large for one machine's memory, checked against commscope's own summary."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from commscope.measure.capture.analysis import summary
from commscope.measure.capture.synthetic import synthetic_parallel, write_synthetic_rank
from commscope.cli.main import main
from commscope.io.runs import read_run_totals
from commscope.io.tables import read_ops_parquet
from commscope.pattern.layout import Layout
from commscope.spec.parallel import ParallelSpec

pytest.importorskip("pyarrow")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _guide_query() -> str:
    """The guide's DuckDB example (bytes per axis of the logical ops: a collective once, from its group's lowest
    rank; sends and all_to_all on every issuing rank; receives never), as it is printed there."""
    text = GUIDE.read_text()
    block = text[text.index("```python\nimport duckdb"):]
    block = block[len("```python\n"):block.index("```", 3)]
    return block[block.index('"""') + 3:block.rindex('"""')]


def _run(tmp_path: Path, ranks: int = 16) -> Path:
    logs = tmp_path / "logs"
    logs.mkdir()
    for r in range(ranks):
        write_synthetic_rank(logs, r, ranks, 120)
    return logs


def test_export_writes_one_table_per_rank_file_with_every_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    logs = _run(tmp_path)
    out = tmp_path / "pq"
    assert main(["export", "parquet", "--run", str(logs), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    files = sorted(out.glob("*.parquet"))
    assert [f.name for f in files] == [f"rank{r:05d}.parquet" for r in range(16)]
    totals = read_run_totals(logs)
    rows = [read_ops_parquet(f) for f in files]
    assert sum(len(r) for r in rows) == totals.num_records
    assert f"wrote {totals.num_records:,} records of 16 rank file(s)" in printed
    assert all({op.rank for op in ops} == {r} for r, ops in enumerate(rows))


def test_duckdb_over_the_exported_tables_matches_the_summary(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="needs the duckdb extra: pip install -e \".[duckdb]\"")
    logs = _run(tmp_path, ranks=32)
    out = tmp_path / "pq"
    tp, pp, dp = synthetic_parallel(32)
    assert main(["export", "parquet", "--run", str(logs), "--out", str(out), "--tp", str(tp), "--pp", str(pp),
                 "--dp", str(dp)]) == 0
    query = _guide_query()
    assert "'logs-parquet/*.parquet'" in query
    got = duckdb.sql(query.replace("logs-parquet/", f"{out}/")).fetchall()
    layout = Layout(ParallelSpec(tp=tp, pp=pp, dp=dp, global_batch_size=dp))
    want_bytes: Counter[str] = Counter()
    want_ops: Counter[str] = Counter()
    for row in summary(read_run_totals(logs, layout=layout), layout=layout)["ops"]:
        want_bytes[row["axis"]] += row["bytes"]
        want_ops[row["axis"]] += row["count"]
    assert {axis: (int(b), int(n)) for axis, b, n in got} == {a: (want_bytes[a], want_ops[a]) for a in want_bytes}
    assert set(want_bytes) == {"tp", "pp", "dp"}


def test_export_parquet_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "parquet", "--out", str(tmp_path / "pq")]) == 2
    assert "--run" in capsys.readouterr().err
    assert main(["export", "parquet", "--run", str(tmp_path / "nothing"), "--out", str(tmp_path / "pq")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no such file or directory" in err
    logs = _run(tmp_path, ranks=2)
    assert main(["export", "chakra", "--run", str(logs), "--out", str(tmp_path / "et")]) == 2
    assert "export parquet" in capsys.readouterr().err


def test_an_export_is_never_mixed_with_an_earlier_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An export of 4 ranks into the folder of an 8-rank one once kept rank00004-7.parquet: the guide's glob then
    read both runs."""
    first, second, out = tmp_path / "w8", tmp_path / "r4", tmp_path / "pq"
    for logs, ranks in ((first, 8), (second, 4)):
        logs.mkdir()
        for r in range(ranks):
            write_synthetic_rank(logs, r, ranks, 40)
    assert main(["export", "parquet", "--run", str(first), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert main(["export", "parquet", "--run", str(second), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"out='{out}': already holds an export of an earlier run (rank00000.parquet, rank00001.parquet" in err
    assert "and 2 more); give --force to replace it, or choose another directory" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert main(["export", "parquet", "--run", str(second), "--out", str(tmp_path / "new")]) == 0
    assert len(list((tmp_path / "new").glob("*.parquet"))) == 4
