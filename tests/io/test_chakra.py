"""Prediction -> Chakra execution traces -> Chakra's own reader -> the same ops and sizes (issue 16 item 5)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("chakra.schema.protobuf.et_def_pb2", reason="needs the chakra extra: pip install -e \".[chakra]\"")
from chakra.schema.protobuf.et_def_pb2 import (
    COMM_COLL_NODE,
    COMM_RECV_NODE,
    COMM_SEND_NODE,
    COMP_NODE,
    GlobalMetadata,
    Node,
)
from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd

from commscope.api import predict
from commscope.cli.main import main
from commscope.estimate import estimate
from commscope.io.chakra import COMM_TYPES, write_chakra
from commscope.presets import cluster_preset, model_preset
from commscope.spec.parallel import ParallelSpec


def _read(path):
    """Every message of an ET file, read as Chakra's jsonizer reads it."""
    fh = openFileRd(str(path))
    meta = GlobalMetadata()
    assert decodeMessage(fh, meta)
    nodes = []
    node = Node()
    while decodeMessage(fh, node):
        nodes.append(node)
        node = Node()
    fh.close()
    return meta, nodes


def _attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


@pytest.fixture(scope="module")
def job():
    parallel = ParallelSpec(tp=2, pp=2, dp=2, global_batch_size=16, micro_batch_size=2)
    pred = predict(model_preset("gpt-1.5b"), parallel, cluster_preset("dgx1-v100"))
    return pred, estimate(pred)


def test_round_trip_through_chakras_reader(tmp_path, job):
    pred, est = job
    paths = write_chakra(pred, est, tmp_path)
    groups = {k: tuple(v) for k, v in json.loads((tmp_path / "comm_group.json").read_text()).items()}
    inv = {v: k for k, v in {op: code for op, code in COMM_TYPES.items()}.items()}
    sends, recvs = Counter(), Counter()
    for rank in range(pred.parallel.world_size):
        meta, nodes = _read(tmp_path / f"commscope.{rank}.et")
        assert {a.name: getattr(a, a.WhichOneof("value")) for a in meta.attr}["rank"] == rank
        # the rank's predicted ops: collectives it is a member of, its own sends and recvs
        expected = Counter()
        for op in pred.workload.ops("full"):
            if op.op in ("send", "recv"):
                if op.rank == rank:
                    expected[(op.op, op.size_bytes, ())] += 1
            elif rank in op.group:
                expected[(op.op, op.size_bytes, tuple(op.group))] += 1
        got = Counter()
        for k, node in enumerate(nodes):
            assert node.id == k and (k == 0 or list(node.data_deps) == [k - 1])  # a chain in execution order
            a = _attrs(node)
            if node.type == COMM_COLL_NODE:
                got[(inv[a["comm_type"]], a["comm_size"], groups[a["pg_name"]])] += 1
                assert rank in groups[a["pg_name"]]
            elif node.type in (COMM_SEND_NODE, COMM_RECV_NODE):
                kind = "send" if node.type == COMM_SEND_NODE else "recv"
                got[(kind, a["comm_size"], ())] += 1
                assert (a["comm_src"] if kind == "send" else a["comm_dst"]) == rank
                (sends if kind == "send" else recvs)[(a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"])] += 1
            else:
                assert node.type == COMP_NODE
        assert got == expected
    assert sends == recvs and sends  # every send has the recv with the same tag on its peer
    assert len(paths) == pred.parallel.world_size + 1


def test_compute_nodes_carry_the_estimate(tmp_path, job):
    pred, est = job
    write_chakra(pred, est, tmp_path)
    _, nodes = _read(tmp_path / "commscope.0.et")
    comp = [n for n in nodes if n.type == COMP_NODE]
    total_s = sum(n.duration_micros for n in comp) / 1e6
    assert total_s == pytest.approx(est.compute_s + est.optimizer_s, rel=1e-3)
    names = [n.name for n in nodes]
    # forward of micro-batch 0 before its backward; the optimizer step last
    assert names.index("compute:fwd:mb0:layer0") < names.index("compute:bwd:mb0:layer0")
    assert names[-1] == "compute:optimizer_step"


def test_export_cli(tmp_path, capsys):
    code = main(["export", "chakra", "--model", "gpt-1.5b", "--tp", "2", "--pp", "1", "--dp", "2",
                 "--global-batch-size", "8", "--micro-batch-size", "2", "--cluster", "dgx1-v100",
                 "--out", str(tmp_path / "et")])
    assert code == 0 and "wrote 4 Chakra execution traces" in capsys.readouterr().out
    _, nodes = _read(tmp_path / "et" / "commscope.3.et")
    assert any(n.type == COMM_COLL_NODE for n in nodes)


_JOB = ["--model", "gpt-1.5b", "--global-batch-size", "8", "--micro-batch-size", "2", "--cluster", "dgx1-v100"]


def test_an_export_is_never_mixed_with_an_earlier_one(tmp_path, capsys):
    """A 4-rank export into the folder of an 8-rank one once left commscope.4-7.et beside a 4-rank comm_group.json."""
    out = tmp_path / "et"
    assert main(["export", "chakra", *_JOB, "--tp", "2", "--pp", "2", "--dp", "2", "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    for prefix in ("commscope", "other"):  # another prefix would still replace comm_group.json
        assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "4", "--out", str(out),
                     "--prefix", prefix]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert f"out='{out}': already holds an export of an earlier run (comm_group.json, commscope.0.et" in err
        assert "give --force to replace it, or choose another directory" in err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    (out / "comm_group.json").unlink()  # the traces alone are an export too
    assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "4", "--out", str(out)]) == 2
    assert "already holds an export of an earlier run (commscope.0.et, commscope.1.et" in capsys.readouterr().err
    # --force: the earlier export is removed whole, never a 4-rank export beside 8-rank traces
    assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "4", "--out", str(out), "--force"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["comm_group.json", *(f"commscope.{r}.et" for r in range(4))]


def test_write_chakra_refuses_an_earlier_export(tmp_path):
    model, cluster = model_preset("gpt-1.5b"), cluster_preset("dgx1-v100")
    pred = predict(model, ParallelSpec(tp=1, pp=1, dp=2, global_batch_size=8, micro_batch_size=2), cluster)
    est = estimate(pred)
    write_chakra(pred, est, tmp_path)
    with pytest.raises(ValueError, match="already holds export output"):
        write_chakra(pred, est, tmp_path)


def test_export_out_is_checked_before_any_work(tmp_path, capsys):
    (tmp_path / "file.txt").write_text("x")
    assert main(["export", "chakra", *_JOB, "--out", str(tmp_path / "file.txt" / "et")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("prefix", ["../escaped", "", ".hidden", "sub/name", "a..b", "..", "/abs"])
def test_a_prefix_that_is_not_a_file_name_is_refused(tmp_path, capsys, prefix):
    """--prefix ../escaped once wrote escaped.0.et beside --out, and --prefix '' hidden .0.et files in it."""
    out = tmp_path / "sub" / "et"
    assert main(["export", "chakra", *_JOB, "--tp", "1", "--pp", "1", "--dp", "2", "--out", str(out),
                 "--prefix", prefix]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"prefix={prefix!r}: must be a plain file name stem" in err
    assert not any(tmp_path.rglob("*.et")) and not out.exists()
