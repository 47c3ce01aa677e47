"""Real sweeps on 2 and 4 gloo ranks: every op and group size has rows, results check out, a wrong one fails loudly.

Correctness and format only, never speed: this machine has 2 cores, shared.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from commscope.measure.bench.collectives import _expected, _Pattern  # noqa: E402
from commscope.measure.bench.sweep import OPS, SweepConfig, WrongResultsError, run_sweep  # noqa: E402
from commscope.cli.main import main  # noqa: E402
from commscope.measure.launch import LaunchError, spawn  # noqa: E402


def _simulate(op, redop, pattern, n, c, root):
    """What each rank must hold after ``op``, from first principles (independent of _expected's indexing)."""
    total = c * n if op in ("all_gather", "reduce_scatter", "all_to_all") else c
    numel_in = c if op == "all_gather" else total
    inputs = [pattern.values(r, torch.arange(numel_in)) for r in range(n)]

    def reduce(parts):
        acc = parts[0].clone()
        for p in parts[1:]:
            acc = {"sum": acc + p, "prod": acc * p, "min": torch.minimum(acc, p), "max": torch.maximum(acc, p)}[redop]
        return acc

    if op == "all_reduce":
        return [reduce(inputs)] * n
    if op == "reduce":
        return {root: reduce(inputs)}
    if op == "broadcast":
        return [inputs[root]] * n
    if op == "sendrecv":
        return [inputs[(r - 1) % n] for r in range(n)]
    if op == "all_gather":
        return [torch.cat(inputs)] * n
    if op == "reduce_scatter":
        return [reduce(inputs)[r * c:(r + 1) * c] for r in range(n)]
    if op == "all_to_all":
        return [torch.cat([inputs[q][r * c:(r + 1) * c] for q in range(n)]) for r in range(n)]
    raise AssertionError(op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("redop,dtype", [("sum", "fp32"), ("prod", "bf16"), ("max", "int8"), ("sum", "fp16")])
def test_expected_results_match_a_simulation(op, n, redop, dtype):
    c, root = 5, n - 1
    pattern = _Pattern.for_op(op, redop, n, dtype)
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.int8, "fp16": torch.float16}[dtype]
    truth = _simulate(op, redop, pattern, n, c, root)
    ranks = truth.keys() if isinstance(truth, dict) else range(n)
    for r in ranks:
        want = truth[r]
        got = _expected(op, redop, pattern, r, n, c, root, torch.arange(want.numel()), tdtype)
        assert torch.equal(got, want.to(tdtype)), (op, n, r)
    if op in ("all_reduce", "reduce_scatter", "reduce"):  # the inputs are not all equal: the check can fail
        assert len({tuple(pattern.values(r, torch.arange(4)).tolist()) for r in range(n)}) > 1


def _sweep(rank, world, cfg):
    return run_sweep(cfg, command="test")


def test_sweep_on_2_ranks_api():
    cfg = SweepConfig(min_bytes=8, max_bytes=4096, step_factor=8, iters=3, warmup_iters=1)
    results = spawn(_sweep, 2, args=(cfg,), timeout_s=120)
    assert all(r.rows == results[0].rows for r in results)  # every rank gets the same rows
    res = results[0]
    assert {r.op for r in res.rows} == set(OPS)
    for r in res.rows:
        assert r.group_size == 2 and r.wrong == 0 and r.iters == 3 and r.backend == "gloo"
        assert r.time_s > 0 and r.p50_s == r.time_s <= r.p99_s and r.p95_s <= r.p99_s
        assert r.algbw_bytes_per_s == pytest.approx(r.size_bytes / r.time_s)
        assert r.intra_node is True
    assert res.meta["world_size"] == 2 and res.meta["backend"] == "gloo" and res.meta["num_hosts"] == 1


def test_sweep_other_dtype_redop_and_sequential_groups():
    cfg = SweepConfig(ops=("all_reduce", "reduce_scatter", "reduce"), min_bytes=64, max_bytes=4096, step_factor=64,
                      iters=2, warmup_iters=1, dtype="bfloat16", redop="max", group_sizes=(2,),
                      group_mode="sequential", root=1)
    res = spawn(_sweep, 4, args=(cfg,), timeout_s=120)[0]
    assert len(res.rows) == 6 and all(r.wrong == 0 and r.num_groups == 2 for r in res.rows)
    assert all(r.dtype == "bf16" for r in res.rows)
    assert [r.root for r in res.rows if r.op == "reduce"] == [1, 1]


@pytest.fixture(scope="module")
def bench4(tmp_path_factory):
    """One CLI sweep on 4 ranks: every op, groups of 2 and of 4."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    rc = main(["bench", "--nproc", "4", "--backend", "gloo", "--groups", "2,4", "-b", "8", "-e", "64K", "-f", "8",
               "-n", "3", "-w", "1", "--out", str(out), "--no-plot"])
    return rc, out


def test_cli_sweep_on_4_ranks_rows_for_every_op_and_group(bench4):
    rc, out = bench4
    assert rc == 0
    data = json.loads(out.read_text())
    meta, rows = data["meta"], data["rows"]
    assert meta["world_size"] == 4 and meta["group_sizes"] == [2, 4] and meta["group_mode"] == "concurrent"
    for key in ("backend", "hostname", "torch_version", "date", "command"):
        assert meta[key]
    assert {(r["op"], r["group_size"]) for r in rows} == {(op, g) for op in OPS for g in (2, 4)}
    for r in rows:
        assert r["wrong"] == 0
        assert r["num_groups"] == 4 // r["group_size"]
        for key in ("size_bytes", "count", "dtype", "redop", "time_s", "p50_s", "p95_s", "p99_s", "cv",
                    "algbw_bytes_per_s", "busbw_bytes_per_s", "backend_op", "noisy"):
            assert key in r
        assert r["backend_op"] == ("all_reduce" if r["op"] == "reduce_scatter" else r["op"])
    # nccl-tests' size conventions: 8 B of fp32 is 2 elements, too few for a per-rank all_gather over 4
    sizes = {(r["op"], r["group_size"]): sorted(x["size_bytes"] for x in rows
                                                if (x["op"], x["group_size"]) == (r["op"], r["group_size"])) for r in rows}
    assert sizes["all_reduce", 4] == [8, 64, 512, 4096, 32768]
    assert sizes["all_gather", 4] == [64, 512, 4096, 32768]
    assert sizes["all_gather", 2] == [8, 64, 512, 4096, 32768]


def test_cli_table_has_nccl_tests_columns(tmp_path, capfd):
    rc = main(["bench", "--nproc", "2", "--ops", "all_reduce,all_gather", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2",
               "-w", "1", "--out", str(tmp_path / "b.json")])
    assert rc == 0
    out, err = capfd.readouterr()
    assert "size         count      type   redop    root     time   algbw   busbw  #wrong      p95     cv" in out
    data_lines = [line for line in out.splitlines() if line and not line.startswith("#")]
    assert len(data_lines) == 4
    assert data_lines[0].split()[:5] == ["1024", "256", "float", "sum", "-1"]
    assert "# Out of bounds values : 0 OK" in out
    assert (tmp_path / "b.png").exists() or "matplotlib is not installed" in err


def test_a_wrong_result_fails_loudly(tmp_path, capfd):
    out = tmp_path / "bad.json"
    rc = main(["bench", "--nproc", "2", "-b", "256", "-e", "256", "-n", "1", "-w", "0", "--inject-error-rank", "0",
               "--out", str(out), "--no-plot"])
    assert rc == 1
    _, err = capfd.readouterr()
    assert "DATA CHECK FAILED" in err
    rows = json.loads(out.read_text())["rows"]
    assert {r["op"] for r in rows} == set(OPS) and all(r["wrong"] >= 1 for r in rows)
    # such rows are refused downstream
    assert main(["fit", str(out)]) == 2
    assert main(["estimate", "--bandwidth", str(out)]) == 2


def test_the_api_raises_with_the_rows():
    cfg = SweepConfig(ops=("all_reduce",), min_bytes=64, max_bytes=64, iters=1, warmup_iters=0, inject_error_rank=1)
    with pytest.raises(LaunchError, match="WrongResultsError: 1 wrong elements in 1 of 1 rows"):
        spawn(_sweep, 2, args=(cfg,), timeout_s=60)

    def catch(rank, world):
        try:
            run_sweep(cfg)
        except WrongResultsError as exc:
            return [r.wrong for r in exc.result.rows]

    assert spawn(catch, 2) == [[1], [1]]


def test_bad_requests_are_refused_before_launch(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["bench", "--nproc", "4", "--groups", "3"]) == 2
    assert "group sizes must be >= 2 and divide the number of ranks, 4" in capsys.readouterr().err
    assert main(["bench", "--nproc", "2", "-o", "avg", "--ops", "all_reduce"]) == 2
    assert main(["bench", "--nproc", "2", "-d", "complex"]) == 2
    assert main(["bench", "--nproc", "2", "--backend", "nccl"]) == 2 or torch.cuda.device_count() >= 2
    assert main(["bench", "-b", "8"]) == 2  # neither --nproc nor torchrun
    assert "--nproc N" in capsys.readouterr().err


def _inside_a_job(rank, world, out):
    from commscope.cli.bench_cmd import main as bench_main  # what `python -m commscope.measure.bench` runs

    return bench_main(["--ops", "all_reduce,broadcast", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "--out", out,
                       "--no-plot", "--json"])


def test_inside_an_existing_job_uses_its_process_group(tmp_path):
    # the ranks of an existing job (RANK/WORLD_SIZE set, process group up), as under torchrun
    out = tmp_path / "job.json"
    assert spawn(_inside_a_job, 2, args=(str(out),)) == [0, 0]
    data = json.loads(out.read_text())
    assert data["meta"]["world_size"] == 2 and data["meta"]["command"].startswith("python -m commscope.measure.bench")
    assert [r["op"] for r in data["rows"]] == ["all_reduce", "broadcast"]


def test_no_measured_row_is_never_a_success(tmp_path, capsys):
    """A sweep that measured nothing writes no empty JSON or plot and does not exit 0 (check_world refuses the sizes
    that lead there; this is the last line of defence)."""
    from argparse import Namespace

    from commscope.measure.bench.sweep import SweepResult
    from commscope.cli.bench_cmd import EXIT_FAILED, _finish

    out = tmp_path / "b.json"
    args = Namespace(json=False, out=out, no_plot=False)
    assert _finish(args, SweepResult(rows=(), meta={"noisy_cv": 0.2}), False) == EXIT_FAILED
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no row was measured" in err[0]
    assert not out.exists() and not out.with_suffix(".png").exists()
