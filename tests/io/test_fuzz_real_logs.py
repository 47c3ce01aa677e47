"""The parsers of other tools' logs, fuzzed with damaged copies of real logs (../shared/data/real-logs).

Every outcome must be a result (with its problems listed) or the project's own user-facing error naming the file:
a ValueError from the importers, exit status 2 with one line from `commscope fit` and `estimate --bandwidth`.
Never another exception, and never a hang (each example has a wall-clock limit). Examples are few and drawn
with a fixed seed per test (``derandomize``), so the fuzzing adds seconds and fails the same way twice.
"""

from __future__ import annotations

import contextlib
import gzip
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import damaged_log

from commscope.cli.main import main
from commscope.io.deepspeed import import_deepspeed_comms
from commscope.io.importers import import_records

LOGS = SHARED / "data" / "real-logs"
needs_logs = requires_shared("data", "real-logs")
FUZZ = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
#: Seconds one example may take before it counts as a hang (a real log parses in well under one).
HANG_S = 20


def _logs(pattern: str) -> list[str]:
    return sorted(p.name for p in LOGS.glob(pattern)) if LOGS.is_dir() else [pattern]


class Hang(Exception):
    pass


@contextlib.contextmanager
def no_hang(seconds: float = HANG_S) -> Iterator[None]:
    def _raise(signum, frame):
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _text(name: str) -> str:
    raw = (LOGS / name).read_bytes()
    return (gzip.decompress(raw) if name.endswith(".gz") else raw).decode("utf-8", "replace")


def _import_or_named_error(path: Path) -> None:
    try:
        with no_hang():
            result = import_records(path)
    except ValueError as exc:  # the importers' user-facing error (ConfigError is one too)
        assert path.name in str(exc), str(exc)
        return
    assert all(isinstance(p, str) for p in result.problems)
    for op in result.ops:  # whatever was kept is physically possible
        assert op.size_bytes >= 0 and op.size_bytes <= 2**40, op


def _cli_result_or_named_error(capsys, argv: list[str], path: Path) -> None:
    with no_hang():
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    err = capsys.readouterr().err
    assert code in (0, 2), err
    if code == 2:
        lines = err.strip().splitlines()
        assert lines and ": error: " in lines[-1] and path.name in lines[-1], err
        assert "Traceback" not in err


#: Lines the damage goes to by preference, per text format (None: any line).
_FOCUS = {"nccl": None, "deepspeed": r"\d+(\.\d+)? ?[KMGT]?B\b|comm op"}


@needs_logs
@pytest.mark.parametrize("name", _logs("*ccl-tests_*.txt") + _logs("deepspeed_*.txt"))
@given(data=st.data())
@settings(FUZZ, max_examples=5)
def test_text_log_import_survives_damage(tmp_path_factory, name, data):
    focus = _FOCUS["deepspeed" if name.startswith("deepspeed") else "nccl"]
    path = tmp_path_factory.getbasetemp() / f"damaged-{name}"
    path.write_text(data.draw(damaged_log(_text(name), focus=focus)))
    _import_or_named_error(path)


@needs_logs
@given(data=st.data())
@settings(FUZZ, max_examples=3)
def test_kineto_import_survives_damage(tmp_path_factory, data):
    name = _logs("kineto_*.json.gz")[0]
    path = tmp_path_factory.getbasetemp() / "damaged-kineto.json"
    focus = r"record_param_comms|msg nelems|Process Group|Collective name|\"ts\"|dtype"
    path.write_text(data.draw(damaged_log(_text(name), focus=focus)))
    _import_or_named_error(path)


@needs_logs
@given(data=st.data())
@settings(FUZZ, max_examples=20)
def test_fit_and_estimate_bandwidth_survive_damaged_nccl_tests(tmp_path_factory, capsys, data):
    name = data.draw(st.sampled_from(_logs("*ccl-tests_*.txt")))
    path = tmp_path_factory.getbasetemp() / f"damaged-{name}"
    path.write_text(data.draw(damaged_log(_text(name))))
    _cli_result_or_named_error(capsys, ["fit", str(path), "--json"], path)
    job = ["--model", "ref-gpt", "--tp", "1", "--pp", "1", "--dp", "8", "--global-batch-size", "8",
           "--micro-batch-size", "1", "--cluster", "dgx-a100", "--json"]
    _cli_result_or_named_error(capsys, ["estimate", *job, "--bandwidth", str(path)], path)


# --- what the fuzzing found, kept as plain regression tests -------------------------------------------------------

@needs_logs
def test_fit_names_the_file_when_header_lines_repeat_inside_a_table(tmp_path, capsys):
    """`# nThread` and `# Rank` lines repeated inside the table used to crash fit with
    "ValueError: no bus-bandwidth factor for op 'unknown'"."""
    name = "nccl-tests_allreduce_h100x16_2node_gcp-a3mega.txt"
    lines = _text(name).split("\n")
    rows = [i for i, line in enumerate(lines) if line.strip()[:1].isdigit()]
    inserted = [line for line in lines if line.startswith(("# nThread", "#  Rank", "# Rank"))]
    assert rows and inserted
    middle = rows[len(rows) // 2]
    damaged = lines[:middle] + inserted + lines[middle:]
    damaged = [line for line in damaged if "all_reduce_perf" not in line and "Collective test" not in line]
    path = tmp_path / "repeated-headers.txt"
    path.write_text("\n".join(damaged))
    _cli_result_or_named_error(capsys, ["fit", str(path)], path)


@needs_logs
def test_deepspeed_sizes_beyond_any_message_are_skipped_and_reported(tmp_path):
    name = "deepspeed_comms_summary_1_megatron-zero3.txt"
    text = _text(name)
    real = import_deepspeed_comms(LOGS / name)
    import re

    first = re.search(r"(\d+(?:\.\d+)?) ?([KMGT]?B)\b", text.split("Message Size", 1)[1])
    assert first is not None
    start = text.index("Message Size") + len("Message Size") + first.start()
    huge = text[:start] + "100000000000000000000000000000000.0 B" + text[start + len(first.group()):]
    path = tmp_path / "huge.txt"
    path.write_text(huge)
    damaged = import_deepspeed_comms(path)
    assert max(op.size_bytes for op in damaged.ops) <= 2**40
    assert len(damaged.ops) < len(real.ops)
    assert any("larger than any real message" in p for p in damaged.problems)
