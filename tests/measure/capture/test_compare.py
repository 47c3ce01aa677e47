"""Measured vs predicted: a data-parallel run recorded on real gloo ranks matches the prediction exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from commscope.api import predict  # noqa: E402
from commscope.measure.capture import pg as cpg  # noqa: E402
from commscope.measure.capture.analysis import compare, read_run  # noqa: E402
from commscope.measure.capture.recorder import RankLog  # noqa: E402
from commscope.measure.launch import spawn  # noqa: E402
from commscope.spec.cluster import ClusterSpec, LinkTier  # noqa: E402
from commscope.spec.model import ModelSpec  # noqa: E402
from commscope.spec.parallel import ParallelSpec  # noqa: E402

CLUSTER = ClusterSpec(name="cpu", intra_node=LinkTier(name="shm", bandwidth_bytes_per_s=1e9),
                      inter_node=LinkTier(name="tcp", bandwidth_bytes_per_s=1e8), peak_flops={"fp32": 1e11})


def _flat_grads_job(rank, world, logdir, numel, steps):
    """Data parallelism as Megatron does it without buckets: one fp32 all-reduce of all gradients per step."""
    import torch.distributed as dist

    log = RankLog(Path(logdir), batch=16)
    cpg.set_sink(log)
    dist.broadcast(torch.zeros(numel), src=0)  # setup: parameters from rank 0
    for i in range(steps):
        log.step = i
        grads = torch.randn(numel)
        dist.all_reduce(grads)
    log.close()


def test_measured_dp_matches_prediction_exactly(tmp_path):
    cpg.register()
    model = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=2, seq_len=16, vocab_size=100,
                      make_vocab_size_divisible_by=1, dtype="fp32")
    parallel = ParallelSpec(dp=4, global_batch_size=4)
    pred = predict(model, parallel, CLUSTER)
    numel = model.num_parameters(padded_vocab=True)
    spawn(_flat_grads_job, 4, args=(str(tmp_path), numel, 2), backend="commscope",
          env={cpg.INNER_BACKEND_ENV: "gloo"}, timeout_s=120)
    result = compare(pred, read_run(tmp_path))
    assert result["num_steps"] == 2
    dp = result["by_axis"]["dp"]
    assert dp["measured_bytes"] == dp["predicted_bytes"] == numel * 4
    assert dp["measured_count"] == dp["predicted_count"] == 1
    assert result["max_rel_error"] == 0.0
    assert result["setup"] == [{"axis": "dp", "op": "broadcast", "count": 1, "bytes": numel * 4}]


def test_a_rank_that_logged_nothing_is_named(tmp_path, capsys):
    """compare of a recording where one rank logged no op once printed a 25% difference and asked whether it was the
    right job; it names the rank (a log holding only its header, or no log at all)."""
    from commscope.cli.main import main

    rec = tmp_path / "rec"
    assert main(["workload", "gpt", "--tp", "1", "--pp", "2", "--dp", "2", "--steps", "1", "--record", str(rec)]) == 0
    capsys.readouterr()
    log = rec / "rank00003.jsonl"
    log.write_text(log.read_text().splitlines()[0] + "\n")  # its header only
    (rec / "rank00003.done").write_text("0\n")
    for jobs in ([], ["--jobs", "2"]):
        assert main(["compare", str(rec), *jobs]) == 0
        out, err = capsys.readouterr()
        assert "rank00003.jsonl: the log holds no op record, only its header: rank 3" in err  # problems: stderr
        assert "rank 3 logged no op, so its ops are missing from the measured side" in out
        assert "is the job the one that was recorded?" not in out
    log.unlink()
    (rec / "rank00003.done").unlink()
    assert main(["compare", str(rec)]) == 0
    out, err = capsys.readouterr()
    assert "no log for rank(s) 3 of the 4 ranks" in out + err and "rank 3 logged no op, so its ops are missing" in out
