"""Other tools' records read as a new user brings them: the real logs in ``../shared`` as they are, and copies
changed the way files get changed on their way to a user (cut, re-encoded, concatenated, ...).

Each test failed before the fix named in its docstring.
"""

from __future__ import annotations

import pytest
from conftest import SHARED, requires_shared

from commscope.cli.main import main

REAL_LOGS = SHARED / "data" / "real-logs"
ALLTOALL = "nccl-tests_alltoall_a100x16_2node_in-place-NA_pasted-artifacts.txt"
DS_HEADER = ("Comm. Op            Message Size        Count               Total Latency(ms)   Avg Latency(ms)     "
             "tput_avg (Gbps)     busbw_avg (Gbps)")


def _ds_row(*cells: object) -> str:
    return " " * 20 + "".join(f"{c!s:<20}" for c in cells)


def _last_err_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1] if err else ""


@requires_shared("data", "real-logs", ALLTOALL)
def test_summarize_nccl_tests_alltoall_omits_the_matrix_instead_of_a_traceback(capsys):
    """all_to_all rows of nccl-tests name no sending rank; summarize decomposed them as if they did (ValueError:
    tuple.index(x): x not in tuple)."""
    assert main(["summarize", str(REAL_LOGS / ALLTOALL)]) == 0
    out = capsys.readouterr().out
    assert "all_to_all" in out
    assert "traffic matrix omitted: 18 all_to_all records (nccl_tests) name no sending rank" in out


@pytest.mark.parametrize("jobs", [None, "1"])
def test_summarize_deepspeed_all_to_all_rows_omit_the_matrix(tmp_path, capsys, jobs):
    """A DeepSpeed summary table with all_to_all_single rows: the same traceback as nccl-tests'."""
    path = tmp_path / "ds.log"
    path.write_text("\n".join([DS_HEADER, "all_to_all_single", _ds_row("1.0 MB", 3, 3.0, 1.0, 100.0, 87.5)]) + "\n")
    args = ["summarize", str(path)] + (["--jobs", jobs] if jobs else [])
    assert main(args) == 0
    assert "traffic matrix omitted: 1 all_to_all records (deepspeed) name no sending rank" in capsys.readouterr().out


A100 = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
MI300 = "rccl-tests_allreduce_mi300x8_single-node_rccl-version-block.txt"


@requires_shared("data", "real-logs", A100)
@requires_shared("data", "real-logs", MI300)
def test_two_pasted_outputs_of_other_gpus_are_said_to_be_kept_apart(tmp_path, capsys):
    """An A100 and an MI300X all_reduce output in one file (8 ranks each) were fitted as one curve, silently; then
    the reader said their rows were 'pooled as one measurement' while fit kept only the A100's. They are never
    pooled now (fit and --bandwidth refuse them together), and the reader says so, and how to pick one."""
    path = tmp_path / "both.txt"
    path.write_text((REAL_LOGS / A100).read_text() + (REAL_LOGS / MI300).read_text())
    assert main(["summarize", str(path)]) == 0
    assert ("problem: both.txt:69: the tables from line 18 and from line 69 both time all_reduce over 8 ranks but on "
            "other hardware (NVIDIA A100-SXM4-80GB x 8 on dkh; then AMD Instinct MI300X x 8 on host): their rows are "
            "not pooled (fit and --bandwidth refuse them together; fit --run 1 or --run 2 takes one machine's tables)"
            in capsys.readouterr().err)
    assert main(["fit", str(path)]) == 2


@requires_shared("data", "real-logs", A100)
def test_one_output_pasted_twice_is_said(tmp_path, capsys):
    """The same output twice in one file doubled every count of summarize and every row of fit, silently."""
    path = tmp_path / "twice.txt"
    path.write_text((REAL_LOGS / A100).read_text() * 2)
    assert main(["summarize", str(path)]) == 0
    assert "their rows are pooled as one measurement, each size's median (a run repeated, or one output pasted " \
           "twice?)" in capsys.readouterr().err


EFA = "nccl-tests_allreduce_t4x2_2node_efa_nccl-info.txt"


@requires_shared("data", "real-logs", EFA)
def test_an_mpirun_prefixed_output_cut_before_its_summary_is_still_nccl_tests(tmp_path, capsys):
    """Every line of this output starts with '[1,0]<stdout>:'; cut before '# Avg bus bandwidth', summarize said
    'cannot tell the format from the content' while fit read the same file."""
    lines = (REAL_LOGS / EFA).read_text().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if "  8388608 " in line)
    path = tmp_path / "cut.txt"
    path.write_text("".join(lines[:cut]) + lines[cut][:30])
    assert main(["summarize", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "(nccl_tests)" in out and "the table stops without nccl-tests' summary" in err


DS_VERBOSE = "deepspeed_comms_verbose_1_megatron-zero3.txt"


@pytest.mark.parametrize(("cells", "said"), [
    (("1.0 MB", 3, -3.0, -1.0, 100.0, 175.0), "Total Latency(ms)=-3.0: not a duration"),
    (("1.0 MB", 3, "nan", "nan", "nan", "nan"), "Total Latency(ms)=nan: not a duration"),
    (("1.0 MB", 3, 3.0, 1.0, 1e9, 1.75e9), "tput_avg (Gbps)=1000000000.0: above any real link (80,000 Gbps)"),
])
def test_deepspeed_summary_rows_with_times_no_hardware_has_are_said(tmp_path, cells, said):
    """Negative, NaN or faster-than-any-link latencies and bandwidths of a summary row were taken silently."""
    from commscope.io.deepspeed import import_deepspeed_comms

    path = tmp_path / "ds.log"
    path.write_text("\n".join([DS_HEADER, "all_reduce", _ds_row(*cells)]) + "\n")
    result = import_deepspeed_comms(path)
    assert [(op.op, op.count) for op in result.ops] == [("all_reduce", 3)]  # what was logged stays
    assert any(f"ds.log line 3: {said}" in p for p in result.problems), result.problems


@requires_shared("data", "real-logs", DS_VERBOSE)
@pytest.mark.parametrize(("field", "value", "said"), [
    ("time (ms)", "-9.46", "time (ms)=-9.46: not a duration"),
    ("time (ms)", "0.00001", "algbw (Gbps)"),  # the line's bandwidths stay: only its time is damaged here
    ("algbw (Gbps)", "9000000.00", "algbw (Gbps)=9000000.00: above any real link"),
])
def test_deepspeed_verbose_line_with_an_impossible_time_loses_only_its_duration(tmp_path, field, value, said):
    """A verbose line whose time was negative kept no start time without a word; one whose bandwidth no link has
    gave a duration that `compare --time` would use."""
    import re

    from commscope.io.deepspeed import import_deepspeed_comms

    lines = (REAL_LOGS / DS_VERBOSE).read_text().splitlines()
    first = re.sub(re.escape(field) + r":\s*[-0-9.]+", f"{field}: {value}", lines[0], count=1)
    if field == "time (ms)" and value == "0.00001":  # 678.86 MB in 10 ns: the printed bandwidths are the damage
        first = re.sub(r"algbw \(Gbps\):\s*[-0-9.]+", "algbw (Gbps): 543088000.00", first, count=1)
    path = tmp_path / "v.log"
    path.write_text("\n".join([first, *lines[1:]]) + "\n")
    result = import_deepspeed_comms(path)
    assert len(result.ops) == 3
    assert result.ops[0].t_start_ns is None and result.ops[0].t_end_ns is not None
    assert all(op.t_start_ns is not None for op in result.ops[1:])
    assert any(said in p and "the op kept without its duration" in p for p in result.problems), result.problems


A100_ROW = "    33554432       8388608     float     sum      -1   431.40   77.78  136.11       0"


@requires_shared("data", "real-logs", A100)
def test_an_nccl_tests_row_faster_than_any_link_is_named(tmp_path, capsys):
    """A row timed at 0.01 us (5.9 PB/s) was only visible as a whole curve flagged unreliable by fit, and not at
    all in summarize: the row itself is now named."""
    text = (REAL_LOGS / A100).read_text()
    assert A100_ROW in text
    path = tmp_path / "fast.txt"
    path.write_text(text.replace(A100_ROW, "    33554432       8388608     float     sum      -1     0.01  3355443.20  "
                                          "5872025.60       0"))
    assert main(["summarize", str(path)]) == 0
    assert "fast.txt:40: all_reduce 33554432 B out-of-place: time 0.01 us gives 5,872,025.60 GB/s, above any real " \
           "link (10,000 GB/s)" in capsys.readouterr().err


RTX1 = "nccl-tests_allreduce_rtx3090x1_single-gpu_column-overflow.txt"
RTX2_FAILED = "nccl-tests_allreduce_rtx3090x2_2node_wrong-nonzero_FAILED.txt"


@requires_shared("data", "real-logs", RTX2_FAILED)
def test_bandwidth_from_nccl_tests_that_failed_its_data_check_is_refused():
    """`--bandwidth` dropped the rows that failed nccl-tests' data check without a word and interpolated the rest,
    where `fit` (and bench JSON under --bandwidth) refuse a failed check."""
    from commscope.errors import ConfigError
    from commscope.io.bandwidth_file import read_bandwidth

    with pytest.raises(ConfigError, match=r"data check=4: all_reduce at 8 B failed nccl-tests' data check "
                                          r"\(nccl-tests_allreduce_rtx3090x2_2node_wrong-nonzero_FAILED.txt:11\)"):
        read_bandwidth(REAL_LOGS / RTX2_FAILED)


@requires_shared("data", "real-logs", RTX1)
def test_bandwidth_from_a_one_gpu_nccl_tests_run_says_why_it_has_no_rows():
    """54 rows of a 1-GPU run: the error said the file 'has no rows (expected op, group size, size and busbw)'."""
    from commscope.errors import ConfigError
    from commscope.io.bandwidth_file import read_bandwidth

    with pytest.raises(ConfigError, match=r"no row measured a link: the rows ran on 1 rank \(busbw 0 by definition\)"):
        read_bandwidth(REAL_LOGS / RTX1)


@requires_shared("data", "real-logs", A100)
def test_bandwidth_from_pasted_outputs_carries_the_readers_problems(tmp_path):
    """What the nccl-tests reader found wrong (here: one machine's output pasted twice, pooled) never reached
    `estimate/compare --bandwidth`; it is now among the model's notes. (Two machines' outputs are refused:
    tests/bench/test_fit_new_user.py.)"""
    from commscope.io.bandwidth_file import read_bandwidth

    path = tmp_path / "twice.txt"
    path.write_text((REAL_LOGS / A100).read_text() * 2)
    notes = read_bandwidth(path).notes
    assert any("both time all_reduce over 8 ranks: their rows are pooled as one measurement" in n for n in notes), notes


KINETO = "kineto_trace_a100x2_nccl-allreduce-broadcast_rank0.json.gz"
DS_SUMMARY = "deepspeed_comms_summary_1_megatron-zero3.txt"


@requires_shared("data", "real-logs", KINETO)
def test_a_kineto_trace_saved_with_a_utf8_bom_is_read(tmp_path):
    """A trace saved by an editor that writes a UTF-8 byte-order mark was detected as Kineto, then refused by its
    reader: 'invalid JSON (Unexpected UTF-8 BOM (decode using utf-8-sig))'."""
    import gzip

    from commscope.io.importers import import_records

    path = tmp_path / "trace.json"
    path.write_bytes(b"\xef\xbb\xbf" + gzip.decompress((REAL_LOGS / KINETO).read_bytes()))
    plain = import_records(REAL_LOGS / KINETO)
    with_bom = import_records(path)
    assert with_bom.format == "kineto"
    assert len(with_bom.ops) == len(plain.ops) > 0


def _stray_bytes(tmp_path, header: bool, op_line: str, before: bool = False) -> tuple:
    """The real DeepSpeed table with a byte that is no UTF-8 (0xff, or Latin-1's no-break space 0xa0 or e-acute
    0xe9, as a copy through a Windows terminal leaves them) after 'Comm. Op' in the header and after (or before)
    the op name ``op_line``."""
    data = (REAL_LOGS / DS_SUMMARY).read_bytes()
    lines = data.split(b"\n")
    for i, line in enumerate(lines):
        if header and line.startswith(b"Comm. Op"):
            lines[i] = line.replace(b"Comm. Op", b"Comm. Op\xff", 1)
        if line.strip() == op_line.encode():
            lines[i] = b"\xe9" + line.rstrip() if before else line.rstrip() + b"\xa0"
    path = tmp_path / "ds.txt"
    path.write_bytes(b"\n".join(lines))
    return path, data


@requires_shared("data", "real-logs", DS_SUMMARY)
@pytest.mark.parametrize(("header", "before"), [(True, False), (False, False), (False, True)])
def test_deepspeed_table_with_stray_non_utf8_bytes_is_read(tmp_path, header, before):
    """Stray non-UTF-8 bytes in the header made the file 'of no format'; in an op-name line they ended the table
    there, and with the first op line: 'nothing importable ... (no row under the header)', though rows followed."""
    from commscope.io.importers import import_records

    path, data = _stray_bytes(tmp_path, header, "broadcast", before)
    clean = tmp_path / "clean.txt"
    clean.write_bytes(data)
    got, want = import_records(path), import_records(clean)
    assert got.format == "deepspeed"
    assert [(o.op, o.size_bytes, o.count) for o in got.ops] == [(o.op, o.size_bytes, o.count) for o in want.ops]
    said = [p for p in got.problems if "not UTF-8" in p]
    assert len(said) == (2 if header else 1), got.problems
    assert any("line 2" in p and "'broadcast'" in p for p in said), said


def test_deepspeed_table_ended_by_an_unreadable_line_says_which(tmp_path):
    """When the line after the header is neither an op name nor a row, the error named 'no row under the header'
    although rows followed it: it now names the line that ended the table."""
    from commscope.io.deepspeed import import_deepspeed_comms

    path = tmp_path / "ds.txt"
    path.write_text("\n".join([DS_HEADER, "all-gather (stage 3)", _ds_row("1.0 MB", 3, 3.0, 1.0, 100.0, 87.5)]) + "\n")
    with pytest.raises(ValueError, match=r"line 2 \('all-gather \(stage 3\)'\) is neither an op name nor a row and "
                                         r"ended the table; 1 row-like line follows it"):
        import_deepspeed_comms(path)


@requires_shared("data", "real-logs", DS_SUMMARY)
def test_deepspeed_rows_cut_off_by_a_line_inside_the_table_are_counted(tmp_path):
    """A line inside the table that is neither an op name nor a row (here an op name someone edited) ended the
    table there: the rows after it were dropped without a word."""
    from commscope.io.deepspeed import import_deepspeed_comms

    path = tmp_path / "ds.txt"
    path.write_text((REAL_LOGS / DS_SUMMARY).read_text().replace("\nall_reduce\n", "\nall-reduce!\n", 1))
    got = import_deepspeed_comms(path)
    assert any("line 42 ('all-reduce!') is neither an op name nor a row and ended the table; 3 row-like lines "
               "follow it: those rows are not read" in p for p in got.problems), got.problems


@requires_shared("data", "real-logs", ALLTOALL)
@pytest.mark.parametrize("jobs", [None, 1])
def test_all_to_all_is_counted_per_sending_rank_in_nccl_tests_rows_as_in_commscope_logs(tmp_path, jobs):
    """An nccl-tests all_to_all row is one collective of the whole group; commscope's own logs hold one record per
    sending rank, and summarize/compare count all_to_all per sending rank. The nccl-tests rows were counted once
    each, with one rank's bytes: 16 x fewer ops and bytes than the same collectives recorded by commscope. Now both
    count one op per sending rank, and the output says so."""
    from commscope.measure.capture.analysis import summary
    from commscope.io.nccl_tests import parse_nccl_tests
    from commscope.io.oplog import write_ops_jsonl
    from commscope.io.runs import read_run, read_run_totals
    from commscope.commop import CommOp

    def read(path):
        return read_run(path) if jobs is None else read_run_totals(path, jobs=jobs)

    rows = parse_nccl_tests(REAL_LOGS / ALLTOALL).rows  # 9 sizes x 2 halves, 20 iterations each, 16 ranks
    s = summary(read(REAL_LOGS / ALLTOALL))
    assert s["logical_ops"] == 18 * 20 * 16
    assert s["ops"][0]["bytes"] == sum(r.size_bytes for r in rows) * 20 * 16
    assert any("18 all_to_all records (nccl_tests) each time one collective of its whole group: counted once per "
               "sending rank, as commscope's own logs count all_to_all, so their 360 collectives are 5,760 ops" in n
               for n in s["notes"]), s["notes"]
    # the same convention as commscope's own logs: one all_to_all of 1 MiB over 4 ranks, recorded by each rank
    logs = tmp_path / "run"
    logs.mkdir()
    for r in range(4):
        write_ops_jsonl(logs / f"rank{r:05d}.jsonl",
                        [CommOp(op="all_to_all", axis="ep", group=(0, 1, 2, 3), size_bytes=1 << 20, dtype="bf16", rank=r,
                                splits=(1 << 18,) * 4)], header={"kind": "measured", "rank": r, "world_size": 4})
    s = summary(read(logs))
    assert (s["logical_ops"], s["ops"][0]["bytes"]) == (4, 4 << 20)  # per collective: n ops, n x one rank's buffer


@requires_shared("data", "real-logs", ALLTOALL)
def test_the_reports_measured_bytes_count_nccl_tests_all_to_all_as_summarize_does():
    """report --measured counted the nccl-tests all_to_all rows once each (one rank's bytes, 1/16 of what summarize
    shows for the same file): both now count one op per sending rank."""
    from commscope.measure.capture.analysis import summary
    from commscope.io.runs import read_run
    from commscope.report.html import measured_bytes_by_axis

    run = read_run(REAL_LOGS / ALLTOALL)
    s = summary(run)
    by_axis = measured_bytes_by_axis(run.all_ops)
    assert sum(a["ops"] for a in by_axis.values()) == s["logical_ops"] == 18 * 20 * 16
    assert sum(a["bytes"] for a in by_axis.values()) == s["ops"][0]["bytes"]
