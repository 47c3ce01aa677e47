"""`commscope moe simulate|analyze` and `traffic --routing` as a user runs them."""

import csv
import json

import numpy as np
import pytest

from commscope.cli.main import main
from commscope.moe import generate, load_trace, save_trace, write_rank_trace

# a 2-layer Mixtral keeps the runs small; ep 8 over dp 8
MIXTRAL = ("--model", "mixtral-8x7b", "--num-layers", "2", "--seq-length", "256", "--micro-batch-size", "1")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_writes_trace_metrics_and_pictures(capsys, tmp_path):
    out_dir = tmp_path / "moe"
    code, out, err = run(capsys, "moe", "simulate", *MIXTRAL, "--ep", "8", "--iterations", "12", "--routing", "settle:5",
                         "--out", out_dir)
    assert code == 0, err
    assert "settle:5:1.5, seed 0: 12 iterations x 1 micro-batch(es) x 2 MoE layer(s), ep=8, 8 experts, top-2" in out
    assert "trend towards uniformity: +" in out and "slowest rank's all-to-all takes" in out
    names = {p.name for p in out_dir.iterdir()}
    assert names == {"trace.npz", "metrics.csv", "metrics.json", "traffic_frames.png", "metrics.png"}
    trace = load_trace(out_dir / "trace.npz")
    assert trace.counts.shape == (12, 1, 2, 8, 8) and trace.tokens_per_rank == 256 and trace.layer_ids == (0, 1)
    rows = list(csv.DictReader((out_dir / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 12 and rows[0]["prediction_error_last"] == "" and float(rows[-1]["expert_entropy"]) > 0.9
    summary = json.loads((out_dir / "metrics.json").read_text())
    assert summary["iterations"] == 12 and summary["uniformity_trend_per_iteration"] > 0


def test_analyze_a_directory_of_rank_files_as_json(capsys, tmp_path):
    trace = generate("drift:2", iterations=9, ep=4, num_experts=8, top_k=2, tokens_per_rank=50, num_layers=2)
    for rank in range(4):
        write_rank_trace(tmp_path / "routing", rank, trace.counts[:, :, :, rank], top_k=2, num_experts=8, ep=4)
    code, out, err = run(capsys, "moe", "analyze", tmp_path / "routing", "--json", "--capacity-factor", "1.0",
                         "--out", tmp_path / "a", "--no-plot")
    assert code == 0, err
    s = json.loads(out)
    assert (s["iterations"], s["ep"], s["experts"], s["layers"], s["capacity_factor"]) == (9, 4, 8, 2, 1.0)
    assert s["dropped_assignments"] > 0 and s["files"] == [str(tmp_path / "a" / "metrics.csv"),
                                                           str(tmp_path / "a" / "metrics.json")]


def test_analyze_the_report_format(capsys, tmp_path):
    np.savez(tmp_path / "old.npz", routing=np.random.default_rng(0).integers(0, 50, size=(5, 4, 4)))
    code, out, err = run(capsys, "moe", "analyze", tmp_path / "old.npz")
    assert code == 0, err
    assert "5 iterations x 1 micro-batch(es) x 1 MoE layer(s), ep=4, 4 experts, top-1" in out


@pytest.mark.parametrize("argv,message", [
    (("moe", "simulate", "--model", "gpt-1.5b", "--iterations", "3"), "needs an MoE model"),
    (("moe", "simulate", *MIXTRAL, "--iterations", "3"), r"needs expert parallelism (--ep > 1)"),
    (("moe", "simulate", *MIXTRAL, "--ep", "8", "--routing", "zipf:x"), "the exponent s must be a number > 0"),
    (("moe", "simulate", *MIXTRAL, "--ep", "8", "--iterations", "0"), "iterations=0: must be >= 1"),
    (("moe", "analyze", "nowhere.npz"), "no such file or directory"),
    (("traffic", *MIXTRAL, "--ep", "8", "--tp", "1", "--pp", "1", "--dp", "8", "--routing", "nope"),
     "routing='nope': valid: uniform, balanced, zipf:<s>"),
    (("traffic", "--routing", "uniform"), "needs an MoE model (num_experts > 0); gpt-1.5b is dense"),
])
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, argv, message):
    code, _out, err = run(capsys, *argv)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_bad_trace_file_exits_2_naming_file_iteration_and_field(capsys, tmp_path):
    counts = np.ones((3, 1, 1, 2, 2), dtype=np.int64)
    counts[2, 0, 0, 1, 0] = -5
    np.savez(tmp_path / "t.npz", counts=counts, meta=np.array('{"top_k": 1}'))
    code, _out, err = run(capsys, "moe", "analyze", tmp_path / "t.npz")
    assert code == 2 and err.count("\n") == 1
    assert f"{tmp_path / 't.npz'}, iteration 2, micro-batch 0, layer 0, rank 1, expert 0: counts=-5: must be >= 0" in err


def test_traffic_routing_follows_the_router(capsys, tmp_path):
    job = ("traffic", *MIXTRAL, "--ep", "8", "--tp", "1", "--pp", "2", "--dp", "8", "--global-batch-size", "16", "--json")
    code, out, err = run(capsys, *job)
    assert code == 0, err
    balanced = json.loads(out)
    code, out, err = run(capsys, *job, "--routing", "zipf:1.2", "--routing-iteration", "3", "--routing-seed", "1")
    assert code == 0, err
    routed = json.loads(out)
    assert routed["bytes_by_axis"]["ep"] != balanced["bytes_by_axis"]["ep"]
    assert routed["max_pair_bytes"] > balanced["max_pair_bytes"]
    assert any("follow the routing of zipf:1.2, seed 1, iteration 3" in n for n in routed["notes"])
    # a recorded trace works the same way, and a capacity factor drops tokens
    trace_dir = tmp_path / "sim"
    assert run(capsys, "moe", "simulate", *MIXTRAL, "--ep", "8", "--iterations", "2", "--routing", "hot:1:0.9",
               "--out", trace_dir, "--no-plot")[0] == 0
    code, out, err = run(capsys, *job, "--routing", trace_dir / "trace.npz", "--routing-iteration", "1",
                         "--moe-expert-capacity-factor", "1.0")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("trace.npz, iteration 1" in n for n in notes) and any("token assignments dropped" in n for n in notes)


def test_estimate_takes_the_routing(capsys):
    job = ("estimate", *MIXTRAL, "--ep", "8", "--tp", "1", "--pp", "1", "--dp", "8", "--global-batch-size", "8", "--json")
    base = json.loads(run(capsys, *job)[1])
    hot = json.loads(run(capsys, *job, "--routing", "hot:0:1")[1])
    assert hot["ep_s"] > base["ep_s"]


def test_report_reads_a_routing_trace(tmp_path):
    from commscope.report.html import load_moe

    trace = generate("uniform", iterations=3, ep=4, num_experts=8, top_k=2, tokens_per_rank=40, num_layers=2)
    for rank in range(4):
        write_rank_trace(tmp_path / "routing", rank, trace.counts[:, :, :, rank], top_k=2, num_experts=8)
    np.savez(tmp_path / "routing" / "old.npz", routing=np.ones((2, 4, 4)))
    items = load_moe(tmp_path / "routing")
    assert [i.name for i in items] == ["routing", "old"]
    assert items[0].routing.shape == (3, 4, 4) and items[0].routing.sum() == trace.counts.sum()


def test_an_out_holding_an_earlier_run_is_refused(capsys, tmp_path):
    """A --no-plot run into the folder of a run with pictures once replaced trace.npz and the metrics and left the
    first run's metrics.png and traffic_frames.png beside them."""
    out_dir = tmp_path / "moe"
    job = ("moe", "simulate", *MIXTRAL, "--ep", "8", "--iterations", "3")
    code, _, err = run(capsys, *job, "--out", out_dir)
    assert code == 0, err
    before = {p.name: p.read_bytes() for p in out_dir.iterdir()}
    for argv in ((*job, "--routing-seed", "1", "--no-plot", "--out", out_dir),
                 ("moe", "analyze", out_dir / "trace.npz", "--window", "2", "--out", out_dir)):
        code, out, err = run(capsys, *argv)
        assert code == 2 and err.count("\n") == 1 and out == "", err
        assert f"out='{out_dir}': already holds the files of an earlier run (" in err
        assert "give --force to replace it, or choose another directory" in err
        assert {p.name: p.read_bytes() for p in out_dir.iterdir()} == before
    (out_dir / "metrics.csv").unlink()  # any one of the files is an earlier run's
    for name in ("trace.npz", "metrics.json", "traffic_frames.png", "metrics.png"):
        code, _, err = run(capsys, *job, "--out", out_dir)
        assert code == 2 and "already holds the files of an earlier run (" in err and name in err
        (out_dir / name).unlink()
    code, _, err = run(capsys, *job, "--out", out_dir)  # now empty: written
    assert code == 0 and (out_dir / "trace.npz").is_file()


@pytest.mark.parametrize("action", [("simulate", *MIXTRAL, "--ep", "8", "--iterations", "3"), ("analyze", "{trace}")])
def test_an_out_that_cannot_be_made_is_named_before_any_work(capsys, tmp_path, action):
    trace = generate("uniform", iterations=2, ep=2, num_experts=4, top_k=1, tokens_per_rank=8)
    save_trace(trace, tmp_path / "t.npz")
    (tmp_path / "file.txt").write_text("x")
    argv = [a.replace("{trace}", str(tmp_path / "t.npz")) for a in action]
    for out, message in (("/proc/commscope-nope", "out='/proc/commscope-nope': cannot create it in /proc"),
                         (str(tmp_path / "file.txt" / "m"), "file.txt is a file, not a directory")):
        code, _, err = run(capsys, "moe", *argv, "--out", out)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    code, _, err = run(capsys, "moe", *argv, "--window", "0", "--out", tmp_path / "m")
    assert code == 2 and "window=0" in err and not (tmp_path / "m").exists()  # no trace.npz left behind


def test_a_huge_capacity_factor_drops_nothing_without_a_warning(capsys):
    """--moe-expert-capacity-factor 1e300 once printed numpy's 'invalid value encountered in cast' and reported every
    assignment dropped and the slowest rank at 0.000x balanced."""
    job = ("moe", "simulate", *MIXTRAL, "--ep", "8", "--iterations", "3", "--no-plot", "--json")
    code, out, err = run(capsys, *job, "--moe-expert-capacity-factor", "1e300")
    assert code == 0 and err == "", err
    huge = json.loads(out)
    code, out, _ = run(capsys, *job)
    assert huge["dropped_fraction_mean"] == 0 and huge["balance_error_mean"] == json.loads(out)["balance_error_mean"] > 0.5


@pytest.mark.parametrize("argv", [("simulate", *MIXTRAL, "--ep", "8", "--iterations", "3", "--capacity-factor"),
                                  ("analyze", "{trace}", "--capacity-factor")])
@pytest.mark.parametrize("factor", ["inf", "nan"])
def test_a_capacity_factor_that_is_not_finite_is_refused_before_any_work(capsys, tmp_path, argv, factor):
    save_trace(generate("uniform", iterations=2, ep=2, num_experts=4, top_k=1, tokens_per_rank=8), tmp_path / "t.npz")
    argv = tuple(a.replace("{trace}", str(tmp_path / "t.npz")) for a in argv)
    code, out, err = run(capsys, "moe", *argv, factor, "--out", tmp_path / "m")
    assert code == 2 and err.count("\n") == 1 and out == ""
    assert f"capacity_factor={float(factor)!r}: must be a finite number > 0" in err
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("arrays,message", [
    ({"routing": np.full((2, 4, 4), 1e30)}, "iteration 0, rank 0, to rank 0: routing=1e+30: not a token count"),
    ({"counts": np.full((2, 1, 1, 2, 2), 2**64 - 1, dtype=np.uint64), "meta": np.array('{"top_k": 1}')},
     "expert 0: counts=18446744073709551615: not a token count: must be <= 2**40"),
])
def test_counts_no_run_could_make_are_named_as_in_the_file(capsys, tmp_path, arrays, message):
    """Counts of 1e30 once printed numpy's cast warning, then 'counts=-9223372036854775808: must be >= 0': a value
    the file does not hold, in a second message."""
    np.savez(tmp_path / "huge.npz", **arrays)
    code, out, err = run(capsys, "moe", "analyze", tmp_path / "huge.npz")
    assert code == 2 and err.count("\n") == 1 and out == "", err
    assert f"{tmp_path / 'huge.npz'}, iteration 0" in err and message in err, err
    assert "-9223372036854775808" not in err and "Warning" not in err


@pytest.mark.parametrize("name,content,what", [
    ("notes.npz", b"not a trace\n", "it starts with b'not a '"),
    ("empty.npz", b"", "it is empty"),
    ("table.csv", b"op,size\nall_reduce,8\n", "it starts with b'op,siz'"),
])
def test_a_file_that_is_no_npz_is_said_to_be_none(capsys, tmp_path, name, content, what):
    """A text file was once 'not a readable .npz archive (This file contains pickled (object) data. If you trust the
    file ...)': numpy's guess, not the user's mistake."""
    (tmp_path / name).write_bytes(content)
    code, _, err = run(capsys, "moe", "analyze", tmp_path / name)
    assert code == 2 and err.count("\n") == 1
    assert f"file='{name}': is not an .npz archive: {what}" in err and "pickle" not in err, err


def test_a_single_npy_array_is_said_to_be_no_npz(capsys, tmp_path):
    np.save(tmp_path / "routing.npy", np.ones((2, 4, 4)))
    code, _, err = run(capsys, "moe", "analyze", tmp_path / "routing.npy")
    assert code == 2 and "file='routing.npy': is not an .npz archive: it is a single .npy array" in err
