"""nccl-tests' words in commscope's: its collective and element-type names, each type's size and data-check bound,
and its bandwidth formulas (:func:`busbw_factor`, :func:`algbw`).

The rest of the nccl-tests parser (:mod:`commscope.io.nccl_tests` and its ``nccl_tests_*`` modules) reads names and
checks numbers with these; :mod:`commscope.io.nccl_tests` re-exports the public ones, where callers import them.
"""

from __future__ import annotations

import functools
import math
import re

# --------------------------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------------------------

#: nccl-tests binary / collective names (lower case, without ``_``, ``_perf``, ``_mpi``) -> commscope op names.
_OP_NAMES: dict[str, str] = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "alltoallv": "all_to_all_v",
    "broadcast": "broadcast",
    "bcast": "broadcast",
    "reduce": "reduce",
    "sendrecv": "sendrecv",
    "gather": "gather",
    "scatter": "scatter",
    "hypercube": "hypercube",
}

#: nccl-tests / rccl-tests type names -> canonical commscope dtype names.
_DTYPES: dict[str, str] = {
    "float": "fp32",
    "float32": "fp32",
    "fp32": "fp32",
    "half": "fp16",
    "float16": "fp16",
    "fp16": "fp16",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "double": "fp64",
    "float64": "fp64",
    "fp64": "fp64",
    "int8": "int8",
    "char": "int8",
    "uint8": "uint8",
    "int32": "int32",
    "int": "int32",
    "uint32": "uint32",
    "int64": "int64",
    "uint64": "uint64",
    "f8e4m3": "fp8_e4m3",
    "fp8e4m3": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "float8e4m3": "fp8_e4m3",
    "f8e5m2": "fp8_e5m2",
    "fp8e5m2": "fp8_e5m2",
    "fp8_e5m2": "fp8_e5m2",
    "float8e5m2": "fp8_e5m2",
}

#: Bytes per element of the canonical dtypes above.
_DTYPE_BYTES: dict[str, int] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8,
    "uint64": 8, "fp8_e4m3": 1, "fp8_e5m2": 1,
}

#: Largest max-error the old ``error`` column may show before nccl-tests counts the row as out of bounds
#: (``DeltaMaxValue`` in nccl-tests' common.cu, 2017-2022; multiplied there by n-1 in later versions).
_ERROR_BOUND: dict[str, float] = {"fp16": 1e-2, "bf16": 1e-2, "fp32": 1e-5, "fp64": 1e-12}
_INT_ERROR_BOUND = 1e-200

_REDOPS = frozenset({"sum", "prod", "max", "min", "avg", "mulsum", "premulsum"})


def canonical_op(name: str) -> str:
    """The commscope name of an nccl-tests collective: ``all_reduce_perf``, ``AllReduce`` -> ``all_reduce``.

    Raises ValueError for a name that is no nccl-tests collective.
    """
    key = str(name).strip().lower().rsplit("/", 1)[-1]
    key = re.sub(r"(\.exe)$", "", key)
    key = re.sub(r"_?perf(_?mpi)?$", "", key)
    key = re.sub(r"[^a-z0-9]", "", key)
    if key in _OP_NAMES:
        return _OP_NAMES[key]
    known = ", ".join(sorted(set(_OP_NAMES.values())))
    raise ValueError(f"unknown nccl-tests collective {name!r}; known: {known}")


@functools.lru_cache(maxsize=4096)  # a million rows name a few types
def _canonical_dtype(name: str) -> str:
    return _DTYPES.get(name.lower(), name.lower())


# --------------------------------------------------------------------------------------------------------------------
# Formulas
# --------------------------------------------------------------------------------------------------------------------


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor f(op, n): busbw = algbw x f [nccl-tests-perf].

    ==============================================================  ============
    op                                                              f
    ==============================================================  ============
    all_reduce                                                      2(n-1)/n
    reduce_scatter, all_gather, all_to_all (and -v), gather,
    scatter, hypercube                                              (n-1)/n
    broadcast, reduce, sendrecv                                     1
    ==============================================================  ============

    These are the ``GetBw`` functions of nccl-tests' ``src/*.cu``, which doc/PERFORMANCE.md derives: an all_reduce
    moves every byte 2(n-1) times over n links, an all_gather or reduce_scatter (n-1) times, while a broadcast or
    reduce is limited by the root's one link. Worked number: ``busbw_factor('all_reduce', 8) == 1.75``, so an
    all_reduce of 1 GB in 10 ms (algbw 100 GB/s) shows busbw 175 GB/s. ``op`` may be any name
    :func:`canonical_op` knows (``AllReduce``, ``all_reduce_perf``). Raises ValueError for n < 1 or an unknown op.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"group size n={n!r} must be an integer >= 1")
    name = canonical_op(op)
    if name == "all_reduce":
        return 2 * (n - 1) / n
    if name in ("reduce_scatter", "all_gather", "all_to_all", "all_to_all_v", "gather", "scatter", "hypercube"):
        return (n - 1) / n
    return 1.0  # broadcast, reduce, sendrecv


def algbw(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s: size / time [nccl-tests-perf]. ``algbw(1e9, 0.01) == 1e11`` (100 GB/s)."""
    if not time_s > 0 or not math.isfinite(time_s):
        raise ValueError(f"time_s={time_s!r} must be a positive, finite number of seconds")
    if not size_bytes >= 0:
        raise ValueError(f"size_bytes={size_bytes!r} must be >= 0")
    return size_bytes / time_s


def _error_bound(dtype: str, n: int | None) -> float:
    return _ERROR_BOUND.get(dtype, _INT_ERROR_BOUND) * max(1, (n or 1) - 1)

