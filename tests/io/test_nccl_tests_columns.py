"""Long nccl-tests tables, read a block of plain rows at a time (commscope.io.nccl_tests_columns): the same rows,
meta and problems as read line by line, and a damaged line among thousands still named by its line.

The tables are the real A100 log's table repeated to thousands of lines (as a long sweep or many runs pasted
together would be), then damaged the ways real logs are; "line by line" is the reader with its block reading
turned off (``_BLOCK_MIN`` beyond any table), which is how every line was read before blocks.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared

from commscope.cli.main import main
from commscope.io import nccl_tests_reader
from commscope.io.nccl_tests import BusbwRow, parse_nccl_tests
from commscope.io.nccl_tests_columns import _decimal, _whole

A100 = SHARED / "data" / "real-logs" / "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
needs_logs = requires_shared("data", "real-logs")
ROWS = 3000


def _enlarged(rows: int = ROWS, damage: dict[int, str] | None = None) -> tuple[str, int]:
    """The A100 log with its table repeated to ``rows`` data lines, data line ``i`` replaced by ``damage[i]`` (which
    may hold several lines, or none); and the file line of the first data line."""
    lines = A100.read_text().splitlines()
    data = [i for i, line in enumerate(lines) if line.split() and line.split()[0].isdigit()]
    table = lines[data[0]:data[-1] + 1]
    body = [table[i % len(table)] for i in range(rows)]
    for i, text in sorted((damage or {}).items(), reverse=True):
        body[i:i + 1] = text.split("\n") if text else []
    return "\n".join(lines[:data[0]] + body + lines[data[-1] + 1:]) + "\n", data[0] + 1


def _read(path: Path, quick: bool) -> tuple:
    result = parse_nccl_tests(path, quick=quick)
    rows = [tuple(r) for r in result.rows] if quick else [tuple(getattr(r, f) for f in BusbwRow.__slots__)
                                                          for r in result.rows]
    return rows, [r.failed_check for r in result.rows], result.meta, result.problems


def _row(i: int, **changes: str) -> str:
    """Data line ``i`` of the repeated table with some columns replaced (by index)."""
    text, first = _enlarged(rows=i + 1)
    tokens = text.splitlines()[first - 1 + i].split()
    for k, v in changes.items():
        tokens[int(k[1:])] = v
    return "  ".join(tokens)


def _damages() -> dict[str, dict[int, str]]:
    """Each kind of damage, by name: the data lines it replaces (made from the A100 log, so only where it is there)."""
    return {
        "none": {},
        "an unreadable number": {1700: _row(1700, c6="abc")},
        "an NCCL line inside the table": {2100: "dkh:1:2 [0] NCCL INFO Channel 00/24 : 0 1 2 3 4 5 6 7\n" + _row(2100)},
        "a row cut by an NCCL line": {900: _row(900)[:30] + " dkh:1:2 [0] NCCL INFO comm 0x1 rank 0 nranks 8\n"
                                      + _row(900)[30:]},
        "wrong elements": {2500: _row(2500, c8="3")},
        "a size no message has": {400: _row(400, c0="99999999999999999999")},
        "another type": {1200: _row(1200, c2="half")},
        "a launcher prefix": {1500: "[1,0]<stdout>:" + _row(1500)},
        "a blank line and a tab": {600: "", 601: _row(601).replace("  ", "\t", 2)},
        "a time printed as zero": {2999: _row(2999, c5="0.00", c9="0.00")},
        "the last row cut": {2999: _row(2999)[:25]},
        "numbers a plain row has not": {700: _row(700, c5="36.5.1"), 1300: _row(1300, c6=".5"), 1900: _row(1900, c7="5."),
                                        2300: _row(2300, c9="1e+02")},
        "a count of 20 digits": {800: _row(800, c1="12345678901234567890")},
        "the data check unread or marked": {1000: _row(1000, c8="N/A"), 1100: _row(1100, c12="0*")},
        "another reduction op and root": {1600: _row(1600, c3="SUM"), 1650: _row(1650, c3="max"), 1700: _row(1700, c4="9")},
    }


DAMAGES = ("none", "an unreadable number", "an NCCL line inside the table", "a row cut by an NCCL line",
           "wrong elements", "a size no message has", "another type", "a launcher prefix", "a blank line and a tab",
           "a time printed as zero", "the last row cut", "numbers a plain row has not", "a count of 20 digits",
           "the data check unread or marked", "another reduction op and root")


@needs_logs
@pytest.mark.parametrize("damage", DAMAGES)
def test_blocks_read_what_lines_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str) -> None:
    """A long table read in blocks gives what it gives read line by line: every row's every field, the data check,
    the meta and every problem with its line, in both kinds of rows; and the blocks were used."""
    path = tmp_path / "long.txt"
    damages = _damages()
    assert tuple(damages) == DAMAGES  # the names parametrized are the damages made
    path.write_text(_enlarged(damage=damages[damage])[0])
    blocks: list[int] = []
    read_block = nccl_tests_reader._read_block

    def counted(*args):  # type: ignore[no-untyped-def]
        block = read_block(*args)
        blocks.append(0 if block is None else len(block))
        return block

    monkeypatch.setattr(nccl_tests_reader, "_read_block", counted)
    fast = [_read(path, quick) for quick in (True, False)]
    assert sum(blocks) > ROWS // 2  # most rows came in blocks
    monkeypatch.setattr(nccl_tests_reader, "_BLOCK_MIN", 10**9)  # line by line, as before blocks
    slow = [_read(path, quick) for quick in (True, False)]
    assert fast == slow
    assert fast[0][0] == fast[1][0]  # quick rows are the rows


@needs_logs
def test_a_damaged_line_among_thousands_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`commscope fit` of a 3,000-line table with one line's time printed as 0.00 skips that line with a warning
    naming the file and its line, and fits the rest as it fits the table without it."""
    text, first = _enlarged(damage={1234: _row(1234, c5="0.00", c9="0.00")})
    damaged = tmp_path / "damaged.txt"
    damaged.write_text(text)
    assert main(["fit", str(damaged), "--out", str(tmp_path / "d.toml")]) == 0
    err = capsys.readouterr().err
    assert f"damaged.txt:{first + 1234}: all_reduce" in err and "time=0.00 us is no measurement" in err
    clean = tmp_path / "clean.txt"
    clean.write_text(_enlarged(damage={1234: ""})[0])
    assert main(["fit", str(clean), "--out", str(tmp_path / "c.toml")]) == 0

    def body(path: Path) -> list[str]:  # the curves and the rows, without the file's name and the time written
        return [line for line in path.read_text().splitlines() if not line.startswith(("#", "source", "created"))]

    assert body(tmp_path / "d.toml") == body(tmp_path / "c.toml")


@needs_logs
def test_a_failed_check_among_thousands_refuses_naming_its_line(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """One line of 3,000 whose data check failed refuses the fit, in one line naming the file, the line and the
    value, exit 2: as a short table does."""
    text, first = _enlarged(damage={2222: _row(2222, c8="7")})
    path = tmp_path / "failed.txt"
    path.write_text(text)
    assert main(["fit", str(path), "--out", str(tmp_path / "f.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"failed.txt:{first + 2222}" in err[0] and "data check" in err[0] and "7" in err[0]
    assert not (tmp_path / "f.toml").exists()


def test_numbers_read_on_bytes_are_what_float_and_int_read() -> None:
    """A block's numbers, read on the bytes of a whole column (digits over a power of ten), are float() and int() of
    each token to the bit, from 1 to 30 digits; a token no plain row has (two points, a point at an end) refuses
    the block."""
    rng = random.Random(7)

    def number(whole: int, frac: int) -> str:
        digits = "".join(rng.choice("0123456789") for _ in range(whole + frac))
        return digits[:whole] + ("." + digits[whole:] if frac else "")

    for whole_max, frac_max in ((3, 2), (9, 8), (15, 15), (30, 30)):
        col = [number(rng.randint(1, whole_max), rng.randint(0, frac_max)) for _ in range(5000)]
        read = _decimal(col)
        assert read is not None and read[0].tolist() == [float(t) for t in col]
    ints = [str(rng.randrange(10 ** rng.randint(1, 18))) for _ in range(5000)]
    assert (read_ints := _whole(ints)) is not None and read_ints.tolist() == [int(t) for t in ints]
    for bad in ("1.2.3", ".5", "5.", "1..2", "..."):
        assert _decimal(["1.5", bad, "2"]) is None
    assert _whole(["1", "1234567890123456789"]) is None  # 19 digits: read line by line
