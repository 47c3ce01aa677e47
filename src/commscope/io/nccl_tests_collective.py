"""Which collective a run's rows hold, and over how many ranks: each collective's signature (whether it reduces,
has a root, and how ``size`` relates to ``count``), the group size from the device list or NCCL's ``nranks``, and
the check, on all rows at once, that the printed bandwidths are the collective's arithmetic within the printed
digits. A name the rows contradict is overruled, rows that fit several collectives are said to be ambiguous (the
rules: :mod:`commscope.io.nccl_tests`'s docstring).

Private to :mod:`commscope.io.nccl_tests`, which names each run's rows with the collective found here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from commscope.io.nccl_tests_lines import _half_unit, _Problems, _Run
from commscope.io.nccl_tests_terms import _DTYPE_BYTES, _REDOPS, _canonical_dtype, busbw_factor
from commscope.units import GB, US

if TYPE_CHECKING:
    from commscope.io.nccl_tests_columns import _Columns

#: What each collective's rows look like in nccl-tests: (reduces, rooted, size = count x element size x n).
_SIGNATURES: dict[str, tuple[bool, bool, bool]] = {
    "all_reduce": (True, False, False),
    "all_gather": (False, False, True),
    "reduce_scatter": (True, False, True),
    "broadcast": (False, True, False),
    "reduce": (True, True, False),
    "all_to_all": (False, False, True),
    "sendrecv": (False, False, False),
    "gather": (False, True, True),
    "scatter": (False, True, True),
}
#: Ops whose in-place half nccl-tests does not check (``N/A``).
_UNCHECKED_IN_PLACE = ("all_to_all", "sendrecv")

#: How a user names the collective that nccl-tests output does not (said where the rows leave it open).
_NAME_IT = ("keep the test's command line, e.g. `./build/all_reduce_perf -b 8 -e 128M`, above its output to name it; "
            "`commscope fit --op` and parse_nccl_tests(op=) take it too")


def _group_size(run: _Run, problems: _Problems) -> int | None:
    n_dev: int | None = None
    if run.devices:
        ranks = [d["rank"] for d in run.devices]
        if len(set(ranks)) != len(ranks):
            problems.add(run.devices_line, "the device list names the same rank more than once: several independent "
                                           "runs (nccl-tests built without MPI=1?)")
        groups = {d["group"] for d in run.devices}
        if len(groups) > 1:
            g0 = min(run.devices, key=lambda d: d["rank"])["group"]
            n_dev = len({d["rank"] for d in run.devices if d["group"] == g0})
        else:
            n_dev = len(set(ranks))
    n_nccl = max(run.nccl_nranks) if run.nccl_nranks else None
    if n_dev is not None and n_nccl is not None and n_dev != n_nccl:
        problems.add(run.devices_line, f"the device list has {n_dev} ranks but NCCL reports nranks {n_nccl}; "
                                       f"using {n_nccl}")
        return n_nccl
    return n_dev if n_dev is not None else n_nccl


def _half_units(tokens: list[str]) -> np.ndarray:
    """:func:`_half_unit` of each token, as an array (a plain decimal from its length and dot; the rare exponent one by
    one)."""
    count = len(tokens)
    lens = np.fromiter(map(len, tokens), np.int64, count)
    dots = np.fromiter((t.find(".") for t in tokens), np.int64, count)
    out: np.ndarray = 0.5 * 10.0 ** -np.where(dots < 0, 0, lens - dots - 1).astype(float)
    for i in [i for i, t in enumerate(tokens) if "e" in t or "E" in t]:
        out[i] = _half_unit(tokens[i])
    return out


class _Timed:
    """The halves of a run's rows that carry a time (> 0: a time printed as 0.00, damaged or below the printed
    resolution, says nothing of the op's arithmetic), as arrays: every candidate collective's arithmetic is checked
    on all of them at once, not row by row (a table of a million rows in a fraction of a second)."""

    def __init__(self, size: np.ndarray, time_us: np.ndarray, dt: np.ndarray, busbw: tuple[np.ndarray, np.ndarray],
                 algbw: tuple[np.ndarray, np.ndarray], busbw_GBps: np.ndarray) -> None:
        self.size, self.time_us, self.dt = size, time_us, dt
        self.values = {"busbw": busbw, "algbw": algbw}
        self.busbw_GBps = busbw_GBps
        self._fits: dict[tuple[float, str], np.ndarray] = {}

    @classmethod
    def of(cls, cols: _Columns) -> _Timed:
        """The timed halves of a run's columns."""
        timed = cols.time_us > 0
        return cls(cols.sizes_float()[cols.row[timed]], cols.time_us[timed], cols.dt_time[timed],
                   (cols.busbw_GBps[timed], cols.dt_busbw[timed]), (cols.algbw_GBps[timed], cols.dt_algbw[timed]),
                   cols.busbw_GBps[timed])

    def fits(self, f: float, which: str = "busbw") -> np.ndarray:
        """Per half: the printed busbw (or algbw) == size / time x f, within what the printed digits allow.

        size / time rather than the printed algbw: nccl-tests before 2019 printed algbw = size (n-1)/n / time for
        all_gather and reduce_scatter (with busbw = algbw), so only busbw means the same in every version.
        """
        if (f, which) not in self._fits:  # (collectives of one factor ask alike)
            self._fits[f, which] = self._check(f, which)
        return self._fits[f, which]

    def _check(self, f: float, which: str) -> np.ndarray:
        value, dv = self.values[which]
        t_hi, t_lo = self.time_us + self.dt, self.time_us - self.dt
        gb_per_s_us = self.size * f / GB / US  # (bytes / GB) per microsecond -> GB/s
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.where(t_hi > 0, gb_per_s_us / t_hi - dv, -dv)
            hi = np.where(t_lo > 0, gb_per_s_us / t_lo + dv, np.inf)
        ok: np.ndarray = (lo * (1 - 1e-9) - 1e-12 <= value) & (value <= hi * (1 + 1e-9) + 1e-12)
        return ok


def _evidence(cols: _Columns) -> dict[str, Any]:
    redops = {r for _, r, _ in cols.variants if r is not None}
    reduces = None
    if redops & _REDOPS:
        reduces = True
    elif redops and redops <= {"none"}:
        reduces = False
    roots = {o for _, _, o in cols.variants if o is not None}
    rooted = None
    if roots:
        rooted = any(x >= 0 for x in roots)
    sizes = [_DTYPE_BYTES.get(_canonical_dtype(t)) for t, _, _ in cols.variants]
    mults: set[float] = set()
    if cols.size.max() < 2**53 and cols.count.max() < 2**49:  # whole numbers a float holds: size / (count ts) exact
        ts = np.array([v or 0 for v in sizes], dtype=np.int64)[cols.variant]  # (a type of no known size: 0)
        count = cols.count.astype(np.int64)
        ok = (ts > 0) & (count > 0)
        mults = set(np.unique(cols.sizes_float()[ok] / (count[ok] * ts[ok]).astype(float)).tolist())
    else:
        for size, count_, v in zip(cols.size.tolist(), cols.count.tolist(), cols.variant.tolist(), strict=True):
            ts_ = sizes[v]
            if ts_ and count_ > 0:
                mults.add(size / (count_ * ts_))
    size_mult = mults.pop() if len(mults) == 1 else None
    bounds = np.searchsorted(cols.row, np.arange(len(cols.size) + 1))
    two = np.flatnonzero(np.diff(bounds) == 2)  # rows of two halves: in-place unchecked where out-of-place is
    first = bounds[two]
    unchecked = cols.wrong.dtype == object and any(cols.wrong[j] is not None and cols.wrong[j + 1] is None
                                           and cols.max_error[j + 1] is None for j in first.tolist())
    return {"reduces": reduces, "rooted": rooted, "size_mult": size_mult, "unchecked_in_place": unchecked,
            "first_redop": cols.first(1), "first_root": cols.first(2)}


def _fits(op: str, ev: dict[str, Any], n: int | None, timed: _Timed) -> list[str]:
    """Why the rows are not ``op`` output (empty when they could be)."""
    reasons: list[str] = []
    sig = _SIGNATURES.get(op)
    if sig is None:
        return reasons
    reduces, rooted, times_n = sig
    if ev["reduces"] is not None and ev["reduces"] != reduces:
        redop = ev["first_redop"]
        reasons.append(f"redop is {redop!r} ({op} {'reduces' if reduces else 'does not reduce'})")
    if ev["rooted"] is not None and ev["rooted"] != rooted:
        root = ev["first_root"]
        reasons.append(f"root is {root} ({op} {'has a root' if rooted else 'has no root'})")
    mult = ev["size_mult"]
    if mult is not None and n is not None:
        want = n if times_n else 1
        if abs(mult - want) > 1e-9:
            reasons.append(f"size = {mult:g} x count x element size ({op} over {n} ranks: {want})")
    if n is not None:
        f = busbw_factor(op, n)
        bad = ~timed.fits(f)
        if bad.any():  # the first of the halves whose size / time is largest
            i = int(np.argmax(np.where(bad, timed.size / np.maximum(timed.time_us, 1e-12), -np.inf)))
            size, time_us = float(timed.size[i]), float(timed.time_us[i])
            ratio = float(timed.busbw_GBps[i]) / (size / GB / (time_us * US)) if size and time_us else float("nan")
            reasons.append(f"busbw / (size/time) = {ratio:.4g} ({op} over {n} ranks: {f:.4g})")
    return reasons


def _resolve_op(run: _Run, n: int | None, override: str | None, problems: _Problems, timed: _Timed,
                cols: _Columns) -> str:
    ln = int(cols.line[0])
    ev = _evidence(cols)
    candidates = [op for op in _SIGNATURES if not _fits(op, ev, n, timed)]
    if ev["unchecked_in_place"]:
        candidates.sort(key=lambda op: op not in _UNCHECKED_IN_PLACE)
    named = override or run.op_hint
    if named is not None:
        reasons = _fits(named, ev, n, timed)
        if not reasons:
            return named
        if override is not None:
            problems.add(ln, f"the rows do not look like {named} output ({'; '.join(reasons)}); kept op={named} "
                             "as asked")
            return named
        where = f"line {run.op_hint_line} names {run.op_hint_raw}"
        if candidates:
            problems.add(ln, f"{where}, but the rows are not {named} output ({'; '.join(reasons)}); "
                             f"reading them as {candidates[0]}")
            return candidates[0]
        problems.add(ln, f"{where}, but the rows do not fit it ({'; '.join(reasons)}); kept {named}")
        return named
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        problems.add(ln, "the rows fit no nccl-tests collective and no command line names the test binary; "
                         "op is 'unknown' (" + _NAME_IT + ")")
        return "unknown"
    if n == 1 or not ev["unchecked_in_place"] or len([c for c in candidates if c in _UNCHECKED_IN_PLACE]) != 1:
        alts = " or ".join(candidates)
        more = " with 1 rank" if n == 1 else ""
        problems.add(ln, f"no command line names the test binary and the rows{more} could be {alts}; "
                         f"assuming {candidates[0]} ({_NAME_IT})")
    return candidates[0]

