"""One collective on one rank, as a sweep runs it: its buffers and call, and the check of its result (torch).

:func:`_make_case` allocates the buffers of one (op, count) and binds the torch.distributed call; :class:`_Pattern`
is the data each rank puts in, chosen so that every reduction is exact in the dtype; :func:`_fill` writes it and
:func:`_check` compares a whole output with :func:`_expected`, in chunks that bound the memory. torch is imported
inside the functions, so that importing this module does not load it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from commscope.measure.bench.sweep_config import _REDUCING

#: Largest integer each dtype holds exactly (for check patterns whose reductions must be exact).
_EXACT_MAX = {"fp32": 2 ** 24, "fp16": 2048, "bf16": 256, "fp64": 2 ** 53, "int8": 127, "uint8": 255,
              "int32": 2 ** 31 - 1, "int64": 2 ** 62}


def _torch_dtype(dtype: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp64": torch.float64,
            "int8": torch.int8, "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64}[dtype]


def _reduce_op(redop: str):
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}[redop]


@dataclass(frozen=True, slots=True)
class _Pattern:
    """Check data: the value rank r (index in its group) puts at element i, chosen so results are exact.

    sum: values 0..3, or 0/1 with few ones per element when n is large; prod: 1/2 with few twos (each element
    gets a 2 from every k-th rank, so the product is an exact power of two); min/max
    and the non-reducing ops: (13 r + i) mod 97 (distinct per rank, so a misplaced block shows).
    """

    kind: Literal["small", "sparse", "prod", "spread"]
    k: int = 1

    @classmethod
    def for_op(cls, op: str, redop: str, n: int, dtype: str) -> _Pattern:
        limit = _EXACT_MAX[dtype]
        if op not in _REDUCING or redop in ("min", "max"):
            return cls("spread")
        if redop == "prod":
            twos = max(1, int(math.log2(limit)))
            return cls("prod", k=max(2, math.ceil(n / twos)))  # k >= 2: ranks differ
        if 3 * n <= limit:
            return cls("small")
        return cls("sparse", k=max(1, math.ceil(n / limit)))

    def values(self, r, idx):
        """Values of group rank r (an int, or a tensor like ``idx``) at the int64 indices ``idx``, as int64."""
        if self.kind == "small":
            return (idx + r) % 4
        if self.kind == "sparse":
            return ((idx + r) % self.k == 0).long()
        if self.kind == "prod":
            return 1 + ((idx + r) % self.k == 0).long()
        return (13 * r + idx) % 97


def _reduce_values(redop: str, parts: list, n: int, dtype):
    import torch

    acc = parts[0].clone()
    for p in parts[1:]:
        if redop in ("sum", "avg"):
            acc += p
        elif redop == "prod":
            acc *= p
        elif redop == "min":
            acc = torch.minimum(acc, p)
        else:
            acc = torch.maximum(acc, p)
    if redop == "avg":
        return (acc.double() / n).to(dtype)
    return acc.to(dtype)


_CHECK_CHUNK = 1 << 20  # elements compared at a time, to bound the check's memory


def _expected(op: str, redop: str, pattern: _Pattern, r: int, n: int, c: int, root: int, idx, dtype):
    """Expected output elements ``idx`` on group rank r (c: nccl-tests' count)."""
    if op in ("all_reduce", "reduce"):
        return _reduce_values(redop, [pattern.values(q, idx) for q in range(n)], n, dtype)
    if op == "reduce_scatter":
        return _reduce_values(redop, [pattern.values(q, r * c + idx) for q in range(n)], n, dtype)
    if op in ("all_gather", "all_to_all"):
        # output element o comes from rank o // c: its element o % c (all_gather) or r*c + o % c (all_to_all)
        src_idx = idx % c + (r * c if op == "all_to_all" else 0)
        return pattern.values(idx // c, src_idx).to(dtype)
    if op == "sendrecv":
        return pattern.values((r - 1) % n, idx).to(dtype)
    if op == "broadcast":
        return pattern.values(root, idx).to(dtype)
    raise AssertionError(op)


def _count_wrong(out, expected, redop: str, n: int, dtype: str) -> int:
    import torch

    if redop == "avg" and dtype in ("fp32", "fp16", "bf16", "fp64"):
        eps = torch.finfo(out.dtype).eps
        tol = eps * (n + 2) * torch.clamp(expected.double().abs(), min=1.0)
        return int(((out.double() - expected.double()).abs() > tol).sum())
    return int((out != expected).sum())


@dataclass(slots=True)
class _Case:
    """Buffers and the call of one (op, size) on one rank."""

    run: Callable[[], None]
    inputs: list
    output: Any
    check_output: bool


def _make_case(op: str, count: int, n: int, group, group_ranks: Sequence[int], me: int, root: int, redop: str,
               dtype, device) -> _Case:
    import torch
    import torch.distributed as dist

    def buf(num: int):
        return torch.zeros(num, dtype=dtype, device=device)

    rop = _reduce_op(redop)
    # torch 2.13 renamed reduce_scatter_tensor / all_gather_into_tensor to *_single (the old names warn)
    reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    if op == "all_reduce":
        b = buf(count)
        return _Case(lambda: dist.all_reduce(b, op=rop, group=group), [b], b, True)
    if op == "all_gather":
        i, o = buf(count), buf(count * n)
        return _Case(lambda: all_gather(o, i, group=group), [i], o, True)
    if op == "reduce_scatter":
        i, o = buf(count * n), buf(count)
        return _Case(lambda: reduce_scatter(o, i, op=rop, group=group), [i], o, True)
    if op == "all_to_all":
        i, o = buf(count * n), buf(count * n)
        return _Case(lambda: dist.all_to_all_single(o, i, group=group), [i], o, True)
    if op == "sendrecv":
        s, rcv = buf(count), buf(count)
        nxt, prv = group_ranks[(me + 1) % n], group_ranks[(me - 1) % n]

        def sendrecv() -> None:
            reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, s, nxt, group=group),
                                           dist.P2POp(dist.irecv, rcv, prv, group=group)])
            for req in reqs:
                req.wait()

        return _Case(sendrecv, [s], rcv, True)
    if op == "broadcast":
        b = buf(count)
        src = group_ranks[root]
        return _Case(lambda: dist.broadcast(b, src=src, group=group), [b], b, True)
    if op == "reduce":
        b = buf(count)
        dst = group_ranks[root]
        return _Case(lambda: dist.reduce(b, dst=dst, op=rop, group=group), [b], b, me == root)
    raise AssertionError(op)


def _fill(case: _Case, pattern: _Pattern, me: int) -> None:
    import torch

    for t in case.inputs:
        for lo in range(0, t.numel(), _CHECK_CHUNK):
            hi = min(t.numel(), lo + _CHECK_CHUNK)
            idx = torch.arange(lo, hi, dtype=torch.int64, device=t.device)
            t[lo:hi] = pattern.values(me, idx).to(t.dtype)


def _check(case: _Case, op: str, redop: str, pattern: _Pattern, me: int, n: int, count: int, root: int,
           dtype: str) -> int:
    import torch

    if not case.check_output:
        return 0
    out = case.output
    wrong = 0
    for lo in range(0, out.numel(), _CHECK_CHUNK):
        hi = min(out.numel(), lo + _CHECK_CHUNK)
        idx = torch.arange(lo, hi, dtype=torch.int64, device=out.device)
        exp = _expected(op, redop, pattern, me, n, count, root, idx, out.dtype)
        wrong += _count_wrong(out[lo:hi], exp, redop, n, dtype)
    return wrong
