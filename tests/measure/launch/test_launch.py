"""The forking launcher: values in rank order, a failing rank named with its traceback, hung ranks killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from commscope.errors import ConfigError  # noqa: E402
from commscope.measure.launch import (  # noqa: E402
    LaunchError,
    RankEnv,
    check_backend,
    check_nproc,
    max_local_ranks,
    ranks_from_env,
    spawn,
)


def _sum_of_ranks(rank, world, scale):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return {"rank": rank, "world": world, "sum": float(t[0]) * scale, "env_rank": os.environ["RANK"],
            "threads": torch.get_num_threads(), "backend": dist.get_backend()}


def test_values_come_back_in_rank_order():
    out = spawn(_sum_of_ranks, 4, args=(2.0,))
    assert [o["rank"] for o in out] == [0, 1, 2, 3]
    assert all(o["world"] == 4 and o["sum"] == 12.0 and o["backend"] == "gloo" for o in out)
    assert [o["env_rank"] for o in out] == ["0", "1", "2", "3"]
    assert all(o["threads"] == 1 for o in out)


def _env_value(rank, world, key):
    return os.environ.get(key)


def test_extra_environment_reaches_the_ranks():
    assert spawn(_env_value, 2, args=("COMMSCOPE_TEST_VAR",), env={"COMMSCOPE_TEST_VAR": "x"}) == ["x", "x"]


def _fails_on_rank_1(rank, world):
    if rank == 1:
        raise ValueError("rank one is broken")
    t = torch.ones(1)
    dist.all_reduce(t)  # the others wait in a collective that rank 1 never joins
    return rank


def test_an_exception_names_its_rank_and_carries_the_traceback():
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        spawn(_fails_on_rank_1, 3, timeout_s=60)
    err = info.value
    assert isinstance(err, RuntimeError)
    assert err.rank == 1 and not err.timed_out
    assert "rank 1 of 3 failed" in str(err)
    assert "ValueError: rank one is broken" in str(err) and "_fails_on_rank_1" in err.details
    assert time.monotonic() - t0 < 30  # torn down at once, not at the collective timeout


def _hangs_on_rank_2(rank, world):
    if rank == 2:
        time.sleep(120)
    return rank


def test_a_hung_rank_is_killed_at_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as info:
        spawn(_hangs_on_rank_2, 3, timeout_s=4)
    assert info.value.timed_out and info.value.rank == 2
    assert "rank(s) 2 of 3 still running after timeout_s=4" in str(info.value)
    assert time.monotonic() - t0 < 15


def _exits_hard(rank, world):
    if rank == 0:
        os._exit(3)
    return rank


def test_a_rank_that_dies_without_a_result_is_reported():
    with pytest.raises(LaunchError, match="(?s)rank 0 of 2 failed.*exited with code 3"):
        spawn(_exits_hard, 2, timeout_s=30)


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="nproc"):
        spawn(_sum_of_ranks, 0)
    with pytest.raises(ConfigError, match="timeout_s"):
        spawn(_sum_of_ranks, 2, timeout_s=0)


def test_ranks_from_env():
    assert ranks_from_env({}) is None
    env = ranks_from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"})
    assert env == RankEnv(rank=3, world_size=8, local_rank=1, local_world_size=4)
    assert ranks_from_env({"RANK": "0", "WORLD_SIZE": "2"}) == RankEnv(rank=0, world_size=2, local_rank=0,
                                                                       local_world_size=2)
    with pytest.raises(ConfigError, match="RANK"):
        ranks_from_env({"RANK": "8", "WORLD_SIZE": "8"})
    with pytest.raises(ConfigError, match="WORLD_SIZE"):
        ranks_from_env({"RANK": "0", "WORLD_SIZE": "two"})


def _killed_on_rank_2(rank, world):
    t = torch.ones(1)
    dist.all_reduce(t)  # everyone is connected
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)  # the others fail here ("Connection closed by peer") after rank 2 vanished
    return rank


def test_a_killed_rank_is_named_first_with_its_signal():
    # its peers raise too, and may report before the parent sees rank 2's exit: the silent death still comes first
    with pytest.raises(LaunchError) as info:
        spawn(_killed_on_rank_2, 4, timeout_s=60)
    err = info.value
    assert err.rank == 2 and err.exitcode == -signal.SIGKILL and not err.timed_out
    assert err.how == "was killed by signal SIGKILL"
    assert err.summary.startswith("rank 2 of 4 failed first: it was killed by signal SIGKILL; rank(s) 0, 1, 3 ")
    assert "\n" not in err.summary and err.failed_after == (0, 1, 3)


def test_a_raising_rank_is_summarised_in_one_line():
    with pytest.raises(LaunchError) as info:
        spawn(_fails_on_rank_1, 3, timeout_s=60)
    assert info.value.summary.startswith("rank 1 of 3 failed first: it raised ValueError: rank one is broken")
    assert "\n" not in info.value.summary


def test_rank_counts_beyond_the_machine_are_refused_before_any_fork():
    limit = max_local_ranks()
    assert limit >= 8
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="--oversubscribe"):
        spawn(_sum_of_ranks, 100_000)
    assert time.monotonic() - t0 < 1.0
    check_nproc(limit + 1, oversubscribe=True)  # the user asked for it


def test_a_backend_this_torch_lacks_is_refused():
    with pytest.raises(ConfigError, match="not a torch.distributed backend"):
        check_backend("carrier-pigeon")
    if not dist.is_mpi_available():
        with pytest.raises(ConfigError, match="built without it"):
            spawn(_sum_of_ranks, 2, backend="mpi")


_ORPHAN_PARENT = """
import os, sys, time
from commscope.measure.launch import spawn

def sleeper(rank, world, pid_dir):
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    time.sleep(120)

spawn(sleeper, 2, args=(sys.argv[1],), timeout_s=300)
"""


def test_ranks_die_with_their_launcher(tmp_path):
    """A launcher killed with SIGKILL cleans nothing up; the kernel stops its ranks (PR_SET_PDEATHSIG)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    script = tmp_path / "parent.py"
    script.write_text(_ORPHAN_PARENT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=dict(os.environ))
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len([p for p in tmp_path.iterdir() if p.name.isdigit()]) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        pids = [int(p.name) for p in tmp_path.iterdir() if p.name.isdigit()]
        assert len(pids) == 2
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [pid for pid in pids if _alive(pid)]
            time.sleep(0.1)
        assert alive == []
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in pids:  # a failed test leaves no sleeping orphans behind
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
    except FileNotFoundError:
        return False


_COUNT_TORCH_IMPORTS = '''
import importlib.abc, os, sys

class _Count(importlib.abc.MetaPathFinder):
    """Writes the pid of every process that imports torch afresh (a forked rank that inherits it does not)."""
    def find_spec(self, name, path, target=None):
        if name == "torch":
            with open(sys.argv[1], "a") as f:
                f.write(f"{os.getpid()}\\n")
        return None

sys.meta_path.insert(0, _Count())
from commscope.measure.launch import spawn

def rank_fn(rank, world):
    import torch
    return torch.__name__

assert spawn(rank_fn, 3) == ["torch"] * 3
'''


def test_forked_ranks_do_not_import_torch_again(tmp_path):
    """A caller that never imported torch (``bench --backend gloo``, ``tune``): torch is imported once, by the
    parent, and the three ranks inherit it."""
    import subprocess
    import sys

    script, log = tmp_path / "count.py", tmp_path / "imports.txt"
    script.write_text(_COUNT_TORCH_IMPORTS)
    subprocess.run([sys.executable, str(script), str(log)], check=True, timeout=120)
    pids = log.read_text().split()
    assert len(pids) == 1, pids


_CLI_COUNTING_TORCH_IMPORTS = _COUNT_TORCH_IMPORTS.split("from commscope.measure.launch")[0] + '''
from commscope.cli.main import main
sys.exit(main(sys.argv[2:]))
'''


@pytest.mark.parametrize("argv", [
    ["bench", "--nproc", "2", "--backend", "gloo", "-b", "8", "-e", "8", "-n", "1", "-w", "1", "--ops", "all_reduce"],
    ["tune", "--nproc", "2", "--ops", "all_reduce", "-b", "1K", "-e", "1K", "-n", "1", "-w", "1"],
], ids=["bench", "tune"])
def test_bench_and_tune_ranks_do_not_import_torch_again(tmp_path, argv):
    """``commscope bench --backend gloo`` and ``commscope tune`` on CPU: torch is imported once, by the command's own
    process, before its ranks are forked (each rank importing it again cost 2.8x the start-up)."""
    script, log = tmp_path / "count.py", tmp_path / "imports.txt"
    script.write_text(_CLI_COUNTING_TORCH_IMPORTS)
    done = subprocess.run([sys.executable, str(script), str(log), *argv, "--out", str(tmp_path / "out.json")],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out.json").exists()
    pids = log.read_text().split()
    assert len(pids) == 1, pids  # the command's process, not its two ranks
