"""``commscope validate RUNS.csv`` as a user runs it: the table, --json, --png, flags as defaults, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SHARED, requires_shared
from runs_csv import HEADER, ROWS, write_runs

from commscope.cli.main import main
from commscope.errors import ConfigError
from commscope.estimate.validate import read_runs

H100_CSV = SHARED / "data" / "measured_iteration_times_h100.csv"



def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_table(capsys, tmp_path):
    code, out, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--fp16")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:10] == ["case", "model", "t", "p", "d", "measured", "s", "predicted", "s", "error"]
    assert "compute" in lines[0] and "bubble" in lines[0]
    assert lines[1].startswith("a ") and lines[2].startswith("b ")
    assert "0.500" in lines[1]
    summary = next(line for line in lines if line.startswith("mean absolute error"))
    assert "worst" in summary and ("(a)" in summary or "(b)" in summary)
    assert "note (all runs): from the defaults given: dtype=fp16" in out
    assert "derived from measured_tflops_per_gpu=120" in out


def test_json(capsys, tmp_path):
    code, out, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert {"num_runs", "mean_abs_error", "mean_error", "worst_abs_error", "worst_case", "rows"} <= set(d)
    assert d["num_runs"] == 2
    row = d["rows"][0]
    for key in ("case_id", "model", "tp", "pp", "dp", "measured_s", "predicted_s", "error", "compute_s", "tp_s", "pp_s",
                "dp_s", "cp_s", "ep_s", "emb_s", "bubble_s", "optimizer_s", "hidden_s", "notes"):
        assert key in row, key


def test_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "out" / "runs.png"
    code, out, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--png", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in out
    code, out, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--png", tmp_path / "j.png", "--json")
    assert code == 0 and json.loads(out)["num_runs"] == 2 and "wrote" in err


def test_png_without_matplotlib_is_one_line(tmp_path):
    runs = write_runs(tmp_path / "runs.csv")
    code = ("import sys; sys.modules['matplotlib'] = None; from commscope.cli.main import main; "
            f"sys.exit(main(['validate', {str(runs)!r}, '--png', {str(tmp_path / 'x.png')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "matplotlib" in proc.stderr and "commscope[plots]" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x.png").exists()


def test_flags_are_defaults_and_cells_win(capsys, tmp_path):
    path = write_runs(tmp_path / "runs.csv")
    code, out, err = run(capsys, "validate", path, "--micro-batch-size", "4", "--recompute", "selective",
                         "--inter-node-GBps", "12.5", "--attention-backend", "unfused",
                         "--position-embedding-type", "rope", "--untie-embeddings-and-output-weights", "--swiglu",
                         "--normalization", "RMSNorm", "--json")
    assert code == 0, err
    a, b = json.loads(out)["rows"]
    assert any("micro_batch_size=4" in n and "recompute=selective" in n for n in b["notes"])
    assert not any("micro_batch_size=4" in n for n in a["notes"])  # its cell says 2
    assert any("inter-node 12.5 GB/s" in n for n in a["notes"])
    assert any("position_embedding=rope, tied_embeddings=no, gated_mlp=yes, normalization=rmsnorm" in n
               for n in a["notes"])
    runs = read_runs(path, {"micro_batch_size": 4, "attention": "unfused"})
    assert runs[0].parallel.micro_batch_size == 2 and runs[1].parallel.micro_batch_size == 4
    assert runs[0].parallel.attention == "unfused"


def test_gradient_accumulation_fusion_flag_and_column(capsys, tmp_path):
    """--no-gradient-accumulation-fusion is the default of blank cells; a cell of the column wins; each row so
    predicted says so in a note and takes longer."""
    header = [*HEADER, "gradient_accumulation_fusion"]
    path = write_runs(tmp_path / "runs.csv", [[*ROWS[0], "yes"], [*ROWS[1], ""]], header)
    fused = write_runs(tmp_path / "fused.csv")
    code, out, err = run(capsys, "validate", path, "--no-gradient-accumulation-fusion", "--json")
    assert code == 0, err
    a, b = json.loads(out)["rows"]
    code, out, err = run(capsys, "validate", fused, "--json")
    assert code == 0, err
    a0, b0 = json.loads(out)["rows"]
    assert not any("--no-gradient-accumulation-fusion" in n for n in a["notes"])
    assert any("separate kernel each micro-batch (--no-gradient-accumulation-fusion)" in n for n in b["notes"])
    assert a["predicted_s"] == a0["predicted_s"] and b["predicted_s"] > b0["predicted_s"]
    runs = read_runs(path, {"gradient_accumulation_fusion": False})
    assert runs[0].parallel.gradient_accumulation_fusion and not runs[1].parallel.gradient_accumulation_fusion
    code, _, err = run(capsys, "validate", write_runs(tmp_path / "bad.csv", [[*ROWS[0], "perhaps"], [*ROWS[1], ""]],
                                                      header))
    assert code == 2 and "gradient_accumulation_fusion='perhaps'" in err and "row 1" in err


def test_a_default_no_row_takes_says_it_changes_nothing(capsys, tmp_path):
    """A flag is the default of blank cells; where every row's cell gives its own value, the flag changes nothing,
    and says so in one line (--gradient-accumulation-fusion beside a full column was ignored silently)."""
    header = [*HEADER, "gradient_accumulation_fusion", "attention"]
    path = write_runs(tmp_path / "runs.csv", [[*ROWS[0], "no", "unfused"], [*ROWS[1], "false", "flash"]], header)
    code, _out, err = run(capsys, "validate", path, "--gradient-accumulation-fusion", "--attention-backend", "unfused",
                          "--fp16", "--json")
    assert code == 0, err
    said = "commscope validate: warning: {} changes nothing here: every row of {} gives its own {}"
    assert err.splitlines() == [said.format("--attention-backend unfused", path, "attention"),
                                said.format("--gradient-accumulation-fusion", path, "gradient_accumulation_fusion"),
                                # a column the estimate does not read is named, never silently ignored
                                (f"commscope validate: warning: columns of {path} the estimate does not read (kept as "
                                 "text): source")]
    assert all(not r.parallel.gradient_accumulation_fusion for r in read_runs(path, {"gradient_accumulation_fusion": True}))
    # a default one row takes is no warning (--fp16 above: the rows leave dtype blank)
    half = write_runs(tmp_path / "half.csv", [[*ROWS[0], "no", ""], [*ROWS[1], "", ""]], header)
    code, _out, err = run(capsys, "validate", half, "--no-gradient-accumulation-fusion", "--fp16", "--json")
    assert code == 0 and "changes nothing" not in err, err


@requires_shared("data", "measured_iteration_times_h100.csv")
def test_h100_file_with_megatron_overlap_flags(capsys):
    code, out, err = run(capsys, "validate", H100_CSV, "--overlap-grad-reduce", "--overlap-param-gather",
                         "--tp-comm-overlap")
    assert code == 0, err
    assert sum(line.startswith("mlm_h100_weak_") for line in out.splitlines()) == 9
    assert "mean absolute error" in out


def test_the_columns_table_fits_a_terminal():
    """`validate --help` prints the column table of commscope.estimate.validate as it is written: one line of it ran to 131
    characters (gradient_accumulation_fusion added before padding meant for a shorter line), wrapping the table."""
    from commscope.estimate import validate

    doc = validate.__doc__ or ""
    table = doc[doc.find("The file, one run per row"):doc.find("Other columns")]
    assert max(len(line) for line in table.splitlines()) <= 120


def test_help_lists_validate():
    proc = subprocess.run([sys.executable, "-m", "commscope.cli.main", "--help"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0 and "validate" in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "commscope.cli.main", "validate", "--help"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0 and "RUNS.csv" in proc.stdout and "--inter-node-GBps" in proc.stdout
    # the file's columns are in the help itself, every one of them, in plain text (once: "see pydoc")
    from commscope.estimate.validate import COLUMNS

    for spellings, _ in COLUMNS.values():
        assert any(s in proc.stdout.lower() for s in spellings), spellings  # (case ignored, as in a file)
    assert "``" not in proc.stdout and ":func:" not in proc.stdout and "pydoc" not in proc.stdout


# --- bad input: exit 2, one line naming the file, the row and the column --------------------------------------------

def _with(row: int, column: str, value: str) -> list[list[str]]:
    """ROWS with the cell of data row ``row`` (1-based) in ``column`` replaced (and its gpus cell left blank when
    the change is to a parallel size, so that the size itself is what is wrong)."""
    rows = [list(r) for r in ROWS]
    rows[row - 1][HEADER.index(column)] = value
    if column in ("t", "p"):
        rows[row - 1][HEADER.index("gpus")] = ""
    return rows


BAD_CELLS = [
    ("bad integer", 2, "t", "two", "t='two': expected a positive integer"),
    ("negative size", 2, "d", "-4", "d='-4': must be a positive integer"),
    ("zero size", 1, "p", "0", "p='0': must be a positive integer"),
    ("fractional size", 1, "global_batch", "64.5", "global_batch='64.5': expected a positive integer"),
    ("unknown recompute", 2, "recompute", "sometimes", "recompute='sometimes': valid: full"),
    ("bad boolean", 1, "seq_parallel", "maybe", "seq_parallel='maybe': expected yes, no"),
    ("bad time", 1, "measured_iter_time_s", "fast", "measured_iter_time_s='fast': expected a positive number"),
    ("negative time", 1, "measured_iter_time_s", "-0.5", "measured_iter_time_s='-0.5': must be a positive number"),
    ("gpus mismatch", 2, "gpus", "16", "gpus=16: does not match t x p x d x cp = 1 x 2 x 4 x 1 = 8"),
    ("unknown GPU", 2, "gpu", "TPU v4", "gpu='TPU v4': matches no cluster preset's GPU"),
    ("tp does not divide heads", 2, "t", "3", "tp (column 't')=3: must divide num_heads=16"),
    ("heads do not divide hidden", 1, "hidden", "1000", "num_heads (column 'heads')=16: must divide hidden_size=1000"),
    ("batch not divisible", 1, "global_batch", "60", "global_batch_size (column 'global_batch')=60: must be divisible"),
    ("no measurement", 1, "measured_iter_time_s", "", "measured_iter_time_s='': blank"),
    ("no batch", 2, "global_batch", "", "global_batch='': blank"),
    ("unknown model preset with blank shape", 2, "layers", "", "model='GPT small': not a model preset"),
]


@pytest.mark.parametrize("what, row, column, value, needle", BAD_CELLS, ids=[b[0] for b in BAD_CELLS])
def test_bad_cell_names_row_and_column(capsys, tmp_path, what, row, column, value, needle):
    path = write_runs(tmp_path / "runs.csv", _with(row, column, value))
    code, out, err = run(capsys, "validate", path)
    assert code == 2, out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"runs.csv row {row} (line {row + 1}, case '{'ab'[row - 1]}')" in err, err
    assert needle in err, err
    with pytest.raises(ConfigError):  # the same through the API
        read_runs(path)


def test_tp_comm_overlap_flag_without_sp_names_the_row(capsys, tmp_path):
    code, _, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--tp-comm-overlap")
    assert code == 2 and "row 1 (line 2, case 'a')" in err and "tp_comm_overlap" in err
    assert len(err.strip().splitlines()) == 1


def test_gpu_that_contradicts_the_cluster(capsys, tmp_path):
    code, _, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--cluster", "dgx-h100")
    assert code == 2 and "row 1" in err and "gpu='A100 SXM4': is A100-SXM4-80GB but cluster 'dgx-h100'" in err


@pytest.mark.parametrize("content, needle", [
    ("", "is empty"),
    ("\n\n", "is empty"),
    (",".join(HEADER) + "\n", "has a header but no data rows"),
    (",".join(h for h in HEADER if h != "global_batch") + "\nx\n", "missing columns='global_batch|global_batch_size'"),
    (",".join(h for h in HEADER if h not in ("d", "gpus")) + "\nx\n", "d|dp|data_parallel_size (or gpus"),
    (",".join(h for h in HEADER if h not in ("gpu",)) + "\nx\n", "gpu|gpu_type (or cluster"),
    (",".join(h for h in HEADER if h not in ("measured_iter_time_s", "measured_tflops_per_gpu")) + "\nx\n",
     "measured_iter_time_s|iteration_time_s (or measured_tflops_per_gpu)"),
    (",".join(h for h in HEADER if h not in ("layers", "model")) + "\nx\n", "layers|num_layers"),
    (",".join([*HEADER, "tp"]) + "\nx\n", "both give tp"),
    (",".join([*HEADER, "Source"]) + "\nx\n", "repeats column 'source'"),
    (",".join(HEADER) + "\n" + ",".join(ROWS[0]) + ",extra,cells\n", "more cells than the header's 18 columns"),
])
def test_bad_file_is_one_line(capsys, tmp_path, content, needle):
    path = tmp_path / "runs.csv"
    path.write_text(content)
    code, out, err = run(capsys, "validate", path)
    assert code == 2, out
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "runs.csv" in err and needle in err, err


def test_no_such_file_and_directory(capsys, tmp_path):
    code, _, err = run(capsys, "validate", tmp_path / "nope.csv")
    assert code == 2 and "nope.csv" in err and "no such file" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "validate", tmp_path)
    assert code == 2 and "is a directory" in err and len(err.strip().splitlines()) == 1
    proc = subprocess.run([sys.executable, "-m", "commscope.cli.main", "validate", str(tmp_path / "nope.csv")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_not_utf8(capsys, tmp_path):
    path = tmp_path / "runs.csv"
    path.write_bytes(b"case_id,model\n\xff\xfe,x\n")
    code, _, err = run(capsys, "validate", path)
    assert code == 2 and "not UTF-8" in err


def test_bad_flag_value_names_the_default(capsys, tmp_path):
    code, _, err = run(capsys, "validate", write_runs(tmp_path / "runs.csv"), "--dtype", "fp17")
    assert code == 2 and "default dtype='fp17'" in err and len(err.strip().splitlines()) == 1


def test_a_measurement_faster_than_the_gpu_is_refused(capsys, tmp_path):
    """1e-9 s per iteration, or 5,000 TFLOP/s per H100 (peak 989): no GPU computes that; the row is named."""
    head = "case_id,model,gpu,t,p,d,global_batch,microbatch,"
    for column, value in (("measured_iter_time_s", "1e-9"), ("measured_tflops_per_gpu", "5000")):
        path = tmp_path / f"{column}.csv"
        path.write_text(f"{head}{column}\nok,llama3-8b,h100,1,1,8,64,1,{'40' if 'time' in column else '300'}\n"
                        f"fast,llama3-8b,h100,1,1,8,64,1,{value}\n")
        code, out, err = run(capsys, "validate", path)
        assert code == 2 and out == ""
        assert len(err.strip().splitlines()) == 1
        assert f"row 2 (line 3, case 'fast'): {column}={float(value):g}" in err
        assert "above the H100-SXM5-80GB's 989 TFLOP/s bf16 peak" in err
    # at the peak itself a run is possible, however unlikely: the model FLOPs at 900 TFLOP/s pass
    path = tmp_path / "peak.csv"
    path.write_text(f"{head}measured_tflops_per_gpu\nnear,llama3-8b,h100,1,1,8,64,1,900\n")
    assert run(capsys, "validate", path)[0] == 0


def test_a_run_the_memory_model_says_cannot_fit_gets_a_note(capsys, tmp_path):
    """llama3-8b on one H100 per replica without recomputation or a sharded optimizer: ~175 GiB by the memory model;
    the run was measured, so it is kept, with a note on the columns that may be missing."""
    path = tmp_path / "runs.csv"
    path.write_text("case_id,model,gpu,t,p,d,global_batch,microbatch,recompute,distributed_optimizer,"
                    "measured_iter_time_s\nbig,llama3-8b,h100,1,1,8,64,1,none,no,30\n"
                    "fits,llama3-8b,h100,4,1,2,64,1,full,yes,30\n")
    code, out, err = run(capsys, "validate", path)
    assert code == 0, err
    note = [line for line in out.splitlines() if "memory model gives" in line]
    assert len(note) == 1 and note[0].startswith("note (big): commscope's memory model gives")
    assert "more than the 80 GiB of H100-SXM5-80GB" in note[0]
