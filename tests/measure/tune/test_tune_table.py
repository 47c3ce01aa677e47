"""Tuning tables survive their file format; tables from another machine or job shape are refused, loudly."""

from __future__ import annotations

import json
import socket
from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import commscope.measure.tune  # noqa: E402
from commscope.errors import ConfigError  # noqa: E402
from commscope.measure.tune.mixed import MixedOptions, _agree  # noqa: E402
from commscope.measure.tune.files import load_table, read_table, table_document, write_table  # noqa: E402
from commscope.measure.tune.table import (  # noqa: E402
    TuningTable,
    differences,
    ensure_compatible,
    machine_here,
    uncovered_group_size,
)

from tune_tables import fake_machine, synthetic_table  # noqa: E402


def test_round_trip_through_the_file(tmp_path):
    table = replace(synthetic_table(), skipped={"mpi": "needs mpirun"}, command="commscope tune --nproc 4")
    path = write_table(table, tmp_path / "t.json")
    back = read_table(path)
    assert back == table
    assert back.digest == table.digest
    data = json.loads(path.read_text())
    assert data["format"] == "commscope-tuning" and data["schema_version"] == 1
    assert data["fingerprint"]["num_hosts"] == 1 and data["fingerprint"]["group_sizes"] == [2, 4]
    assert TuningTable.from_dict(table.to_dict()) == table  # selection is derived: the file adds it


def test_the_public_api_resolves():
    for name in commscope.measure.tune.__all__:
        assert getattr(commscope.measure.tune, name) is not None, name
    with pytest.raises(AttributeError):
        commscope.measure.tune.nothing_here  # noqa: B018


def test_same_machine_is_accepted(tmp_path):
    here = machine_here()
    path = write_table(synthetic_table(machine=here), tmp_path / "t.json")
    assert load_table(path).machine == here
    assert differences(synthetic_table(machine=replace(here, hostname="other-node")), here) == []  # nodes share one


@pytest.mark.parametrize("change, says", [
    ({"torch_version": "2.5.1+cu124"}, "torch 2.5.1+cu124 there, 2.13.0+cpu here"),
    ({"backends": ("gloo", "nccl")}, "backends gloo,nccl there, gloo here"),
    ({"device": "NVIDIA H100 80GB HBM3"}, "device 'NVIDIA H100 80GB HBM3' there, 'cpu' here"),
])
def test_another_machine_is_refused_unless_forced(tmp_path, change, says):
    here = fake_machine()
    path = write_table(synthetic_table(machine=fake_machine(**change)), tmp_path / "t.json")
    with pytest.raises(ConfigError) as err:
        load_table(path, here=here)
    text = str(err.value)
    assert says in text and str(path) in text and "allow_mismatch=True" in text and "\n" not in text
    assert load_table(path, here=here, allow_mismatch=True).machine != here
    assert ensure_compatible(read_table(path), here, allow_mismatch=True) == [says]


def test_init_refuses_before_any_process_group_exists(tmp_path):
    path = write_table(synthetic_table(machine=replace(machine_here(), torch_version="1.0")), tmp_path / "t.json")
    with pytest.raises(ConfigError, match="torch 1.0 there"):
        commscope.measure.tune.init(tuning=path)
    assert not dist.is_initialized()


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(schema_version=2), "schema_version=2"),
    (lambda d: d.update(format="something-else"), "not a commscope tuning table"),
    (lambda d: d["selection"][0]["segments"][0].update(backend="ring"), "does not follow from the measurements"),
    (lambda d: d["measurements"][0].update(backend="mystery"), "not among the candidates"),
    (lambda d: d.pop("candidates"), "malformed"),
])
def test_unreadable_or_edited_files_are_refused(tmp_path, edit, says):
    data = table_document(synthetic_table())
    edit(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=says):
        read_table(path)


def test_group_sizes_outside_the_measured_range_are_not_covered():
    table = synthetic_table(group_sizes=(2, 4))
    assert uncovered_group_size(table, 3) is None and uncovered_group_size(table, 1) is None
    assert "measured on groups of 2,4 ranks; a group of 8" in uncovered_group_size(table, 8)


def _store(size: int, others: dict[int, str]):
    store = dist.HashStore()
    for rank, digest in others.items():
        store.set(f"commscope-mixed/{rank}", json.dumps({"digest": digest, "host": socket.gethostname()}))
    return store


def test_group_creation_refuses_an_uncovered_size_a_host_mismatch_and_different_tables():
    table = synthetic_table(group_sizes=(2, 4))
    opts = MixedOptions(table=table, source="t.json")
    with pytest.raises(ConfigError, match="a group of 8 lies outside them"):
        _agree(_store(8, {r: table.digest for r in range(1, 8)}), 0, 8, opts, is_world=True)
    _agree(_store(8, {r: table.digest for r in range(1, 8)}), 0, 8, replace(opts, allow_mismatch=True), is_world=True)
    two_hosts = synthetic_table(hosts=["node-a", "node-a", "node-b", "node-b"])
    with pytest.raises(ConfigError, match="measured on 2 host"):
        _agree(_store(2, {1: two_hosts.digest}), 0, 2, MixedOptions(table=two_hosts), is_world=True)
    _agree(_store(2, {1: two_hosts.digest}), 0, 2, MixedOptions(table=two_hosts), is_world=False)  # a subgroup
    with pytest.raises(ConfigError, match=r"ranks \[1\] of this group route by another table"):
        _agree(_store(2, {1: "0" * 64}), 0, 2, opts, is_world=False)


def test_the_mixed_backend_without_a_table_says_how_to_give_one(monkeypatch):
    from commscope.measure.tune.mixed import TUNING_ENV, _default_options

    monkeypatch.delenv(TUNING_ENV, raising=False)
    with pytest.raises(ConfigError, match="commscope.measure.tune.init"):
        _default_options()
    with pytest.raises(ConfigError, match="exactly one of table= or force="):
        MixedOptions()
    with pytest.raises(ConfigError, match="force='all_reduce=bruck'"):
        MixedOptions(force={"all_reduce": "bruck"})
