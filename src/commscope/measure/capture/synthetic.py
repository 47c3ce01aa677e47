"""Synthetic recordings of any size: the per-rank logs a 3D-parallel job would leave, written line by line by the
recorder's own writer (:func:`commscope.measure.capture.recorder._line`, the header and step lines of
:class:`~commscope.measure.capture.recorder.RankLog`), for benchmarks and tests of the readers at the scale users run.

Each step of each rank: per micro-batch, a tensor-parallel all-reduce per layer forward and backward, the
pipeline's activation and gradient send/recv with the neighbouring stages, then the data-parallel gradient
reduce-scatter and parameter all-gather; every member of a group records the group's collectives, with times
and sequence numbers as a process group stamps them.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import IO

from commscope.measure.capture.recorder import _line
from commscope.io.oplog import HEADER_KEY, STEP_KEY

__all__ = ["synthetic_parallel", "write_synthetic_rank"]

_MICRO_BATCHES = 4
_TP_BYTES = 8 << 20
_PP_BYTES = 4 << 20
_DP_BYTES = 64 << 20


def synthetic_parallel(ranks: int) -> tuple[int, int, int]:
    """(tp, pp, dp) of the synthetic job on ``ranks`` ranks: tp 8 and pp 8 where they divide, dp the rest."""
    tp = 8 if ranks % 8 == 0 else 1
    pp = 8 if (ranks // tp) % 8 == 0 else (2 if (ranks // tp) % 2 == 0 else 1)
    return tp, pp, ranks // (tp * pp)


def write_synthetic_rank(logdir: str | Path, rank: int, ranks: int, ops_per_rank: int, *, gz: bool = True,
                         layers: int = 4, steps: int | None = None) -> Path:
    """Write rank ``rank``'s log of the synthetic job (about ``ops_per_rank`` records, of a model of ``layers``
    layers; ``steps``: that many steps instead) into ``logdir``: ``rank#####.jsonl[.gz]`` and its completion
    marker; returns the log's path."""
    tp, pp, dp = synthetic_parallel(ranks)
    # Megatron's order: tp fastest, then dp, then pp (as commscope.pattern.layout.Layout numbers ranks)
    t, d, p = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    tp_group = [p * tp * dp + d * tp + i for i in range(tp)]
    dp_group = [p * tp * dp + j * tp + t for j in range(dp)]
    prev = rank - tp * dp if p > 0 else None
    nxt = rank + tp * dp if p < pp - 1 else None
    groups = {"tp": tp_group, "dp": dp_group}
    if prev is not None:
        groups["prev"] = sorted([prev, rank])
    if nxt is not None:
        groups["next"] = sorted([rank, nxt])
    seq = dict.fromkeys(groups, 0)
    path = Path(logdir) / f"rank{rank:05d}.jsonl{'.gz' if gz else ''}"
    clock = [1_700_000_000_000_000_000 + rank * 1000]

    def rec(op: str, key: str, size: int, step: int, peer: int | None = None) -> str:
        seq[key] += 1
        start = clock[0]
        clock[0] += 20_000 + size // 4096
        out = {"op": op, "group": groups[key], "size_bytes": size, "dtype": "bf16", "rank": rank,
               "t_start_ns": start, "t_end_ns": clock[0], "group_name": key, "seq": seq[key], "bytes_in": size,
               "bytes_out": size, "backend": "nccl", "step": step}
        if peer is not None:
            out["peer"] = peer
        return _line(out)

    def one_step(step: int) -> list[str]:
        lines = []
        # forward: from the previous stage to the next; backward: the other way
        for (src_key, src), (dst_key, dst) in ((("prev", prev), ("next", nxt)), (("next", nxt), ("prev", prev))):
            for _ in range(_MICRO_BATCHES):
                if src is not None:
                    lines.append(rec("recv", src_key, _PP_BYTES, step, src))
                lines += [rec("all_reduce", "tp", _TP_BYTES, step) for _ in range(2 * layers)]
                if dst is not None:
                    lines.append(rec("send", dst_key, _PP_BYTES, step, dst))
        lines += [rec("reduce_scatter", "dp", _DP_BYTES, step), rec("all_gather", "dp", _DP_BYTES, step)]
        return lines

    per_step = 2 * _MICRO_BATCHES * 2 * layers + 2  # a pipeline's first and last stage; the others add p2p
    header = {HEADER_KEY: {"format": "commscope.ops", "format_version": 1, "kind": "measured", "rank": rank,
                           "world_size": ranks, "hostname": "synthetic", "pid": 0, "torch": None, "backend": "nccl",
                           "started_ns": clock[0]}}
    with _open(path, gz) as fh:
        fh.write(json.dumps(header) + "\n")
        written = 0
        # every rank runs the same steps: about ops_per_rank records on an average stage
        for step in range(steps or max(1, -(-ops_per_rank // (per_step + 2 * _MICRO_BATCHES)))):
            t0 = clock[0]
            lines = one_step(step)
            fh.write("\n".join(lines) + "\n")
            fh.write(json.dumps({STEP_KEY: {"step": step, "t_start_ns": t0, "t_end_ns": clock[0]}},
                                separators=(",", ":")) + "\n")
            written += len(lines)
    path.with_suffix(".done").write_text(f"{written}\n")
    return path


def _open(path: Path, gz: bool) -> IO[str]:
    if gz:
        return gzip.open(path, "wt", encoding="utf-8", compresslevel=1)
    return open(path, "w", encoding="utf-8")
