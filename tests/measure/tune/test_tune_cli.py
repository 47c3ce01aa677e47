"""``commscope tune`` on two real gloo ranks writes a table this machine accepts; bad input exits 2 with one line."""

from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("torch")

from commscope.cli.main import main
from commscope.cli.tune_cmd import format_selection
from commscope.measure.tune.files import load_table
from commscope.measure.tune.table import TuningTable

from tune_tables import synthetic_table


def test_tiny_sweep_writes_a_valid_table(tmp_path, capsys):
    out = tmp_path / "tuning.json"
    rc = main(["tune", "--nproc", "2", "--ops", "all_reduce,all_to_all", "-b", "1K", "-e", "4K", "-n", "2", "-w", "1",
               "--json", "--out", str(out)])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    table = load_table(out)  # accepted on the machine that measured it
    assert TuningTable.from_dict(printed) == table
    assert (table.world_size, table.group_sizes, table.num_hosts) == (2, (2,), 1)
    measured = {(m.op, m.size_bytes, m.backend) for m in table.measurements}
    backends = {"all_reduce": ("gloo", "ring", "recursive_doubling"), "all_to_all": ("gloo", "pairwise", "bruck")}
    assert measured == {(op, s, b) for op, bs in backends.items() for s in (1024, 2048, 4096) for b in bs}
    assert all(m.wrong == 0 and m.time_s > 0 and m.iters == 2 for m in table.measurements)
    assert [e["op"] for e in printed["selection"]] == ["all_reduce", "all_to_all"]


def test_selection_lines_name_each_range():
    lines = format_selection(synthetic_table())
    assert lines[1].split() == ["op", "group", "device", "backend", "per", "size"]
    ar = next(line for line in lines if line.split()[:2] == ["all_reduce", "n=4"])
    assert ar.endswith("recursive_doubling up to 1.00 KiB, gloo up to 16.00 KiB, ring beyond")


@pytest.mark.parametrize("argv, says", [
    (["--ops", "sendrecv"], "commscope tune chooses backends for all_reduce"),
    (["--backend", "gloo,carrier-pigeon"], "backend='carrier-pigeon': expected among gloo, ring"),
    (["--groups", "3"], "groups=3: group sizes must be >= 2 and divide the number of ranks, 2"),
    (["--tie-tolerance", "1.5"], "tie_tolerance=1.5"),
])
def test_bad_input_exits_2_naming_it(argv, says, capsys, tmp_path):
    rc = main(["tune", "--nproc", "2", "--out", str(tmp_path / "t.json"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and says in err and err.count("\n") == 1
    assert not (tmp_path / "t.json").exists()


def test_without_nproc_or_torchrun_says_how(capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert main(["tune"]) == 2
    assert "give --nproc N" in capsys.readouterr().err


def test_show_checks_the_table_against_this_machine(tmp_path, capsys):
    from dataclasses import replace

    from commscope.measure.tune.files import write_table
    from commscope.measure.tune.table import machine_here

    here = write_table(synthetic_table(machine=machine_here()), tmp_path / "here.json")
    assert main(["tune", "--show", str(here)]) == 0
    assert re.search(r"^all_reduce +n=4 +cpu +recursive_doubling up to 1\.00 KiB, ", capsys.readouterr().out, re.MULTILINE)
    there = write_table(synthetic_table(machine=replace(machine_here(), torch_version="2.5.1")),
                        tmp_path / "there.json")
    assert main(["tune", "--show", str(there)]) == 2
    err = capsys.readouterr().err
    assert "was measured on another machine (torch 2.5.1 there" in err and "--force" in err
    assert main(["tune", "--show", str(there), "--force"]) == 0
    assert "warning" in capsys.readouterr().err
