"""The bandwidth model ``commscope fit`` produces, as the estimator uses it (``estimate --bandwidth model.toml``).

Per (op, group size n) a curve of one or more segments, each Hockney's alpha-beta line over a range of
message sizes [thakur-2005], written with nccl-tests' bus bandwidth [nccl-tests-perf]:

    t(S) = alpha + S x f(op, n) / busbw

Segments let the small-message (latency, NCCL's LL protocol) and large-message (bandwidth) regimes have
their own alpha and busbw. A size between two fitted segments belongs to the one whose edge is nearer in
log size; below the first or above the last, that segment is extrapolated (noted). The model follows
the measurements even where they are not monotone: where a library switches protocol (RCCL on MI300X
above 512 B, in the real logs) a larger message can be faster, and so it is in the model.

Worked example: all_reduce over 8 A100s (the nccl-tests v2.19.4 log in the real logs) fits, from 32 MiB
up, alpha = 144.8 us and busbw = 210.9 GB/s; 128 MiB then takes 144.8 us + 134217728 x 1.75 / 210.9e9 s
= 1.258 ms (measured 1.295 ms, -2.9%).

Queries for a group size that was not fitted use the nearest fitted n (in log2): busbw as fitted (it is
about independent of n for ring algorithms), alpha scaled by the ratio of latency-bound steps
(:func:`commscope.estimate.bandwidth.algorithm_steps`); both noted.
"""

from __future__ import annotations

import functools
import math
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from commscope.estimate.bandwidth import AlphaBeta, GroupSpan, algorithm_steps, busbw_factor, nearest_measured
from commscope.errors import ConfigError
from commscope.spec.cluster import LINK_BANDWIDTH_RANGE_BYTES_PER_S
from commscope.units import GB, US

__all__ = ["FITTED_KIND", "VARIANTS", "Curve", "FittedModel", "Segment", "canonical_op", "mixed_variants",
           "read_fitted", "root_variant", "row_variants"]

#: ``[model] kind`` of a fitted-model TOML file.
FITTED_KIND = "commscope-fitted-bandwidth"

_OP_ALIASES = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all", "send": "sendrecv", "recv": "sendrecv", "send_recv": "sendrecv",
    "p2p": "sendrecv",
}


#: Collectives with an nccl-tests bus-bandwidth factor [nccl-tests-perf] (canonical names, see canonical_op): what a
#: measured row (bench JSON, nccl-tests output, a --bandwidth table) may time.
BUSBW_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather", "scatter",
             "sendrecv")


#: What one fitted curve or table cannot hold two of: nccl-tests' ``-d all`` times every type, ``-o all`` every
#: reduction op and ``-r -1`` every root (of broadcast, reduce, gather, scatter: the root column then holds each
#: root's rank) in one table (the same sizes again and again); each has its flag. (label, plural, flag, nccl-tests'
#: option, the word before the count in a message)
VARIANTS = (("type", "types", "--dtype", "-d all", "in"), ("reduction op", "reduction ops", "--redop", "-o all", "in"),
            ("root", "roots", "--root", "-r -1", "from"))


def mixed_variants(rows: Iterable[tuple[str, int, bool | None, str | None, str | None, str | None]],
                   ) -> tuple[str, int, str, str, str] | None:
    """The first curve of ``rows`` (op, group size, intra-node, dtype, redop, root; None where a row has none) timed
    in several types, reduction ops or roots: (op, group size, what it holds, the flags that pick one, the nccl-tests
    options that make such output); None when every curve has one of each. Pooled, such rows would mix what the
    measurement kept apart; one taken, the others would vanish. ``what`` reads ``in 2 types (fp32, fp16)``,
    ``from 4 roots (0, 1, 2, 3)``, ``in 3 types (...) and 2 reduction ops (...)``."""
    curves: dict[tuple[str, int, bool | None], tuple[list[str], ...]] = {}
    for op, n, intra, *variants in rows:
        seen = curves.setdefault((op, n, intra), tuple([] for _ in VARIANTS))
        for values, v in zip(seen, variants, strict=True):
            if v is not None and v not in values:
                values.append(v)
    for (op, n, _), seen in curves.items():
        several = [(values, v) for values, v in zip(seen, VARIANTS, strict=True) if len(values) > 1]
        if several:
            words = [word for _, (*_, word) in several]
            what = " and ".join(f"{word + ' ' if i == 0 or word != words[i - 1] else ''}{len(values)} {plural} "
                                f"({', '.join(values)})" for i, (values, (_, plural, _, _, word)) in enumerate(several))
            pick = " ".join(f"{flag} {values[0] if flag != '--redop' or 'sum' not in values else 'sum'}"
                            for values, (_, _, flag, _, _) in several)
            return op, n, what, pick, " / ".join(opt for _, (_, _, _, opt, _) in several)
    return None


def row_variants(row: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """A measured row's (type, reduction op, root) as :func:`mixed_variants` compares them, for `commscope bench`
    JSON and written tables alike: the type in nccl-tests' canonical spelling (``float`` -> ``fp32``), the reduction
    op in lower case, the root as text; None where the row has none (blank, redop ``none``)."""
    dtype, redop = row.get("dtype"), row.get("redop")
    if isinstance(dtype, str) and dtype.strip():
        from commscope.io.nccl_tests import _canonical_dtype

        dtype = _canonical_dtype(dtype.strip())
    else:
        dtype = None
    redop = redop.strip().lower() if isinstance(redop, str) else None
    return dtype, redop if redop not in (None, "", "none") else None, root_variant(row.get("root"))


def root_variant(value: Any) -> str | None:
    """A root as :func:`mixed_variants` compares it: the rank as text (an int, or digits in a table's cell); None for
    a row without one (`commscope bench` and nccl-tests write -1 for collectives that have no root)."""
    if isinstance(value, str) and value.strip().isdigit():
        return str(int(value))
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return str(value)


@functools.lru_cache(maxsize=4096)  # a million rows name a few ops
def canonical_op(name: str) -> str:
    """``all_reduce_perf``, ``allreduce``, ``AllReduce`` -> ``all_reduce``; send/recv -> ``sendrecv``."""
    key = str(name).strip().lower().removesuffix("_perf")
    return _OP_ALIASES.get(key.replace("_", ""), _OP_ALIASES.get(key, key))


def _factor(op: str, n: int) -> float:
    return 1.0 if op == "sendrecv" else busbw_factor(op, n)


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """t = alpha_s + size x f / busbw over the measured sizes [size_min_bytes, size_max_bytes]."""

    size_min_bytes: int
    size_max_bytes: int
    alpha_s: float
    """Latency (>= 0)."""
    busbw_bytes_per_s: float
    """Bus bandwidth (> 0; inf when the segment's time does not grow with size)."""

    def time_s(self, size_bytes: float, f: float, alpha_scale: float = 1.0) -> float:
        return self.alpha_s * alpha_scale + size_bytes * f / self.busbw_bytes_per_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Curve:
    """Fitted segments of one op over groups of ``group_size`` ranks, ordered by size."""

    op: str
    group_size: int
    segments: tuple[Segment, ...]
    intra_node: bool | None = None
    """True: measured inside one node; False: across nodes; None: unknown (used for both)."""

    def __post_init__(self) -> None:
        if not self.segments:
            raise ValueError(f"curve {self.op} n={self.group_size} has no segments")

    def segment_for(self, size_bytes: float) -> Segment:
        """The segment whose size range is nearest to ``size_bytes`` in log size."""
        segs = self.segments
        for i, seg in enumerate(segs[:-1]):
            if size_bytes <= math.sqrt(seg.size_max_bytes * segs[i + 1].size_min_bytes):
                return seg
        return segs[-1]

    def time_s(self, size_bytes: float, f: float, alpha_scale: float = 1.0) -> float:
        """Time of ``size_bytes`` on the segment for that size."""
        return self.segment_for(size_bytes).time_s(size_bytes, f, alpha_scale)

    @property
    def size_range(self) -> tuple[int, int]:
        return self.segments[0].size_min_bytes, self.segments[-1].size_max_bytes


@dataclass(slots=True)
class FittedModel:
    """Bandwidth model from fitted curves; the estimator's BandwidthModel protocol (see bandwidth.py)."""

    curves: list[Curve]
    source: str = "fitted model"
    fallback: AlphaBeta | None = None
    """Used for ops the fit lacks (noted); without it such a query raises ConfigError."""
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.curves:
            raise ConfigError("bandwidth", self.source, "has no fitted curves")

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def ops(self) -> set[str]:
        return {c.op for c in self.curves}

    def _curve(self, op: str, span: GroupSpan) -> Curve | None:
        best = nearest_measured([c for c in self.curves if c.op == op], span, group_size=lambda c: c.group_size,
                                intra_node=lambda c: c.intra_node)
        if best is None:
            return None
        if best.group_size != span.n:
            self._note(f"{self.source}: no {op} fitted over {span.n} ranks; used the {best.group_size}-rank fit "
                       f"(busbw as fitted, latency scaled by algorithm steps)")
        return best

    def op_time_s(self, op: str, size_bytes: float, span: GroupSpan) -> float:
        if span.n < 2 or size_bytes <= 0:
            return 0.0
        name = canonical_op(op)
        curve = self._curve(name, span)
        if curve is None:
            if self.fallback is not None:
                self._note(f"{self.source}: no {name} fit{' inside one node' if span.intra_node else ''}; "
                           f"used the cluster preset's alpha-beta model")
                return self.fallback.op_time_s(op, size_bytes, span)
            have = ", ".join(sorted(self.ops()))
            raise ConfigError("bandwidth", self.source,
                              f"lacks {name} (needed for {span.n} ranks at {int(size_bytes):,} bytes); it has: {have}")
        lo, hi = curve.size_range
        if not lo <= size_bytes <= hi:
            self._note(f"{self.source}: {name} at {int(size_bytes):,} bytes is outside the fitted "
                       f"{lo:,}-{hi:,} bytes; extrapolated the nearest segment")
        scale = 1.0
        if curve.group_size != span.n:
            scale = algorithm_steps(name, span.n) / algorithm_steps(name, curve.group_size)
        return curve.time_s(size_bytes, _factor(name, span.n), scale)

    def busbw_bytes_per_s(self, op: str, size_bytes: float, span: GroupSpan) -> float:
        """Effective bus bandwidth at ``size_bytes`` (latency included): S x f / t."""
        name = canonical_op(op)
        n = max(span.n, 2)
        size = max(float(size_bytes), 1.0)
        t = self.op_time_s(op, size, GroupSpan(n=n, num_nodes=span.num_nodes, per_node=span.per_node))
        return size * _factor(name, n) / t if t > 0 else math.inf


def _num(item: dict, key: str, where: str, source: str) -> float:
    if key not in item:
        raise ConfigError(where, dict(item), f"lacks {key}", source=source)
    try:
        value = float(item[key])
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.{key}", item[key], "must be a number", source=source) from None
    if math.isnan(value) or value < 0:
        raise ConfigError(f"{where}.{key}", item[key], "must be >= 0", source=source)
    return value


def curves_from_mapping(data: dict, source: str, notes: list[str] | None = None) -> list[Curve]:
    """Curves from a parsed fitted-model TOML (``[[curves]]`` with inline ``segments``). A curve ``commscope fit``
    marked ``unreliable`` is left out, with a line in ``notes`` saying why."""
    curves = []
    items = data.get("curves", [])
    if not isinstance(items, list):
        raise ConfigError("curves", type(items).__name__, "must be a list of [[curves]] tables", source=source)
    for i, item in enumerate(items, start=1):
        where = f"curves[{i}]"
        if not isinstance(item, dict):
            raise ConfigError(where, item, "must be a table", source=source)
        if "op" not in item or "group_size" not in item:
            raise ConfigError(where, dict(item), "lacks op or group_size", source=source)
        segs = []
        for j, seg in enumerate(item.get("segments", []), start=1):
            w = f"{where}.segments[{j}]"
            busbw = _num(seg, "busbw_GBps", w, source) * GB
            if busbw <= 0:
                raise ConfigError(f"{w}.busbw_GBps", seg["busbw_GBps"], "must be > 0", source=source)
            segs.append(Segment(size_min_bytes=int(_num(seg, "size_min_bytes", w, source)),
                                size_max_bytes=int(_num(seg, "size_max_bytes", w, source)),
                                alpha_s=_num(seg, "alpha_us", w, source) * US, busbw_bytes_per_s=busbw))
        unreliable = item.get("unreliable") or (_implausible_segment(segs) if segs else None)
        if not segs and not unreliable:  # `commscope fit` writes an unreliable curve's segments as a comment
            raise ConfigError(where, item["op"], "has no segments", source=source)
        if unreliable:
            skipped = f"{source}: {item['op']} over {item['group_size']} ranks left out: unreliable fit ({unreliable})"
            if notes is not None:
                notes.append(skipped)
            continue
        if item.get("noisy_rows") and notes is not None:
            notes.append(f"{source}: {item['op']} over {item['group_size']} ranks was fitted to {item['noisy_rows']} "
                         "rows flagged noisy; its times are uncertain")
        intra = item.get("intra_node")
        curves.append(Curve(op=canonical_op(item["op"]), group_size=int(item["group_size"]),
                            segments=tuple(sorted(segs, key=lambda s: s.size_min_bytes)),
                            intra_node=intra if isinstance(intra, bool) else None))
    if not curves:
        left_out = [n for n in notes or [] if "unreliable fit" in n]
        if left_out:
            raise ConfigError("bandwidth", source, f"every fitted curve is unreliable ({left_out[0].split('(', 1)[-1]}; "
                                                   "measure again")
        raise ConfigError("bandwidth", source, "has no [[curves]] (expected a file written by `commscope fit`)")
    return curves


#: Messages from this size on are timed mostly by the bus bandwidth, so a segment reaching them must have one a
#: real link could have; below it a fit is latency-bound and its bandwidth is ill-determined (even infinite).
BANDWIDTH_BOUND_BYTES = 1 << 20


def _implausible_segment(segs: list[Segment]) -> str | None:
    """Why a fitted curve cannot describe any real link: a segment reaching :data:`BANDWIDTH_BOUND_BYTES` whose
    bus bandwidth is infinite or outside ``LINK_BANDWIDTH_RANGE_BYTES_PER_S`` (None: plausible)."""
    lo, hi = LINK_BANDWIDTH_RANGE_BYTES_PER_S
    for seg in segs:
        bw = seg.busbw_bytes_per_s
        if seg.size_max_bytes >= BANDWIDTH_BOUND_BYTES and not (math.isfinite(bw) and lo <= bw <= hi):
            return (f"bus bandwidth {bw / GB:g} GB/s for {seg.size_min_bytes}-{seg.size_max_bytes} B is outside any "
                    f"real link's {lo / GB:g}-{hi / GB:g} GB/s")
    return None


def read_fitted(path: Path, *, fallback: AlphaBeta | None = None) -> FittedModel:
    """A FittedModel from a TOML file written by ``commscope fit``."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("bandwidth", path.name, f"is not valid TOML: {exc}") from None
    if isinstance(data.get("collectives"), dict):  # nested in a cluster file written by `commscope calibrate`
        data = data["collectives"]
    kind = data.get("model", {}).get("kind")
    if kind != FITTED_KIND:
        raise ConfigError("bandwidth", path.name, f"[model] kind={kind!r}: expected {FITTED_KIND!r}")
    notes: list[str] = []
    curves = curves_from_mapping(data, path.name, notes)
    return FittedModel(curves=curves, source=path.name, fallback=fallback, notes=notes)
