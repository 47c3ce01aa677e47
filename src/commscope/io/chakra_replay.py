"""Replay Chakra execution traces of all ranks: a small discrete-event simulator with Chakra's semantics.

It reads the traces with Chakra's own reader (``protolib``, ``et_def_pb2``) and runs them as ASTRA-sim's workload
layer does (astra-sim 518bd513, ``workload/Workload.cc`` and ``HardwareResource.cc``, with Chakra's FeederV3):

- a node is issued when every node of its ``data_deps`` and ``ctrl_deps`` has finished;
- each rank computes one ``COMP_NODE`` at a time, for its ``duration_micros`` (0: 1 ns, as ASTRA-sim), and runs one
  collective or send at a time (``max_comm_in_flight``; None lifts the limit); a receive occupies nothing. Among
  the nodes ready for a free resource the one with the lowest id goes first;
- a send is eager: it takes the bandwidth model's time and completes whether or not its receive was posted; a
  receive completes when the send with its (source, destination, tag) has delivered, the k-th send of a key
  matching the k-th receive (sizes must agree);
- a collective needs every member of its process group (``pg_name`` in ``comm_group.json``; empty or ``0``: all
  ranks): the k-th collective a rank issues on a group meets the k-th of every other member (ASTRA-sim's stream
  per communicator group), starts when the last member issues it and ends on all of them after the bandwidth
  model's time; members must agree on its type and size.

The iteration ends when every rank has finished every node. When no event is left and some rank has not, the
traces deadlock: :class:`ReplayResult` says which nodes each stuck rank waits in, and on what.
"""

from __future__ import annotations

import heapq
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commscope.errors import ConfigError

__all__ = ["CommTime", "ReplayResult", "TraceNodeRecord", "bandwidth_timer", "read_traces", "replay"]

#: Chakra's CollectiveCommType values (et_def.proto) -> commscope op names.
COLLECTIVES = {0: "all_reduce", 1: "reduce", 2: "all_gather", 3: "gather", 4: "scatter", 5: "broadcast",
               6: "all_to_all", 7: "reduce_scatter", 8: "reduce_scatter", 9: "barrier"}
#: What ASTRA-sim runs a compute node of ``duration_micros = 0`` for: 1 ns (Workload::issue_replay).
ZERO_DURATION_S = 1e-9

CommTime = Callable[[str, int, tuple[int, ...]], float]
"""Seconds of one op: (op name, size in bytes, group; for a send (source, destination))."""

_COMP, _SEND, _RECV, _COLL, _OTHER = range(5)
_COMM_ATTRS = frozenset({"comm_type", "comm_size", "comm_src", "comm_dst", "comm_tag", "pg_name"})


@dataclass(frozen=True, slots=True)
class TraceNodeRecord:
    """What the replay needs of one node."""

    id: int
    name: str
    kind: int
    deps: tuple[int, ...]
    duration_s: float = 0.0
    op: str = ""
    size_bytes: int = 0
    src: int = -1
    dst: int = -1
    tag: int = 0
    pg_name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplayResult:
    """The replayed iteration."""

    finished: bool
    """Every rank finished every node."""
    iteration_time_s: float
    """When the last rank finished (when the last event happened, if they deadlocked)."""
    rank_time_s: tuple[float, ...]
    """When each rank finished its last node (nan where it did not)."""
    compute_s: tuple[float, ...]
    """Seconds each rank computed."""
    num_nodes: int
    blocked: tuple[str, ...] = ()
    """One line per stuck rank: the nodes it waits in, and on what (empty when finished)."""
    problems: tuple[str, ...] = ()
    """Mismatches a simulator would hang on or misread: members disagreeing on a collective's type or size, a
    receive whose send has another size."""

    @property
    def exposed_comm_s(self) -> tuple[float, ...]:
        """Per rank, the time it did not compute: exposed communication and waiting (the bubble included)."""
        return tuple(t - c for t, c in zip(self.rank_time_s, self.compute_s))


def _value(attr: Any) -> Any:
    return getattr(attr, attr.WhichOneof("value"))


def read_traces(directory: str | Path, prefix: str = "commscope", *,
                roofline: tuple[float, float] | None = None) -> tuple[list[list[TraceNodeRecord]], dict[str, tuple[int, ...]]]:
    """Every rank's nodes (rank order, ``<prefix>.<rank>.et`` from 0 on) and the process groups, read with Chakra's
    own reader. ``roofline`` (peak FLOP/s, memory bytes/s): compute nodes take ASTRA-sim's roofline time,
    ``num_ops / min(bandwidth x num_ops / tensor_size, peak)`` (0 for a node without ``tensor_size``, which ASTRA-sim
    skips), instead of their ``duration_micros``. Raises ConfigError for a directory without traces or a file that is
    not a Chakra trace."""
    try:
        from chakra.schema.protobuf import et_def_pb2 as et
        from chakra.src.third_party.utils.protolib import decodeMessage, openFileRd
    except ImportError:
        raise ConfigError("target", "chakra", "replaying traces needs mlc-chakra: pip install mlc-chakra "
                                              "(or commscope[chakra])") from None
    directory = Path(directory)
    ranks: list[Path] = []
    while (directory / f"{prefix}.{len(ranks)}.et").is_file():
        ranks.append(directory / f"{prefix}.{len(ranks)}.et")
    if not ranks:
        raise ConfigError("traces", str(directory), f"holds no {prefix}.0.et: give the directory `export chakra` wrote")
    group_file = directory / "comm_group.json"
    groups = {}
    if group_file.is_file():
        groups = {str(k): tuple(int(r) for r in v) for k, v in json.loads(group_file.read_text()).items()}
    kinds = {et.COMP_NODE: _COMP, et.COMM_SEND_NODE: _SEND, et.COMM_RECV_NODE: _RECV, et.COMM_COLL_NODE: _COLL}
    out = []
    for rank, path in enumerate(ranks):
        fh = openFileRd(str(path))
        try:
            meta = et.GlobalMetadata()
            if not decodeMessage(fh, meta):
                raise ConfigError("traces", str(path), "holds no Chakra GlobalMetadata: not a Chakra trace")
            nodes = []
            node = et.Node()
            while decodeMessage(fh, node):
                kind = kinds.get(node.type, _OTHER)
                deps = tuple(dict.fromkeys([*node.data_deps, *node.ctrl_deps]))
                if kind != _COMP:  # (a compute node's attributes are for a roofline; the replay uses its duration)
                    a = {x.name: _value(x) for x in node.attr if x.name in _COMM_ATTRS}
                    nodes.append(TraceNodeRecord(
                        id=int(node.id), name=node.name, kind=kind, deps=deps,
                        op=("send" if kind in (_SEND, _RECV) else COLLECTIVES.get(int(a.get("comm_type", 0)), "all_reduce")),
                        size_bytes=int(a.get("comm_size", 0)), src=int(a.get("comm_src", -1)),
                        dst=int(a.get("comm_dst", -1)), tag=int(a.get("comm_tag", 0)), pg_name=str(a.get("pg_name", ""))))
                else:
                    if roofline is None:
                        duration_s = node.duration_micros * 1e-6 if node.duration_micros else ZERO_DURATION_S
                    else:
                        a = {x.name: _value(x) for x in node.attr if x.name in ("num_ops", "tensor_size")}
                        duration_s = _roofline_s(float(a.get("num_ops", 0)), float(a.get("tensor_size", 0)), *roofline)
                    nodes.append(TraceNodeRecord(id=int(node.id), name=node.name, kind=kind, deps=deps,
                                                 duration_s=duration_s))
                node = et.Node()
        finally:
            fh.close()
        out.append(nodes)
    return out, groups


def _roofline_s(num_ops: float, tensor_size: float, peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """ASTRA-sim's Roofline::get_perf and Workload::issue_comp: FLOP over min(bandwidth x intensity, peak)."""
    if tensor_size <= 0 or num_ops <= 0:
        return 0.0
    return num_ops / min(bandwidth_bytes_per_s * num_ops / tensor_size, peak_flops)


def bandwidth_timer(cluster: Any, bandwidth: Any = None) -> CommTime:
    """Op times from commscope's bandwidth model (the cluster's alpha-beta tiers, or a measured table), each group
    timed where its members sit, as the estimate times them."""
    from commscope.estimate.bandwidth import AlphaBeta, GroupSpan

    bw = bandwidth if bandwidth is not None else AlphaBeta(cluster)
    gpn = cluster.gpus_per_node
    cache: dict[tuple[str, int, GroupSpan], float] = {}
    spans: dict[tuple[int, ...], GroupSpan] = {}

    def time_s(op: str, size_bytes: int, group: tuple[int, ...]) -> float:
        span = spans.get(group)
        if span is None:
            span = spans[group] = GroupSpan.of(group, gpn)
        key = (op, size_bytes, span)
        if key not in cache:
            cache[key] = float(bw.op_time_s(op, size_bytes, span))
        return cache[key]
    return time_s


class _Sim:
    def __init__(self, ranks: list[list[TraceNodeRecord]], groups: dict[str, tuple[int, ...]], comm_time_s: CommTime,
                 max_comm_in_flight: int | None) -> None:
        self.ranks, self.groups, self.time_of = ranks, groups, comm_time_s
        self.limit = max_comm_in_flight
        world = len(ranks)
        self.everyone = tuple(range(world))
        self.index: list[dict[int, int]] = [{n.id: i for i, n in enumerate(nodes)} for nodes in ranks]
        self.children: list[list[list[int]]] = [[[] for _ in nodes] for nodes in ranks]
        self.waiting: list[list[int]] = []
        self.problems: list[str] = []
        for r, nodes in enumerate(ranks):
            count = []
            for i, n in enumerate(nodes):
                parents = [self.index[r][d] for d in n.deps if d in self.index[r]]
                missing = [d for d in n.deps if d not in self.index[r]]
                if missing:
                    self.problems.append(f"rank {r} node {n.id} ({n.name}) depends on node(s) {missing[:3]} the trace "
                                         "does not have: it can never run")
                count.append(len(parents) + len(missing))
                for p in parents:
                    self.children[r][p].append(i)
            self.waiting.append(count)
        self.now = 0.0
        self.events: list[tuple[float, int, int, int]] = []  # (time, seq, rank, node position): a node finishes
        self.seq = 0
        self.comp_ready: list[list[int]] = [[] for _ in ranks]
        self.comm_ready: list[list[int]] = [[] for _ in ranks]
        self.comp_busy = [False] * world
        self.comm_busy = [0] * world
        self.done = [0] * world
        self.finish_s = [float("nan")] * world
        self.compute_s = [0.0] * world
        self.issued: list[set[int]] = [set() for _ in ranks]
        self.arrived: dict[tuple[int, int, int], deque[tuple[float, int]]] = {}  # (src, dst, tag) -> (time, size)
        self.posted: dict[tuple[int, int, int], deque[tuple[int, int]]] = {}  # (src, dst, tag) -> (rank, node)
        self.coll_seq: list[dict[str, int]] = [{} for _ in ranks]
        self.colls: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (pg, k) -> members arrived (rank, node)

    def finish_at(self, t: float, rank: int, i: int) -> None:
        heapq.heappush(self.events, (t, self.seq, rank, i))
        self.seq += 1

    def ready(self, rank: int, i: int) -> None:
        n = self.ranks[rank][i]
        if n.kind == _COMP:
            heapq.heappush(self.comp_ready[rank], n.id)
        elif n.kind in (_SEND, _COLL):
            heapq.heappush(self.comm_ready[rank], n.id)
        elif n.kind == _RECV:
            self.issued[rank].add(i)
            key = (n.src, rank, n.tag)
            if n.dst != rank:
                self.problems.append(f"rank {rank} node {n.id} ({n.name}): a receive with comm_dst={n.dst}")
            q = self.arrived.get(key)
            if q:
                t_arrival, size = q.popleft()
                self._check_size(rank, n, size)
                self.finish_at(max(self.now, t_arrival), rank, i)
            else:
                self.posted.setdefault(key, deque()).append((rank, i))
        else:
            self.finish_at(self.now, rank, i)

    def _check_size(self, rank: int, n: TraceNodeRecord, size: int) -> None:
        if size != n.size_bytes:
            self.problems.append(f"rank {rank} node {n.id} ({n.name}) receives {n.size_bytes} B from rank {n.src}, whose "
                                 f"send has {size} B: a simulator matching by size never completes it")

    def issue(self, rank: int) -> None:
        nodes, pos = self.ranks[rank], self.index[rank]
        while not self.comp_busy[rank] and self.comp_ready[rank]:
            i = pos[heapq.heappop(self.comp_ready[rank])]
            self.comp_busy[rank] = True
            self.issued[rank].add(i)
            self.compute_s[rank] += nodes[i].duration_s
            self.finish_at(self.now + nodes[i].duration_s, rank, i)
        while (self.limit is None or self.comm_busy[rank] < self.limit) and self.comm_ready[rank]:
            i = pos[heapq.heappop(self.comm_ready[rank])]
            self.comm_busy[rank] += 1
            self.issued[rank].add(i)
            n = nodes[i]
            if n.kind == _SEND:
                if n.src != rank:
                    self.problems.append(f"rank {rank} node {n.id} ({n.name}): a send with comm_src={n.src}")
                end = self.now + self.time_of("send", n.size_bytes, (rank, n.dst))
                self.finish_at(end, rank, i)
                key = (rank, n.dst, n.tag)
                q = self.posted.get(key)
                if q:
                    r2, i2 = q.popleft()
                    self._check_size(r2, self.ranks[r2][i2], n.size_bytes)
                    self.finish_at(end, r2, i2)
                else:
                    self.arrived.setdefault(key, deque()).append((end, n.size_bytes))
            else:
                self.join(rank, i)

    def join(self, rank: int, i: int) -> None:
        n = self.ranks[rank][i]
        pg = n.pg_name if n.pg_name not in ("", "0") else ""
        group = self.groups.get(pg, self.everyone) if pg else self.everyone
        if pg and pg not in self.groups:
            self.problems.append(f"rank {rank} node {n.id} ({n.name}): pg_name {pg!r} is not in comm_group.json")
        k = self.coll_seq[rank].get(pg, 0)
        self.coll_seq[rank][pg] = k + 1
        members = self.colls.setdefault((pg, k), [])
        members.append((rank, i))
        if len(members) < len(group):
            return
        del self.colls[(pg, k)]
        kinds = {(self.ranks[r][j].op, self.ranks[r][j].size_bytes) for r, j in members}
        if len(kinds) > 1:
            self.problems.append(f"collective {k} of group {pg or 'all'} ({n.name}): members disagree on type and size "
                                 f"{sorted(kinds)}")
        size = max(s for _, s in kinds)
        end = self.now + self.time_of(n.op, size, group)
        for r, j in members:
            self.finish_at(end, r, j)

    def run(self) -> ReplayResult:
        for r, nodes in enumerate(self.ranks):
            for i in range(len(nodes)):
                if self.waiting[r][i] == 0:
                    self.ready(r, i)
            self.issue(r)
        while self.events:
            t, _, rank, i = heapq.heappop(self.events)
            self.now = t
            n = self.ranks[rank][i]
            if n.kind == _COMP:
                self.comp_busy[rank] = False
            elif n.kind in (_SEND, _COLL):
                self.comm_busy[rank] -= 1
            self.issued[rank].discard(i)
            self.done[rank] += 1
            if self.done[rank] == len(self.ranks[rank]):
                self.finish_s[rank] = t
            for c in self.children[rank][i]:
                self.waiting[rank][c] -= 1
                if self.waiting[rank][c] == 0:
                    self.ready(rank, c)
            self.issue(rank)
        finished = all(d == len(nodes) for d, nodes in zip(self.done, self.ranks))
        return ReplayResult(finished=finished, iteration_time_s=self.now if not finished else max(self.finish_s, default=0.0),
                            rank_time_s=tuple(self.finish_s), compute_s=tuple(self.compute_s),
                            num_nodes=sum(len(n) for n in self.ranks), blocked=tuple(self.stuck()),
                            problems=tuple(dict.fromkeys(self.problems)))

    def stuck(self) -> list[str]:
        out = []
        for r, nodes in enumerate(self.ranks):
            if self.done[r] == len(nodes):
                continue
            waits = []
            for i in sorted(self.issued[r])[:3]:
                n = nodes[i]
                if n.kind == _RECV:
                    waits.append(f"node {n.id} {n.name} waits for rank {n.src}'s send (tag {n.tag})")
                elif n.kind == _COLL:
                    pg = n.pg_name if n.pg_name not in ("", "0") else ""
                    group = self.groups.get(pg, self.everyone) if pg else self.everyone
                    there = {m for (g, _), ms in self.colls.items() if g == pg for m, _ in ms}
                    missing = [m for m in group if m not in there]
                    waits.append(f"node {n.id} {n.name} waits for rank(s) {missing[:8]} of group {pg or 'all'}")
            if not waits:
                first = next(i for i, w in enumerate(self.waiting[r]) if w > 0)
                waits.append(f"node {nodes[first].id} {nodes[first].name} waits for its dependencies")
            out.append(f"rank {r} ({self.done[r]} of {len(nodes)} nodes done): " + "; ".join(waits))
        return out


def replay(traces: str | Path | tuple[list[list[TraceNodeRecord]], dict[str, tuple[int, ...]]], comm_time_s: CommTime, *,
           prefix: str = "commscope", max_comm_in_flight: int | None = 1,
           roofline: tuple[float, float] | None = None) -> ReplayResult:
    """Replay the traces in directory ``traces`` (or what :func:`read_traces` returned) with op times from
    ``comm_time_s`` (:func:`bandwidth_timer`); see the module docstring (``roofline``: :func:`read_traces`)."""
    ranks, groups = read_traces(traces, prefix, roofline=roofline) if isinstance(traces, (str, Path)) else traces
    if max_comm_in_flight is not None and max_comm_in_flight < 1:
        raise ConfigError("max_comm_in_flight", max_comm_in_flight, "must be >= 1, or None for no limit")
    return _Sim(ranks, groups, comm_time_s, max_comm_in_flight).run()
