"""A predicted iteration as Chakra execution traces, one per rank, for ASTRA-sim and other Chakra simulators.

Chakra (MLCommons; ``pip install mlc-chakra``, the optional extra ``chakra``) describes a workload as a graph of
nodes per rank in its protobuf schema (``chakra/schema/protobuf/et_def.proto``); a file is a length-prefixed stream:
one ``GlobalMetadata`` message, then the nodes (Chakra's ``protolib``). What :func:`write_chakra` writes into
``out`` for a :class:`~commscope.api.Prediction` and its :class:`~commscope.estimate.Estimate`:

- ``<prefix>.<rank>.et`` for every rank (ASTRA-sim's naming): the rank's program of one iteration
  (:mod:`commscope.io.chakra_trace`: the estimate's pipeline schedule, its overlap of communication with compute,
  every op of the op list ``count`` expanded);
- ``comm_group.json``: every process group's global ranks by ``pg_name`` (ASTRA-sim's
  ``--comm-group-configuration``; names from 1, as ASTRA-sim reads ``0`` as all ranks).

Nodes, with the attribute types Chakra's feeders read (the V1 feeder reads each from one field; FeederV3 converts):

- ``COMP_NODE``: ``duration_micros`` (the compute model's time, each rank's cumulative compute rounded to the
  microsecond so that no rounding adds up along a rank), ``num_ops`` (int64: FLOP), ``tensor_size`` (uint64: HBM
  bytes), both >= 1 so that a roofline (``num_ops / min(bandwidth x num_ops / tensor_size, peak)``) is defined, and
  ``commscope_kernel`` (``gemm``, ``attention``, ``memory_bound``, ``optimizer``), ``commscope_recompute``;
- ``COMM_COLL_NODE``: ``comm_type`` (int64, a ``CollectiveCommType``), ``comm_size`` (int64 bytes, nccl-tests'
  convention, :mod:`commscope.commop`; an all-to-all carries its group's largest send buffer, the same on every
  member, as a simulator needs, and its own in ``commscope_send_bytes``), ``pg_name``;
- ``COMM_SEND_NODE`` / ``COMM_RECV_NODE``: ``comm_src``, ``comm_dst``, ``comm_tag`` (int32; a send and its receive
  share the tag, unique per message), ``comm_size``;
- every node ``is_cpu_op`` = false, and ``commscope_phase``, ``commscope_micro_batch``, ``commscope_layer``,
  ``commscope_chunk`` where known; comm nodes ``commscope_axis``, ``commscope_name`` and ``commscope_index`` (which
  of the op's ``count``).

``data_deps`` say what a node waits for, ``ctrl_deps`` the order of its stream (docs/chakra.md). ``out`` must hold no
earlier export (:func:`check_chakra_out`): a 4-rank export over an 8-rank one would leave ``.et`` files of ranks 4-7
beside a 4-rank ``comm_group.json``, and a simulator would read one job made of two. The prefix is a plain file name
stem, so that every file lands in ``out`` and none is hidden.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError
from commscope.io.atomic import OutputSet, named_error

__all__ = ["COMM_TYPES", "GROUP_FILE", "ChakraExport", "check_chakra_out", "check_prefix", "export_chakra", "write_chakra"]

#: The process groups of the traces, beside them in ``out`` (ASTRA-sim's ``--comm-group-configuration``).
GROUP_FILE = "comm_group.json"

#: commscope op -> Chakra ``CollectiveCommType`` value (et_def.proto).
COMM_TYPES: dict[str, int] = {"all_reduce": 0, "reduce": 1, "all_gather": 2, "gather": 3, "scatter": 4,
                              "broadcast": 5, "all_to_all": 6, "reduce_scatter": 7, "barrier": 9}
#: The schema version string Chakra's own converters write.
SCHEMA = "1.0.2-chakra.0.0.4"


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




@dataclass(frozen=True, slots=True, kw_only=True)
class ChakraExport:
    """What :func:`export_chakra` wrote."""

    paths: tuple[Path, ...]
    """The traces in rank order, then :data:`GROUP_FILE`."""
    num_nodes: tuple[int, ...]
    """Nodes of each rank's trace."""
    unplaced: tuple[str, ...]
    """Op instances (one line each, rank first) that no rule of :mod:`commscope.io.chakra_trace` placed: they run after
    the iteration's compute. Empty for every op Megatron-LM's and PyTorch's rules make."""
    scale: tuple[tuple[float, float], ...]
    """Per stage, what brought the kernels' sums to the compute model's totals (1 while they agree)."""


def write_chakra(prediction: Any, estimate: Any, out: str | Path, *, prefix: str = "commscope", gpu: Any = None,
                 bandwidth: Any = None, comm_streams: int = 1) -> list[Path]:
    """Write one Chakra ET file per rank and ``comm_group.json`` into ``out``; returns the paths written (traces, then
    the group file). See :func:`export_chakra`."""
    return list(export_chakra(prediction, estimate, out, prefix=prefix, gpu=gpu, bandwidth=bandwidth,
                              comm_streams=comm_streams).paths)


def export_chakra(prediction: Any, estimate: Any, out: str | Path, *, prefix: str = "commscope", gpu: Any = None,
                  bandwidth: Any = None, comm_streams: int = 1, replace: bool = False) -> ChakraExport:
    """Write the traces of ``prediction`` (module docstring), compute timed as ``estimate`` was (``gpu``: the GPU
    :func:`commscope.estimate.estimate` was given, if any), its one communication chain per rank ordered with the
    op times of ``bandwidth`` (the estimate's bandwidth model; default the cluster's alpha-beta tiers);
    ``comm_streams`` 1 or 2 (:mod:`commscope.io.chakra_trace`). Raises ConfigError for a bad ``prefix`` or an
    ``out`` holding an earlier export (:func:`check_chakra_out`), unless ``replace`` (the caller said so: the earlier
    files of these names are replaced, the caller removes the others). The files are renamed into place together once
    every one is written (:class:`~commscope.io.atomic.OutputSet`): a full disk half-way leaves the earlier files or
    none, never the traces of some ranks, which a simulator would read as the job."""
    from commscope.io.chakra_compute import job_kernels
    from commscope.io.chakra_replay import bandwidth_timer
    from commscope.io.chakra_ops import TraceJob
    from commscope.io.chakra_trace import rank_program

    et, protolib = _require_chakra()
    if replace:
        check_prefix(prefix)
    else:
        check_chakra_out(out, prefix)
    if comm_streams not in (1, 2):
        raise ConfigError("comm_streams", comm_streams, "valid: 1 (one communication chain per rank), 2")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    par = prediction.parallel
    job = TraceJob(prediction=prediction, kernels=job_kernels(prediction, estimate, gpu), comm_streams=comm_streams,
                   comm_time_s=bandwidth_timer(prediction.cluster, bandwidth))
    groups: dict[tuple[int, ...], str] = {}
    paths, sizes, unplaced = [], [], []
    meta_attrs = [("schema", "string_val", SCHEMA), ("producer", "string_val", "commscope"),
                  ("world_size", "int64_val", par.world_size), ("model", "string_val", prediction.model.name),
                  ("iteration_time_s", "double_val", float(estimate.iteration_time_s)),
                  ("schedule", "string_val", job.schedule), ("num_micro_batches", "int64_val", par.num_micro_batches),
                  ("virtual_pipeline_size", "int64_val", par.virtual_pipeline_size),
                  ("compute_model", "string_val", estimate.compute_model), ("comm_streams", "int64_val", comm_streams)]
    with OutputSet(out) as staged:
        for rank in range(par.world_size):
            nodes, missed = rank_program(job, rank)
            unplaced += [f"rank {rank}: {op.axis} {op.op} {op.name} phase={op.phase} micro_batch={op.micro_batch} "
                         f"layer={op.layer} #{j}" for op, j in missed]
            path = out / f"{prefix}.{rank}.et"
            try:
                with open(staged.path(path.name), "wb") as fh:
                    meta = et.GlobalMetadata(version=SCHEMA, attr=[et.AttributeProto(name=n, **{k: v}) for n, k, v in
                                                                  [("rank", "int64_val", rank), *meta_attrs]])
                    protolib.encodeMessage(fh, meta)
                    for node in _encode(et, nodes, groups):
                        protolib.encodeMessage(fh, node)
            except OSError as exc:  # a full disk: the file the user asked for, not the temporary one
                raise named_error(exc, path) from None
            paths.append(path)
            sizes.append(len(nodes))
        group_file = out / GROUP_FILE
        staged.write_text(GROUP_FILE, json.dumps({name: list(g) for g, name in groups.items()}, indent=1) + "\n")
    return ChakraExport(paths=(*paths, group_file), num_nodes=tuple(sizes), unplaced=tuple(unplaced),
                        scale=tuple(k.scale for k in job.kernels))


def _encode(et: Any, nodes: list[Any], groups: dict[tuple[int, ...], str]) -> Any:
    """The protobuf nodes of one rank's program (module docstring); ``groups`` names every process group met."""
    attr = et.AttributeProto
    exact_us = 0.0  # the rank's compute so far, exact: each node takes the microseconds its rounding adds
    for n in nodes:
        node = et.Node(id=n.id, name=n.name, data_deps=n.data_deps, ctrl_deps=n.ctrl_deps)
        attrs = [attr(name="is_cpu_op", bool_val=False)]
        if n.phase:
            attrs.append(attr(name="commscope_phase", string_val=n.phase))
        for key, value in (("commscope_micro_batch", n.micro_batch), ("commscope_layer", n.layer),
                           ("commscope_chunk", n.chunk)):
            if value is not None:
                attrs.append(attr(name=key, int64_val=value))
        if n.type == "comp":
            k = n.kernel
            node.type = et.COMP_NODE
            before = round(exact_us)
            exact_us += k.time_s * 1e6
            node.duration_micros = round(exact_us) - before
            attrs += [attr(name="num_ops", int64_val=max(1, round(k.flop))),
                      attr(name="tensor_size", uint64_val=max(1, round(k.hbm_bytes))),
                      attr(name="commscope_kernel", string_val=k.kernel)]
            if n.recompute:
                attrs.append(attr(name="commscope_recompute", bool_val=True))
        else:
            op = n.op
            attrs += [attr(name="comm_size", int64_val=n.comm_size), attr(name="commscope_axis", string_val=op.axis),
                      attr(name="commscope_name", string_val=op.name), attr(name="commscope_index", int64_val=n.index),
                      attr(name="commscope_dtype", string_val=op.dtype)]
            if n.type in ("send", "recv"):
                src, dst = (op.rank, op.peer) if n.type == "send" else (op.peer, op.rank)
                node.type = et.COMM_SEND_NODE if n.type == "send" else et.COMM_RECV_NODE
                attrs += [attr(name="comm_src", int32_val=src), attr(name="comm_dst", int32_val=dst),
                          attr(name="comm_tag", int32_val=n.tag)]
            else:
                node.type = et.COMM_COLL_NODE
                group = tuple(op.group)
                attrs += [attr(name="comm_type", int64_val=COMM_TYPES[op.op]),
                          attr(name="pg_name", string_val=groups.setdefault(group, str(len(groups) + 1)))]
                if op.op == "all_to_all":
                    attrs.append(attr(name="commscope_send_bytes", int64_val=op.size_bytes))
        node.attr.extend(attrs)
        yield node
