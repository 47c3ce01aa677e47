"""``commscope fit`` as a new user runs it on real nccl-tests output (``../shared/data/real-logs``) and on copies of it
changed the way nccl-tests' own options change it. Each test failed before the fix named in its docstring."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared

from commscope.measure.bench.fit import load_points
from commscope.cli.main import main
from commscope.errors import ConfigError

LOGS = ("data", "real-logs")
REAL_LOGS = SHARED.joinpath(*LOGS)
A100 = "nccl-tests_allreduce_a100x8_single-node_v2.19.4.txt"
DGX2 = "nccl-tests_allgather-allreduce-broadcast-reduce-reducescatter_v100x12_dgx2_old-format_errors.txt"
RTX1 = "nccl-tests_allreduce_rtx3090x1_single-gpu_column-overflow.txt"
KINETO = "kineto_trace_a100x2_nccl-allreduce-broadcast_rank0.json.gz"
#: broadcast_perf -r -1 over 4 GPUs: every size once per root (tests/io/data/SOURCES.md)
ALL_ROOTS = Path(__file__).parents[2] / "io" / "data" / "nccl-tests_broadcast_4gpu_all-roots_constructed.txt"

#: nccl-tests' element sizes of the types the crafted tables use.
_TYPE_BYTES = {"float": 4, "half": 2, "double": 8}


def _variant(rows: list[str], *, redop: str = "sum", dtype: str = "float", slower: float = 1.0) -> list[str]:
    """The A100 log's rows as nccl-tests prints them for another reduction op (``-o all``) or type (``-d all``):
    ``redop`` and ``type`` replaced, ``count`` = size / element size, both halves' times x ``slower`` and their
    algbw = size / time and busbw = algbw x 2(n-1)/n (n = 8) printed anew with nccl-tests' 2 decimals, so that the
    reader's arithmetic check passes as on a real table."""
    out = []
    for row in rows:
        size, _count, _type, _redop, root, *halves = row.split()
        size_b = int(size)
        cells = [size, str(max(1, size_b // _TYPE_BYTES[dtype])), dtype, redop, root]
        for h in (halves[:4], halves[4:]):
            t_us = float(h[0]) * slower
            algbw = size_b / (t_us * 1e-6) / 1e9
            cells += [f"{t_us:.2f}", f"{algbw:.2f}", f"{algbw * 1.75:.2f}", h[3]]
        out.append("".join(f"{c:>12}" if i < 2 else f"{c:>9}" for i, c in enumerate(cells)))
    return out


def _all_table(tmp_path, variants: list[dict]) -> object:
    """The A100 log (all_reduce over 8 GPUs) with its table as ``-o all`` / ``-d all`` prints it: the block of
    every size once per reduction op / type, one after the other under the one header, as nccl-tests' TimeTest
    loops over types, then ops, then sizes. The first block is the real one, kept as it is."""
    lines = (REAL_LOGS / A100).read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("8 "))
    last = next(i for i, ln in enumerate(lines) if ln.startswith("# Out of bounds"))
    rows = lines[first:last]
    extra = [line for v in variants for line in _variant(rows, **v)]
    path = tmp_path / "all_reduce_perf_all.txt"
    path.write_text("\n".join(lines[:last] + extra + lines[last:]) + "\n")
    return path


def _fit(capsys, *args) -> tuple[int, dict | None, list[str]]:
    code = main(["fit", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err.strip().splitlines()


@requires_shared(*LOGS, A100)
def test_fit_of_o_all_output_asks_which_reduction_op_instead_of_keeping_the_first(tmp_path, capsys):
    """`-o all` prints every size once per reduction op; fit kept the first row of each size (sum) and dropped
    the prod/max/min/avg rows without a word. Now it names them and asks for --redop, which fits that op's rows."""
    path = _all_table(tmp_path, [{"redop": op, "slower": k} for op, k in (("prod", 1.5), ("max", 2.0), ("min", 2.5),
                                                                           ("avg", 3.0))])
    code, _, err = _fit(capsys, path)
    assert code == 2 and len(err) == 1, err
    assert err[0] == ("commscope fit: error: input='all_reduce_perf_all.txt': times all_reduce over 8 ranks in 5 "
                      "reduction ops (sum, prod, max, min, avg), as nccl-tests -o all does; one fitted curve holds one "
                      "of each: pick with --redop sum (or another of those)")
    code, data_sum, _ = _fit(capsys, path, "--redop", "sum")
    assert code == 0
    code, data_max, err = _fit(capsys, path, "--redop", "max")
    assert code == 0
    assert data_max["source"] == "all_reduce_perf_all.txt (reduction op max)"
    by_size = {r["size_bytes"]: r["measured_time_s"] for r in data_max["rows"]}
    assert math.isclose(by_size[134217728], 2 * 1295.41e-6, rel_tol=1e-6)  # max's rows, not sum's
    assert len(data_max["rows"]) == len(data_sum["rows"]) == 25
    with pytest.raises(ConfigError, match=r"redop='prdo': all_reduce_perf_all.txt has no rows of that reduction op; "
                                          r"its rows are sum, prod, max, min, avg"):
        load_points(path, redop="prdo")


@requires_shared(*LOGS, A100)
def test_fit_of_d_all_and_o_all_output_needs_a_type_and_an_op(tmp_path, capsys):
    """`-d all` (here float, half, double) repeats the sizes per type, with counts of that type; fit mixed them as
    `-o all`'s. Both flags pick one curve; --dtype takes nccl-tests' names or commscope's."""
    path = _all_table(tmp_path, [{"dtype": "half", "slower": 1.2}, {"dtype": "double", "slower": 1.4},
                                 {"redop": "max", "slower": 2.0}])
    code, _, err = _fit(capsys, path)
    assert code == 2 and len(err) == 1
    assert ("times all_reduce over 8 ranks in 3 types (fp32, fp16, fp64) and 2 reduction ops (sum, max), as "
            "nccl-tests -d all / -o all does; one fitted curve holds one of each: pick with --dtype fp32 --redop sum"
            in err[0]), err
    code, data, _ = _fit(capsys, path, "--dtype", "half")  # only float has two reduction ops: half is one curve
    assert code == 0 and data["source"] == "all_reduce_perf_all.txt (type fp16)"
    assert math.isclose({r["size_bytes"]: r["measured_time_s"] for r in data["rows"]}[8], 1.2 * 34.84e-6, rel_tol=1e-3)
    code, data, _ = _fit(capsys, path, "--dtype", "fp32", "--redop", "max")
    assert code == 0 and data["source"] == "all_reduce_perf_all.txt (type fp32, reduction op max)"
    code, _, err = _fit(capsys, path, "--dtype", "bf16")
    assert code == 2 and err == [("commscope fit: error: dtype='bf16': all_reduce_perf_all.txt has no rows of that type; "
                                 "its rows are fp32, fp16, fp64")]


@requires_shared(*LOGS, DGX2)
def test_op_picks_one_sound_collective_of_a_log_of_five(capsys):
    """The DGX-2 log times five collectives; all_gather failed its data check, so the whole file was refused, and
    `--op all_reduce` was refused too ('line 1 names the test all_gather'): nothing could be fitted."""
    code, _, err = _fit(capsys, REAL_LOGS / DGX2)
    assert code == 2 and len(err) == 1
    assert err[0].endswith("all_gather at 4294967280 B failed nccl-tests' data check (" + DGX2 + ":50); refit from a "
                           "clean run, or give --op to fit one of the file's other collectives (all_reduce, broadcast, "
                           "reduce, reduce_scatter)")
    for op in ("all_reduce", "broadcast", "reduce", "reduce_scatter"):
        code, data, err = _fit(capsys, REAL_LOGS / DGX2, "--op", op)
        assert code == 0, err
        assert [(c["op"], c["group_size"]) for c in data["curves"]] == [(op, 12)]
        assert {r["op"] for r in data["rows"]} == {op}
        others = ", ".join(o if o != "all_gather" else "all_gather (failed its data check)"
                           for o in ("all_gather", "all_reduce", "broadcast", "reduce", "reduce_scatter") if o != op)
        assert err == [f"commscope fit: note: fitted {op} only (--op): left out the file's other collectives, {others}"]
    code, _, err = _fit(capsys, REAL_LOGS / DGX2, "--op", "all_gather")  # the failed one: refused, with the reason
    assert code == 2 and len(err) == 1 and "all_gather at 4294967280 B failed nccl-tests' data check" in err[0]
    code, _, err = _fit(capsys, REAL_LOGS / DGX2, "--op", "all_to_all")
    assert code == 2 and err == [(f"commscope fit: error: op='all_to_all': {DGX2} holds the tables of all_gather, "
                                 "all_reduce, broadcast, reduce, reduce_scatter; --op picks one of them")]


@requires_shared(*LOGS, RTX1)
def test_a_one_gpu_log_is_refused_for_its_one_rank(capsys):
    """The error quoted the reader's unrelated 'could be all_reduce or reduce_scatter' and the bogus in-place times,
    not the reason: one rank moves nothing over a link."""
    code, _, err = _fit(capsys, REAL_LOGS / RTX1)
    assert code == 2 and err == [(f"commscope fit: error: input='{RTX1}': the rows ran on 1 rank: nothing crossed a link "
                                 "(busbw is 0 by definition), so there is no bandwidth to fit; measure over 2 ranks or "
                                 "more")]


@requires_shared(*LOGS, KINETO)
@pytest.mark.parametrize("how", ["gz", "json", "bom"])
def test_a_kineto_trace_is_named_as_one(tmp_path, capsys, how):
    """A Kineto trace was read as nccl-tests text ('no nccl-tests data rows found') when gzipped, and as bench JSON
    ('no rows: expected {"meta": ..., "rows": [...]}') when not."""
    import gzip

    path = REAL_LOGS / KINETO
    if how != "gz":
        path = tmp_path / "trace.json"
        path.write_bytes((b"\xef\xbb\xbf" if how == "bom" else b"") + gzip.decompress((REAL_LOGS / KINETO).read_bytes()))
    code, _, err = _fit(capsys, path)
    assert code == 2 and err == [(f"commscope fit: error: input='{path.name}': is a PyTorch profiler (Kineto) trace; fit "
                                 "takes `commscope bench --out` JSON or nccl-tests / rccl-tests output; `commscope "
                                 f"summarize {path.name}` (and compare, report) read this format")]


def test_bench_json_of_two_sweeps_in_other_types_asks_which(tmp_path):
    """Two `commscope bench` sweeps (fp32 and bf16) merged into one JSON were pooled per size (their median): one
    curve of two measurements. A row without a reduction op (all_gather: redop none) passes --redop."""
    rows = [{"op": "all_reduce", "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": k * (1e-4 + 4**i * 1e-7),
             "wrong": 0, "dtype": dtype, "redop": "sum"} for dtype, k in (("fp32", 1.0), ("bf16", 1.5)) for i in range(4)]
    rows += [{"op": "all_gather", "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": 1e-4 + 4**i * 1e-7,
              "wrong": 0, "dtype": "fp32", "redop": "none"} for i in range(4)]
    path = tmp_path / "merged.json"
    path.write_text(json.dumps({"meta": {"backend": "gloo"}, "rows": rows}))
    with pytest.raises(ConfigError, match=r"times all_reduce over 2 ranks in 2 types \(fp32, bf16\), as nccl-tests -d all"
                                          r" does; .* pick with --dtype fp32"):
        load_points(path)
    points, info = load_points(path, dtype="bfloat16", redop="sum")
    assert info["chosen"] == "type bf16, reduction op sum"
    assert {(p.op, p.size_bytes, p.time_s) for p in points if p.op == "all_reduce"} == {
        ("all_reduce", r["size_bytes"], r["time_s"]) for r in rows if r["dtype"] == "bf16" and r["op"] == "all_reduce"}
    assert not [p for p in points if p.op == "all_gather"]  # fp32 only
    points, _ = load_points(path, dtype="fp32", redop="sum")
    assert len([p for p in points if p.op == "all_gather"]) == 4


@requires_shared(*LOGS, A100)
def test_bandwidth_table_from_o_all_output_is_refused_with_the_fit_that_picks_one(tmp_path):
    """`estimate --bandwidth` on `-o all` output interpolated sum's and max's rows of each size together."""
    from commscope.io.bandwidth_file import read_bandwidth

    path = _all_table(tmp_path, [{"redop": "max", "slower": 2.0}])
    with pytest.raises(ConfigError, match=r"times all_reduce over 8 ranks in 2 reduction ops \(sum, max\) \(nccl-tests "
                                          r"-o all\), which one table cannot hold apart; fit one: commscope "
                                          r"fit all_reduce_perf_all.txt --redop sum --out model.toml"):
        read_bandwidth(path)
    assert len(read_bandwidth(REAL_LOGS / A100).rows) > 0  # one type, one op: as before


def _root_times(root: int) -> dict[int, float]:
    """Out-of-place time (s) per size of ``root``'s rows of ALL_ROOTS, read off the file's columns."""
    rows = [ln.split() for ln in ALL_ROOTS.read_text().splitlines() if ln.strip()[:1].isdigit()]
    return {int(r[0]): float(r[5]) * 1e-6 for r in rows if int(r[4]) == root}


def test_fit_of_r_minus_1_output_asks_which_root_instead_of_keeping_root_0(capsys):
    """`broadcast_perf -r -1` times every size once per root; fit kept the first row of each size (root 0's) and
    dropped roots 1, 2 and 3 without a word: the fitted 21 GB/s was root 0's, while roots 2 and 3 reach 17.
    Now it names the roots and asks for --root, which fits that root's rows."""
    code, _, err = _fit(capsys, ALL_ROOTS)
    assert code == 2 and err == [(f"commscope fit: error: input='{ALL_ROOTS.name}': times broadcast over 4 ranks from 4 "
                                 "roots (0, 1, 2, 3), as nccl-tests -r -1 does; one fitted curve holds one of each: pick "
                                 "with --root 0 (or another of those)")]
    busbw = {}
    for root in range(4):
        code, data, err = _fit(capsys, ALL_ROOTS, "--root", root)
        assert code == 0 and err == [], err
        assert data["source"] == f"{ALL_ROOTS.name} (root {root})"
        measured = {r["size_bytes"]: r["measured_time_s"] for r in data["rows"]}
        assert measured == pytest.approx(_root_times(root), rel=1e-9)
        [curve] = data["curves"]
        busbw[root] = curve["segments"][-1]["busbw_bytes_per_s"] / 1e9
    assert busbw[0] > 20.5 and busbw[3] < 17.5  # the roots behind the other socket are slower: kept apart
    code, _, err = _fit(capsys, ALL_ROOTS, "--root", 4)
    assert code == 2 and err == [(f"commscope fit: error: root=4: {ALL_ROOTS.name} has no rows of that root; its rows "
                                 "are 0, 1, 2, 3")]


def test_root_picks_from_reduce_tables_and_names_no_root_where_there_is_none(tmp_path):
    """reduce_perf -r -1 (with -o all: every op, then every root) and a log without roots."""
    text = ALL_ROOTS.read_text().replace("broadcast_perf", "reduce_perf")
    path = tmp_path / "reduce_all_roots.txt"
    path.write_text(text.replace("    none  ", "     sum  "))
    with pytest.raises(ConfigError, match=r"times reduce over 4 ranks from 4 roots \(0, 1, 2, 3\), as nccl-tests -r -1 "
                                          r"does; .* pick with --root 0 "):
        load_points(path)
    points, info = load_points(path, root=3)
    assert info["chosen"] == "root 3" and {p.size_bytes: p.time_s for p in points} == pytest.approx(_root_times(3))
    lines = text.splitlines(keepends=True)
    end = next(i for i, ln in enumerate(lines) if ln.startswith("# Out of bounds"))
    rows = [ln for ln in lines if ln.strip()[:1].isdigit()]
    path.write_text("".join(lines[:end]).replace("    none  ", "     sum  ")
                    + "".join(rows).replace("    none  ", "     max  ") + "".join(lines[end:]))
    with pytest.raises(ConfigError, match=r"times reduce over 4 ranks in 2 reduction ops \(sum, max\) and from 4 roots "
                                          r"\(0, 1, 2, 3\), as nccl-tests -o all / -r -1 does; one fitted curve holds "
                                          r"one of each: pick with --redop sum --root 0 \(or another of those\)"):
        load_points(path)
    points, info = load_points(path, redop="max", root=1)
    assert info["chosen"] == "reduction op max, root 1" and len(points) == 6


def test_bench_json_of_two_roots_asks_which(tmp_path):
    """Two `commscope bench -r` sweeps of broadcast (roots 0 and 1) merged into one JSON were fitted as one curve of
    both; all_reduce's rows (root -1) pass --root."""
    rows = [{"op": "broadcast", "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": k * (1e-4 + 4**i * 1e-7),
             "wrong": 0, "dtype": "fp32", "redop": "none", "root": root} for root, k in ((0, 1.0), (1, 1.3))
            for i in range(4)]
    rows += [{"op": "all_reduce", "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": 1e-4 + 4**i * 1e-7,
              "wrong": 0, "dtype": "fp32", "redop": "sum", "root": -1} for i in range(4)]
    path = tmp_path / "merged.json"
    path.write_text(json.dumps({"meta": {"backend": "gloo"}, "rows": rows}))
    with pytest.raises(ConfigError, match=r"times broadcast over 2 ranks from 2 roots \(0, 1\), as nccl-tests -r -1"):
        load_points(path)
    points, info = load_points(path, root=1)
    assert info["chosen"] == "root 1"
    assert sorted((p.op, p.size_bytes, p.time_s) for p in points) == sorted(
        (r["op"], r["size_bytes"], r["time_s"]) for r in rows if r["root"] in (1, -1))


def test_bandwidth_table_of_r_minus_1_output_is_refused_with_the_fit_that_picks_one(tmp_path, capsys):
    """`estimate --bandwidth` on `-r -1` output interpolated the median of the four roots' busbw at each size, without
    a word. Now it is refused with the command that fits one root, and that command's model is read."""
    from commscope.io.bandwidth_file import read_bandwidth

    with pytest.raises(ConfigError, match=r"times broadcast over 4 ranks from 4 roots \(0, 1, 2, 3\) \(nccl-tests -r -1\), "
                                          r"which one table cannot hold apart; fit one: commscope fit "
                                          rf"{ALL_ROOTS.name} --root 0 --out model.toml, and give --bandwidth model.toml"):
        read_bandwidth(ALL_ROOTS)
    assert main(["estimate", "--bandwidth", str(ALL_ROOTS)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("commscope estimate: error: bandwidth=") and "--root 0" in err[0]
    model = tmp_path / "model.toml"
    assert main(["fit", str(ALL_ROOTS), "--root", "2", "--out", str(model)]) == 0
    fitted = read_bandwidth(model)
    assert fitted.ops() == {"broadcast"}
    assert main(["estimate", "--bandwidth", str(model)]) == 0


def test_bandwidth_table_of_bench_json_of_two_roots_or_a_written_table_of_two_types_is_refused(tmp_path, capsys):
    """`estimate --bandwidth` read `commscope bench` JSON (and CSV/TOML tables) without looking at types, reduction
    ops or roots: two roots' sweeps merged were interpolated as one curve, their median, where `fit` refuses them.
    Now refused alike, with the fit that picks one for bench JSON; rows without a root (-1, blank) pass."""
    from commscope.io.bandwidth_file import read_bandwidth

    rows = [{"op": "broadcast", "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": k * (1e-4 + 4**i * 1e-7),
             "busbw_GBps": 10 / k, "wrong": 0, "dtype": "fp32", "redop": "none", "root": root}
            for root, k in ((0, 1.0), (1, 1.3)) for i in range(4)]
    rows += [{"op": "all_reduce", "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": 1e-4 + 4**i * 1e-7,
              "busbw_GBps": 10.0, "wrong": 0, "dtype": "fp32", "redop": "sum", "root": -1} for i in range(4)]
    path = tmp_path / "merged.json"
    path.write_text(json.dumps({"meta": {"backend": "gloo"}, "rows": rows}))
    with pytest.raises(ConfigError, match=r"times broadcast over 2 ranks from 2 roots \(0, 1\), which one table cannot "
                                          r"hold apart: keep one of each per op and group size \(commscope fit "
                                          r"merged.json --root 0 --out model.toml fits one\)"):
        read_bandwidth(path)
    model = tmp_path / "model.toml"
    assert main(["fit", str(path), "--root", "0", "--out", str(model)]) == 0  # the suggestion, as it reads
    assert read_bandwidth(model).ops() == {"broadcast", "all_reduce"}
    one_root = tmp_path / "one.json"
    one_root.write_text(json.dumps({"rows": [r for r in rows if r["root"] in (0, -1)]}))
    assert len(read_bandwidth(one_root).rows) == 8
    table = tmp_path / "table.csv"
    table.write_text("op,group_size,size_bytes,busbw_GBps,dtype\nall_reduce,8,1048576,100,fp32\n"
                     "all_reduce,8,1048576,150,bf16\n")
    with pytest.raises(ConfigError, match=r"in 2 types \(fp32, bf16\), which one table cannot hold apart: keep one "
                                          r"of each per op and group size$"):
        read_bandwidth(table)
    capsys.readouterr()


def test_bandwidth_of_several_machines_and_roots_asks_for_the_machine_first(tmp_path, capsys):
    """Pasted -r -1 outputs of two machines: --bandwidth named the roots first and suggested `fit --root 0`, which fit
    (checking machines first) refused again. Now both ask for the machine first, and each suggestion runs."""
    from commscope.io.bandwidth_file import read_bandwidth

    text = ALL_ROOTS.read_text()
    both = tmp_path / "both.txt"
    both.write_text(text + text.replace("node01", "node02"))
    with pytest.raises(ConfigError, match=r"on other hardware.*commscope fit both.txt --run 1 --out model.toml"):
        read_bandwidth(both)
    assert main(["fit", str(both), "--run", "1"]) == 2  # then the root, as fit asks
    assert "pick with --root 0" in capsys.readouterr().err
    assert main(["fit", str(both), "--run", "1", "--root", "0", "--out", str(tmp_path / "m.toml")]) == 0
    capsys.readouterr()
    # the fitted model says which of the file's measurements it holds (the table --run picked was left unsaid)
    assert main(["fit", str(both), "--run", "2", "--root", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "both.txt (table 2, root 3)"


MI300 = "rccl-tests_allreduce_mi300x8_single-node_rccl-version-block.txt"


def _repeated(slower: float, **variant: str) -> str:
    """The A100 log as the same machine prints it when the run is repeated: its own header and device lines, every
    time x ``slower`` (rows printed anew by :func:`_variant`, so the reader's arithmetic check passes), in another
    ``dtype`` or ``redop`` where given."""
    lines = (REAL_LOGS / A100).read_text().splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.strip().startswith("8 "))
    last = next(i for i, ln in enumerate(lines) if ln.startswith("# Out of bounds"))
    return "\n".join(lines[:first] + _variant(lines[first:last], slower=slower, **variant) + lines[last:]) + "\n"


@requires_shared(*LOGS, A100)
def test_runs_of_other_types_are_no_repeat(tmp_path, capsys):
    """`all_reduce_perf -d float`, then `-d half`, pasted together: the reader called the half table a repeat whose
    rows 'are pooled as one measurement', while fit refused them together asking for --dtype. Tables of other types
    (or reduction ops) are no repeat: nothing is said of pooling, and fit asks which type, as it did."""
    from commscope.io.nccl_tests import parse_nccl_tests

    path = tmp_path / "float_then_half.txt"
    path.write_text((REAL_LOGS / A100).read_text() + _repeated(1.2, dtype="half"))
    assert parse_nccl_tests(path).problems == []
    code, _, err = _fit(capsys, path)
    assert code == 2 and "in 2 types (fp32, fp16)" in err[0] and "pick with --dtype fp32" in err[0]


@requires_shared(*LOGS, A100)
def test_a_run_repeated_on_one_machine_is_pooled_by_each_sizes_median(tmp_path, capsys):
    """The reader said two tables of one machine are 'pooled as one measurement', but fit kept the first table's row
    of each size and dropped the repeat's without a word. Now every row is a point and fit takes each size's median,
    as the warning says once; `--bandwidth` pools them alike (the median busbw)."""
    from commscope.io.bandwidth_file import read_bandwidth

    path = tmp_path / "twice.txt"
    path.write_text((REAL_LOGS / A100).read_text() + _repeated(1.04))
    points, _ = load_points(path)
    assert sorted(p.time_s for p in points if p.size_bytes == 1 << 20) == pytest.approx([67.31e-6, 70.00e-6])
    assert len(points) == 2 * 25
    code, data, err = _fit(capsys, path)
    assert code == 0
    assert {r["size_bytes"]: r["measured_time_s"] for r in data["rows"]}[1 << 20] == pytest.approx(68.655e-6)
    assert err == [("commscope fit: warning: twice.txt:65: the tables from line 18 and from line 65 both time all_reduce "
                   "over 8 ranks: their rows are pooled as one measurement, each size's median (a run repeated, or one "
                   "output pasted twice?)")]
    table = read_bandwidth(path)
    assert sum(1 for r in table.rows if r.size_bytes == 1 << 20) == 2  # both rows, the table's median between them
    assert any("pooled as one measurement, each size's median" in n for n in table.notes)


@requires_shared(*LOGS, A100)
@requires_shared(*LOGS, MI300)
def test_two_machines_pasted_together_are_refused_until_run_picks_one(tmp_path, capsys):
    """An A100 and an MI300X all_reduce output in one file: fit kept the A100's row of each size (1 MiB: 67.31 us)
    and dropped the MI300X's (27.42 us), while the reader's warning said their rows were pooled and `--bandwidth`
    took the median of both machines. One curve of two machines is no measurement: both refuse, naming the tables
    and their hardware, until `fit --run` picks one machine's tables; the other is left out with a note."""
    from commscope.io.bandwidth_file import read_bandwidth

    path = tmp_path / "both.txt"
    path.write_text((REAL_LOGS / A100).read_text() + (REAL_LOGS / MI300).read_text())
    code, _, err = _fit(capsys, path)
    assert code == 2 and err == [
        ("commscope fit: error: input='both.txt': times all_reduce over 8 ranks on other hardware, outputs pasted "
        "together: table 1 (from line 18: NVIDIA A100-SXM4-80GB x 8 on dkh) and table 2 (from line 69: AMD Instinct "
        "MI300X x 8 on host); one fitted curve holds one machine's tables: pick with --run 1 or --run 2")]
    for run, at_1mib in (("2", 27.42e-6), ("1", 67.31e-6)):
        code, data, err = _fit(capsys, path, "--run", run)
        assert code == 0
        assert {r["size_bytes"]: r["measured_time_s"] for r in data["rows"]}[1 << 20] == pytest.approx(at_1mib)
        other = "table 1 (from line 18: NVIDIA A100-SXM4-80GB x 8 on dkh)" if run == "2" else \
            "table 2 (from line 69: AMD Instinct MI300X x 8 on host)"
        assert err == [f"commscope fit: note: fitted table {run} only (--run): left out {other}"]  # nothing pooled
    code, _, err = _fit(capsys, path, "--run", "3")
    assert code == 2 and err == [("commscope fit: error: run='3': both.txt has 2 tables: give table numbers from 1 to 2 "
                                 "(file order), comma-separated: --run 1 or --run 1,2")]
    with pytest.raises(ConfigError, match=r"bandwidth='both.txt': times all_reduce over 8 ranks on other hardware, "
                                          r"outputs pasted together: table 1 \(from line 18: NVIDIA A100-SXM4-80GB x 8 on "
                                          r"dkh\) and table 2 \(from line 69: AMD Instinct MI300X x 8 on host\), which "
                                          r"one table must not pool; fit one machine's tables \(--run 1 or --run 2\): "
                                          r"commscope fit both.txt --run 1 --out model.toml, and give --bandwidth "
                                          r"model.toml"):
        read_bandwidth(path)
    # a third table, the A100's run repeated: --run names each machine's tables, and pools the A100's two
    path.write_text(path.read_text() + _repeated(1.04))
    code, _, err = _fit(capsys, path)
    assert code == 2 and err[0].endswith("pick with --run 1,3 or --run 2")
    code, data, err = _fit(capsys, path, "--run", "1,3")
    assert code == 0 and {r["size_bytes"]: r["measured_time_s"] for r in data["rows"]}[1 << 20] == \
        pytest.approx(68.655e-6)
    assert err == [("commscope fit: note: fitted tables 1, 3 only (--run): left out table 2 (from line 69: AMD "
                   "Instinct MI300X x 8 on host)"),
                   ("commscope fit: warning: both.txt:121: the tables from line 18 and from line 121 both time "
                   "all_reduce over 8 ranks: their rows are pooled as one measurement, each size's median (a run "
                   "repeated, or one output pasted twice?)")]
    with pytest.raises(ConfigError, match=r"run='1': both.json is bench JSON"):
        bench = tmp_path / "both.json"
        bench.write_text(json.dumps({"rows": [{"op": "all_reduce", "group_size": 2, "size_bytes": 8, "time_s": 1e-5}]}))
        load_points(bench, run="1")
