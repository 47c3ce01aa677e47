"""A recorded job that fails is explained: the launcher names the rank that died first and how, the recording
keeps the job description from its start and a marker of the failure, and `summarize` tells the dead rank from
the ranks stopped because of it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from commscope.io.oplog import FAILURE_FILE, read_failure
from commscope.cli.main import main
from commscope.measure.launch import LaunchError
from commscope.spec.parallel import ParallelSpec
from commscope.trainings.gpt import RunConfig, launch, rank_setup, reference_model

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")


def _dies_on_rank_1(rank: int, world: int, cfg: RunConfig, backend: str, progress: object = None) -> int:
    log, _ = rank_setup(rank, cfg, backend)
    t = torch.ones(4)
    dist.all_reduce(t)  # recorded on every rank
    log.flush()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)  # ranks 0 and 2 fail here, after rank 1 vanished
    return rank


def test_a_killed_rank_is_named_in_the_recording_and_by_summarize(tmp_path: Path, capsys) -> None:
    logdir = tmp_path / "logs"
    cfg = RunConfig(model=reference_model(), parallel=ParallelSpec(dp=3, global_batch_size=6, micro_batch_size=2),
                    record=str(logdir))
    with pytest.raises(LaunchError) as info:
        launch(_dies_on_rank_1, cfg, timeout_s=60, backend="gloo")
    assert info.value.rank == 1 and info.value.how == "was killed by signal SIGKILL"
    marker = read_failure(logdir)
    assert marker is not None and marker["rank"] == 1 and marker["exitcode"] == -signal.SIGKILL
    assert marker["stopped_after"] == [0, 2] and marker["world_size"] == 3

    assert main(["summarize", str(logdir)]) == 0
    err = capsys.readouterr().err
    assert ("commscope summarize: failed: rank 1 was killed by signal SIGKILL first; ranks [0, 2] were stopped because "
            "of it") in err
    assert main(["summarize", str(logdir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["failure"]["rank"] == 1


def test_a_failed_workload_is_one_line_and_its_job_is_written_first(tmp_path: Path, capsys) -> None:
    logdir = tmp_path / "logs"
    # a timeout no training meets: the ranks are killed, the launcher explains in one line, exit status 1
    assert main(["workload", "gpt", "--record", str(logdir), "--timeout", "0.05"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "commscope workload: starting 2 ranks (dp 2; dp 2 by default: --dp to choose)"
    assert len(err) == 2 and err[1].startswith("commscope workload: error: rank(s) 0, 1 of 2 still running")
    assert (logdir / "model.toml").is_file() and (logdir / "parallel.toml").is_file()  # written before the start
    marker = json.loads((logdir / FAILURE_FILE).read_text())
    assert marker["timed_out"] and marker["rank"] is None and marker["stopped_after"] == [0, 1]


def test_a_recording_never_goes_into_a_directory_that_holds_one(tmp_path: Path) -> None:
    import commscope.measure.capture
    from commscope.errors import ConfigError

    old = tmp_path / "logs"
    old.mkdir()
    (old / "rank00000.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="already holds a recording"), commscope.measure.capture.record(old):
        pass
    assert (old / "rank00000.jsonl").read_text() == "{}\n"
