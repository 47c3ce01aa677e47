"""A predicted iteration as Chakra execution traces, one per rank, for ASTRA-sim.

Chakra (MLCommons; ``pip install mlc-chakra``, the optional extra ``chakra``) describes a workload as a graph of
nodes per rank in its protobuf schema (``chakra/schema/protobuf/et_def.proto``): compute nodes (``COMP_NODE``
with ``duration_micros``), collectives (``COMM_COLL_NODE`` with the attributes ``comm_type``, a
``CollectiveCommType``, ``comm_size`` in bytes and ``pg_name``), and point-to-point transfers
(``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with ``comm_src``, ``comm_dst``, ``comm_tag``, ``comm_size``). A file
is a length-prefixed stream: one ``GlobalMetadata`` message, then the nodes (Chakra's ``protolib``).

What :func:`write_chakra` writes into ``out``, for a :class:`~commscope.api.Prediction` and its
:class:`~commscope.estimate.Estimate`:

- ``<prefix>.<rank>.et`` for every rank (ASTRA-sim's naming): the rank's ops of one iteration in a valid
  execution order, each node depending on the one before it (``data_deps``), so the graph is a chain;
- ``comm_group.json``: every process group's global ranks by ``pg_name`` (ASTRA-sim's
  ``--comm-group-configuration``).

``out`` must hold no earlier export (:func:`check_chakra_out`): a 4-rank export over an 8-rank one would leave
``.et`` files of ranks 4-7 beside a 4-rank ``comm_group.json``, and a simulator would read one job made of two.
The prefix is a plain file name stem, so that every file lands in ``out`` and none is hidden.

Order per rank: GPipe's order (the forward of every micro-batch, then the backward of every micro-batch), a
valid order for every pipeline schedule: a forward receives its activation, runs each layer of the stage (a
compute node, then the layer's TP / CP / EP collectives), then sends; a backward does the same in reverse
layer order; the optimizer phase runs the DP / embedding collectives, then the optimizer step. 1F1B or
interleaved schedules reorder these blocks; that order is left to the simulator's scheduling.

Compute durations come from the estimate: the critical stage's compute per iteration (without the optimizer step)
split evenly over micro-batches and the stage's layers, forward : backward = 1 : 2 (Megatron's FLOP ratio;
recomputation is added to the backward), and ``optimizer_s`` for the optimizer step. Sizes are commscope's
(nccl-tests' convention, see :mod:`commscope.record`); each comm node also carries ``commscope_axis``,
``commscope_phase`` and, where known, ``commscope_micro_batch`` and ``commscope_layer``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.io.atomic import atomic_open, write_text
from commscope.record import CommOp

__all__ = ["COMM_TYPES", "GROUP_FILE", "ChakraOp", "check_chakra_out", "check_prefix", "rank_schedule", "write_chakra"]

#: The process groups of the traces, beside them in ``out`` (ASTRA-sim's ``--comm-group-configuration``).
GROUP_FILE = "comm_group.json"

#: commscope op -> Chakra ``CollectiveCommType`` value (et_def.proto).
COMM_TYPES: dict[str, int] = {"all_reduce": 0, "reduce": 1, "all_gather": 2, "gather": 3, "scatter": 4,
                              "broadcast": 5, "all_to_all": 6, "reduce_scatter": 7, "barrier": 9}
#: The schema version string Chakra's own converters write.
SCHEMA = "1.0.2-chakra.0.0.4"
_PHASES = ("fwd", "bwd", "optim")


@dataclass(frozen=True, slots=True)
class ChakraOp:
    """One node of a rank's trace before encoding: a compute step (``op`` None) or a CommOp."""

    name: str
    duration_us: int = 0
    op: CommOp | None = None


def check_prefix(prefix: str) -> None:
    """Refuse a ``prefix`` that is not a plain file name stem: empty or starting with a dot (hidden files
    ``.0.et``), or holding a path separator or ``..`` (files outside ``out``)."""
    if not prefix or prefix.startswith(".") or any(bad in prefix for bad in ("/", "\\", "..", "\0")):
        raise ConfigError("prefix", prefix, "must be a plain file name stem: not empty, no '/', '\\' or '..', not "
                                            "starting with '.' (e.g. commscope, for commscope.0.et ...)")


def check_chakra_out(out: str | Path, prefix: str) -> None:
    """Refuse, before any work, a bad ``prefix`` (:func:`check_prefix`) and an ``out`` that already holds Chakra
    traces (``*.et``) or :data:`GROUP_FILE` of an earlier export: the two would be read as one job."""
    check_prefix(prefix)
    out = Path(out)
    old = sorted(p for p in out.iterdir() if p.name == GROUP_FILE or p.suffix == ".et") if out.is_dir() else []
    if old:
        raise ConfigError("out", str(out), f"already holds export output ({old[0].name}, {len(old)} file(s)); choose "
                                           "a new directory or remove the old one (an export is never mixed with "
                                           "another)")


def _require_chakra() -> tuple[Any, Any]:
    try:
        from chakra.schema.protobuf import et_def_pb2
        from chakra.src.third_party.utils import protolib
    except ImportError:
        raise ImportError("mlc-chakra is not installed: pip install mlc-chakra (or commscope[chakra])") from None
    return et_def_pb2, protolib


def _ops_by_rank(prediction: Any) -> dict[int, list[CommOp]]:
    out: dict[int, list[CommOp]] = defaultdict(list)
    for op in prediction.workload.ops("full"):
        if op.op in ("send", "recv"):
            if op.rank is not None:
                out[op.rank].append(op)
        elif op.op == "all_to_all" and op.rank is not None:
            out[op.rank].append(op)
        else:
            for r in op.group:
                out[r].append(op)
    return out


def rank_schedule(prediction: Any, estimate: Any, rank: int, ops: list[CommOp]) -> Iterator[ChakraOp]:
    """The nodes of one rank in execution order (see the module docstring)."""
    m = prediction.parallel.num_micro_batches
    layers = sorted({op.layer for op in ops if op.layer is not None})
    stage_layers = max(1, len(layers))
    breakdown = estimate.compute_breakdown_s or {}
    recompute_s = float(breakdown.get("recompute_s", 0.0))
    base_s = max(0.0, estimate.compute_s - recompute_s)
    fwd_us = round(1e6 * base_s / 3 / m / stage_layers)
    bwd_us = round(1e6 * (2 * base_s / 3 + recompute_s) / m / stage_layers)
    blocks: dict[tuple[str, int | None], list[CommOp]] = defaultdict(list)
    for op in ops:
        blocks[(op.phase or "optim", op.micro_batch if op.phase in ("fwd", "bwd") else None)].append(op)

    def layer_key(op: CommOp) -> int:
        return -1 if op.layer is None else op.layer

    for phase in ("fwd", "bwd"):
        for mb in range(m):
            block = blocks.get((phase, mb), [])
            recvs = [op for op in block if op.op == "recv"]
            sends = [op for op in block if op.op == "send"]
            rest = [op for op in block if op.op not in ("send", "recv")]
            yield from (ChakraOp(name=_name(op), op=op) for op in recvs)
            order: list[int | None] = list(layers if phase == "fwd" else layers[::-1]) or [None]
            unlayered = [op for op in rest if op.layer is None]
            if phase == "fwd":
                yield from (ChakraOp(name=_name(op), op=op) for op in unlayered)
            for layer in order:
                yield ChakraOp(name=f"compute:{phase}:mb{mb}:layer{layer}", duration_us=fwd_us if phase == "fwd" else bwd_us)
                yield from (ChakraOp(name=_name(op), op=op) for op in rest if op.layer == layer and layer is not None)
            if phase == "bwd":
                yield from (ChakraOp(name=_name(op), op=op) for op in unlayered)
            yield from (ChakraOp(name=_name(op), op=op) for op in sends)
    for (phase, block_mb), block in sorted(blocks.items(), key=lambda kv: (
            _PHASES.index(kv[0][0]) if kv[0][0] in _PHASES else 3, kv[0][1] or 0)):
        if phase in ("fwd", "bwd") and block_mb is not None and block_mb < m:
            continue
        yield from (ChakraOp(name=_name(op), op=op) for op in sorted(block, key=layer_key))
    yield ChakraOp(name="compute:optimizer_step", duration_us=round(1e6 * estimate.optimizer_s))


def _name(op: CommOp) -> str:
    where = [p for p in (op.phase, None if op.micro_batch is None else f"mb{op.micro_batch}",
                         None if op.layer is None else f"layer{op.layer}", op.name or None) if p]
    return ":".join([op.axis, op.op, *where])


def write_chakra(prediction: Any, estimate: Any, out: str | Path, *, prefix: str = "commscope") -> list[Path]:
    """Write one Chakra ET file per rank and ``comm_group.json`` into ``out``; returns the paths written.
    Raises ConfigError for a bad ``prefix`` or an ``out`` holding an earlier export (:func:`check_chakra_out`)."""
    et, protolib = _require_chakra()
    check_chakra_out(out, prefix)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    by_rank = _ops_by_rank(prediction)
    world = prediction.parallel.world_size
    groups: dict[tuple[int, ...], str] = {}
    tags: dict[tuple[Any, ...], int] = {}

    def pg_name(group: tuple[int, ...]) -> str:
        return groups.setdefault(group, str(len(groups) + 1))

    def attr(name: str, **value: Any) -> Any:
        return et.AttributeProto(name=name, **value)

    paths = []
    for rank in range(world):
        path = out / f"{prefix}.{rank}.et"
        with atomic_open(path, "wb") as fh:
            meta = et.GlobalMetadata(version=SCHEMA, attr=[
                attr("schema", string_val=SCHEMA), attr("producer", string_val="commscope"),
                attr("rank", int64_val=rank), attr("world_size", int64_val=world),
                attr("model", string_val=prediction.model.name),
                attr("iteration_time_s", double_val=float(estimate.iteration_time_s))])
            protolib.encodeMessage(fh, meta)
            prev: int | None = None
            for node_id, item in enumerate(rank_schedule(prediction, estimate, rank, by_rank.get(rank, []))):
                node = et.Node(id=node_id, name=item.name)
                if prev is not None:
                    node.data_deps.append(prev)
                op = item.op
                if op is None:
                    node.type = et.COMP_NODE
                    node.duration_micros = item.duration_us
                    node.attr.append(attr("is_cpu_op", bool_val=False))
                else:
                    node.attr.extend([attr("is_cpu_op", bool_val=False), attr("comm_size", int64_val=op.size_bytes),
                                      attr("commscope_axis", string_val=op.axis),
                                      attr("commscope_phase", string_val=op.phase or "")])
                    if op.micro_batch is not None:
                        node.attr.append(attr("commscope_micro_batch", int64_val=op.micro_batch))
                    if op.layer is not None:
                        node.attr.append(attr("commscope_layer", int64_val=op.layer))
                    if op.op in ("send", "recv"):
                        src, dst = (op.rank, op.peer) if op.op == "send" else (op.peer, op.rank)
                        key = (src, dst, op.phase or "", op.micro_batch, op.name, op.layer)
                        tag = tags.setdefault(key, len(tags))  # the send and its recv share the tag
                        node.type = et.COMM_SEND_NODE if op.op == "send" else et.COMM_RECV_NODE
                        node.attr.extend([attr("comm_src", int64_val=src), attr("comm_dst", int64_val=dst),
                                          attr("comm_tag", int64_val=tag)])
                    else:
                        node.type = et.COMM_COLL_NODE
                        node.attr.extend([attr("comm_type", int64_val=COMM_TYPES[op.op]),
                                          attr("pg_name", string_val=pg_name(tuple(op.group)))])
                protolib.encodeMessage(fh, node)
                prev = node_id
        paths.append(path)
    group_file = out / GROUP_FILE
    write_text(group_file, json.dumps({name: list(g) for g, name in groups.items()}, indent=1) + "\n")
    return [*paths, group_file]
