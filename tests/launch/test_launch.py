"""The forking launcher: values in rank order, a failing rank named with its traceback, hung ranks killed."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from commscope.errors import ConfigError  # noqa: E402
from commscope.launch import LaunchError, RankEnv, ranks_from_env, spawn  # noqa: E402


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
from commscope.launch import spawn

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
