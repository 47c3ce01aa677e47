"""The rows a nccl-tests table is read into: :class:`BusbwRow` (one half, out-of-place or in-place, of one data
line, in SI units) and :class:`QuickRow`, the same fields as a named tuple for readers of million-line tables.

:mod:`commscope.io.nccl_tests` makes them and re-exports both, where callers import them; the table checks of
:mod:`commscope.io.nccl_tests_tables` read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from commscope.io.nccl_tests_terms import _error_bound
from commscope.units import GB

__all__ = ["BusbwRow", "QuickRow"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BusbwRow:
    """One half (out-of-place or in-place) of one nccl-tests data row, in SI units."""

    op: str
    """commscope op name: ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, ..."""
    size_bytes: int
    """nccl-tests' ``size`` column: for all_gather, reduce_scatter, all_to_all the total over the group."""
    count: int
    """nccl-tests' ``count`` column (elements; per rank for all_gather / reduce_scatter, per peer for all_to_all)."""
    dtype: str
    """Canonical element type (``fp32``, ``fp16``, ``bf16``, ``int8``, ...); unknown names kept in lower case."""
    redop: str | None
    """Reduction op (``sum``, ``max``, ...); None for collectives that do not reduce or tables without the column."""
    root: int | None
    """Root rank of broadcast / reduce (gather, scatter): the row's own under ``-r -1``, which times every root; None
    where nccl-tests prints -1 (collectives without a root) or has no ``root`` column."""
    group_size: int | None
    """Number of ranks in the communicator, from the ``# Using devices`` lines (or NCCL's ``nranks``)."""
    time_s: float
    """Average time of one operation, seconds."""
    algbw_bytes_per_s: float
    """Algorithm bandwidth as printed, bytes per second: size / time, except that nccl-tests before 2019 printed
    size (n-1)/n / time for all_gather and reduce_scatter (``meta["runs"][i]["algbw_convention"]`` says which)."""
    busbw_bytes_per_s: float
    """Bus bandwidth, algbw x :func:`busbw_factor`, bytes per second."""
    wrong: int | None
    """Wrong elements found by the data check (``#wrong``); None for ``N/A`` and for the old ``error`` column."""
    in_place: bool
    """True for the right (in-place) half of the row."""
    source: str
    """``file:line`` of the row."""
    max_error: float | None = None
    """Old formats (before 2022): the ``error`` column, the largest absolute error the data check found."""
    intra_node: bool | None = None
    """True when every rank ran on one host, False for several hosts, None when the log does not say."""
    table: int = 1
    """Which table of the file the row is in, counting from 1 in file order (``meta["runs"][table - 1]``): the
    number ``commscope fit --run`` picks tables by."""

    @property
    def failed_check(self) -> bool:
        """True when nccl-tests' data check failed for this half (``#wrong`` > 0 or ``error`` above its bound)."""
        return _failed_check(self)

    @property
    def busbw_GBps(self) -> float:
        """Bus bandwidth in GB/s (1e9 bytes/s), as nccl-tests prints it."""
        return self.busbw_bytes_per_s / GB


def _failed_check(row: Any) -> bool:
    if row.wrong is not None and row.wrong > 0:
        return True
    return row.max_error is not None and row.max_error > _error_bound(row.dtype, row.group_size)


class QuickRow(NamedTuple):
    """A :class:`BusbwRow` as a named tuple: the same fields, read the same way, made ten times faster (a frozen
    dataclass of 16 fields costs ~3.5 us to build, two per line of a million-line table). What ``parse_nccl_tests(...,
    quick=True)`` gives, for a reader that only reads the rows (``commscope fit``)."""

    op: str
    size_bytes: int
    count: int  # type: ignore[assignment]  # the field, as BusbwRow's, over tuple.count
    dtype: str
    redop: str | None
    root: int | None
    group_size: int | None
    time_s: float
    algbw_bytes_per_s: float
    busbw_bytes_per_s: float
    wrong: int | None
    in_place: bool
    source: str
    max_error: float | None = None
    intra_node: bool | None = None
    table: int = 1

    @property
    def failed_check(self) -> bool:
        return _failed_check(self)
