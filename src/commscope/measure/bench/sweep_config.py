"""What a sweep measures, in nccl-tests' terms, and the checks made before any rank starts.

The ops, reductions, dtypes and ``-a`` modes a sweep accepts; nccl-tests' size arithmetic (the count and bytes of
each op at a requested size, the size loop of ``-b``/``-e``/``-f``/``-i``); :class:`SweepConfig`, checked when
made; and the checks of a configuration against the world it will run on (group sizes, the root, the reduction,
a size that holds an element, the host's memory), which ``bench``, ``tune`` and ``calibrate`` run before they
launch a rank. Nothing here imports torch. The semantics are :mod:`commscope.measure.bench.sweep`'s docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from commscope.errors import ConfigError
from commscope.units import MiB, canonical_dtype, dtype_bytes, format_bytes, parse_size_bytes

__all__ = ["AVERAGE_MODES", "DTYPES", "MAX_ITERS", "OPS", "REDOPS", "SweepConfig", "available_memory_bytes",
           "backend_op", "buffer_bytes", "check_measurable", "check_memory", "check_world", "message_sizes",
           "op_count", "parse_dtype", "parse_sizes_arg", "smallest_size_bytes"]

#: The collectives a sweep can measure, with nccl-tests' meaning.
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sendrecv", "broadcast", "reduce")
_REDUCING = ("all_reduce", "reduce_scatter", "reduce")
_ROOTED = ("broadcast", "reduce")
#: Reduction ops (``-o``); ``avg`` needs NCCL.
REDOPS: tuple[str, ...] = ("sum", "prod", "min", "max", "avg")
#: nccl-tests' ``-a``: how per-rank times combine (0 rank 0, 1 average, 2 min, 3 max).
AVERAGE_MODES: dict[int, str] = {0: "rank0", 1: "avg", 2: "min", 3: "max"}
#: dtypes a sweep accepts, by commscope's canonical name -> nccl-tests' type name (the table's ``type``).
DTYPES: dict[str, str] = {"fp32": "float", "fp16": "half", "bf16": "bfloat16", "fp64": "double",
                          "int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64"}
_NCCL_TYPE_ALIASES = {"float": "fp32", "half": "fp16", "double": "fp64", "bfloat16": "bf16", "int": "int32",
                      "char": "int8"}
#: Most timed (``-n``) or warm-up (``-w``) iterations per size: nccl-tests' default is 20, and 100,000 of the
#: smallest gloo message (~30 us) already take 3 s per size; more is a typo that would run for hours.
MAX_ITERS = 100_000


def parse_dtype(name: str) -> str:
    """commscope's canonical dtype from an nccl-tests (``float``, ``half``) or torch (``bfloat16``) name."""
    key = str(name).strip().lower()
    key = _NCCL_TYPE_ALIASES.get(key, key)
    try:
        canon = canonical_dtype(key)
    except ValueError:
        canon = None
    if canon not in DTYPES:
        raise ConfigError("dtype", name, f"expected one of {', '.join(DTYPES.values())} (nccl-tests' names) "
                                         f"or {', '.join(DTYPES)}")
    return canon


def backend_op(backend: str, op: str) -> str:
    """The collective ``backend`` actually executes for ``op`` (gloo: reduce_scatter is an all_reduce)."""
    if "gloo" in backend and op == "reduce_scatter":
        return "all_reduce"
    return op


def op_count(op: str, size_bytes: int, n: int, element_bytes: int) -> tuple[int, int]:
    """(count, size_bytes) nccl-tests prints for a requested ``size_bytes`` of ``op`` over ``n`` ranks.

    ``op_count('all_gather', 64, 12, 4) == (1, 48)``: 16 floats, 1 per rank, 48 bytes gathered (as in the
    V100 x12 all_gather log). count is the count argument of the NCCL call (per rank for all_gather,
    reduce_scatter, all_to_all).
    """
    if op not in OPS:
        raise ConfigError("op", op, f"expected one of {', '.join(OPS)}")
    c = size_bytes // element_bytes
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        per_rank = c // n
        return per_rank, per_rank * n * element_bytes
    return c, c * element_bytes


def message_sizes(min_bytes: int, max_bytes: int, step_factor: float = 2.0, step_bytes: int = MiB) -> list[int]:
    """nccl-tests' size loop: ``min, min*f, ...`` up to ``max`` (``-f``), or ``min, min+i, ...`` when f == 1 (``-i``)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise ConfigError("sizes", f"-b {min_bytes} -e {max_bytes}", "need 1 <= minbytes (-b) <= maxbytes (-e)")
    if step_factor < 1 or (step_factor == 1 and step_bytes < 1):
        raise ConfigError("step", f"-f {step_factor} -i {step_bytes}", "need -f > 1, or -f 1 with -i >= 1")
    sizes: list[int] = []
    size: float = min_bytes
    while size <= max_bytes:
        sizes.append(int(size))
        size = size * step_factor if step_factor > 1 else size + step_bytes
    return sizes


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepConfig:
    """What to measure; defaults follow nccl-tests where it has one (sizes: 8 B to 64 MiB, factor 2)."""

    ops: tuple[str, ...] = OPS
    """Collectives to measure, in order."""
    min_bytes: int = 8
    """``-b``: smallest size."""
    max_bytes: int = 64 * MiB
    """``-e``: largest size."""
    step_factor: float = 2.0
    """``-f``: multiply the size by this; 1 means add ``step_bytes``."""
    step_bytes: int = MiB
    """``-i``: size increment when ``step_factor`` is 1."""
    iters: int | None = None
    """``-n``: timed iterations per size; None: by ``time_budget_s``."""
    warmup_iters: int = 5
    """``-w``: untimed iterations before each size."""
    time_budget_s: float = 0.2
    """Timed seconds per size when ``iters`` is None (clamped to ``min_iters``..``max_iters`` iterations)."""
    min_iters: int = 10
    max_iters: int = 1000
    check: bool = True
    """``-c``: verify every result on every rank."""
    dtype: str = "fp32"
    """``-d``: element type (commscope's names; nccl-tests' ``float``, ``half`` ... are accepted)."""
    redop: str = "sum"
    """``-o``: reduction of all_reduce, reduce_scatter, reduce."""
    root: int = 0
    """``-r``: root of broadcast and reduce, as an index in the group."""
    average: int = 3
    """``-a``: how ranks' times combine: 0 rank 0, 1 average (nccl-tests' default), 2 min, 3 max (default)."""
    group_sizes: tuple[int, ...] | None = None
    """``--groups``: sizes of the subgroups to measure on; None: the whole world."""
    group_mode: Literal["concurrent", "sequential"] = "concurrent"
    """Whether the groups of one size run at once or one after another (see the module docstring)."""
    noisy_cv: float = 0.2
    """Rows whose coefficient of variation exceeds this are flagged ``noisy``."""
    inject_error_rank: int | None = None
    """For tests: this global rank corrupts one element of its checked output, so ``check`` must fail."""

    def __post_init__(self) -> None:
        bad = [op for op in self.ops if op not in OPS]
        if bad or not self.ops:
            raise ConfigError("ops", ",".join(self.ops), f"expected a comma-separated subset of {', '.join(OPS)}")
        message_sizes(self.min_bytes, self.max_bytes, self.step_factor, self.step_bytes)
        if self.iters is not None and not 1 <= self.iters <= MAX_ITERS:
            raise ConfigError("iters", self.iters, f"-n must be 1-{MAX_ITERS:,} timed iterations per size (nccl-tests' "
                                                   "default is 20; without -n, --time-budget picks 10-1000)")
        if not 0 <= self.warmup_iters <= MAX_ITERS:
            raise ConfigError("warmup_iters", self.warmup_iters, f"-w must be 0-{MAX_ITERS:,} warm-up iterations "
                                                                 "per size (default 5)")
        if not 1 <= self.min_iters <= self.max_iters <= MAX_ITERS:
            raise ConfigError("min_iters", (self.min_iters, self.max_iters),
                              f"need 1 <= min_iters <= max_iters <= {MAX_ITERS:,}")
        if not self.time_budget_s > 0:
            raise ConfigError("time_budget_s", self.time_budget_s, "must be > 0")
        if not self.noisy_cv > 0:
            raise ConfigError("noisy_cv", self.noisy_cv, "--noisy-cv must be > 0: rows whose coefficient of variation "
                                                         "(std / mean of the iteration times) exceeds it are flagged "
                                                         "noisy (default 0.2)")
        if self.redop not in REDOPS:
            raise ConfigError("redop", self.redop, f"-o expects one of {', '.join(REDOPS)}")
        if self.average not in AVERAGE_MODES:
            raise ConfigError("average", self.average, "-a expects 0 (rank 0), 1 (avg), 2 (min) or 3 (max)")
        if self.group_mode not in ("concurrent", "sequential"):
            raise ConfigError("group_mode", self.group_mode, "expected concurrent or sequential")
        if self.root < 0:
            raise ConfigError("root", self.root, "-r must be >= 0")
        if self.group_sizes is not None and (not self.group_sizes or min(self.group_sizes) < 2):
            raise ConfigError("groups", self.group_sizes, "group sizes must be >= 2")
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))

    @property
    def sizes(self) -> list[int]:
        return message_sizes(self.min_bytes, self.max_bytes, self.step_factor, self.step_bytes)


def check_world(cfg: SweepConfig, world: int, backend: str) -> tuple[int, ...]:
    """The group sizes ``cfg`` measures on ``world`` ranks of ``backend``; ConfigError where it cannot run."""
    sizes_g = cfg.group_sizes or (world,)
    for g in sizes_g:
        if g < 2 or g > world or world % g:
            raise ConfigError("groups", g, f"group sizes must be >= 2 and divide the number of ranks, {world}")
    if cfg.root >= min(sizes_g) and any(op in _ROOTED for op in cfg.ops):
        raise ConfigError("root", cfg.root, f"-r must be < the smallest group size, {min(sizes_g)}")
    if cfg.redop == "avg" and "nccl" not in backend and any(op in _REDUCING for op in cfg.ops):
        raise ConfigError("redop", "avg", f"needs NCCL; backend {backend} supports sum, prod, min, max")
    check_measurable(cfg, tuple(sizes_g))
    return tuple(sizes_g)


def buffer_bytes(op: str, size_bytes: int, n: int, element_bytes: int) -> int:
    """Bytes of the buffers one rank allocates to run ``op`` at nccl-tests' ``size_bytes`` over ``n`` ranks, as the
    sweep allocates them: all_reduce, broadcast, reduce work in place (one buffer of the size); all_gather holds its
    input (1/n) and the gathered output, reduce_scatter the input and its 1/n output, all_to_all and sendrecv a send
    and a receive buffer. ``buffer_bytes('all_gather', 1024, 4, 4) == 1280``."""
    count, size = op_count(op, size_bytes, n, element_bytes)
    if op in ("all_gather", "reduce_scatter"):
        return size + count * element_bytes
    if op in ("all_to_all", "sendrecv"):
        return 2 * size
    return size


def available_memory_bytes() -> int | None:
    """Memory this machine can still give without swapping (Linux ``MemAvailable``), else its free pages; None
    when neither can be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_memory(cfg: SweepConfig, group_sizes: Sequence[int], ranks_here: int, backend: str,
                 available_bytes: int | None = None) -> None:
    """ConfigError, before any rank starts, when the largest row's buffers on every rank of this host together
    exceed the memory this machine has available (``available_bytes``, default :func:`available_memory_bytes`):
    the kernel would kill a rank (SIGKILL) mid-sweep. Buffers in host memory only: NCCL's are on the GPUs."""
    if "nccl" in backend:
        return
    available = available_memory_bytes() if available_bytes is None else available_bytes
    if available is None:
        return
    element_bytes = dtype_bytes(cfg.dtype)
    largest = cfg.sizes[-1]
    per_rank, op, n = max((buffer_bytes(op, largest, n, element_bytes), op, n) for op in cfg.ops for n in group_sizes)
    need = per_rank * ranks_here
    if need > available:
        raise ConfigError("maxbytes", cfg.max_bytes,
                          f"the sweep's largest size, {format_bytes(largest)}: {op} over {n} ranks needs "
                          f"{format_bytes(per_rank)} of buffers per rank (input and output) x {ranks_here} ranks on this "
                          f"host = {format_bytes(need)}, but this machine has {format_bytes(available)} available; give "
                          "a smaller -e")


def smallest_size_bytes(op: str, n: int, element_bytes: int) -> int:
    """The smallest message ``op`` over ``n`` ranks can move: one element (per rank where the buffer is split
    among the ranks: all_gather, reduce_scatter, all_to_all). ``smallest_size_bytes('all_gather', 4, 4) == 16``."""
    return element_bytes * (n if op in ("all_gather", "reduce_scatter", "all_to_all") else 1)


def check_measurable(cfg: SweepConfig, group_sizes: Sequence[int]) -> None:
    """ConfigError when some op and group size of ``cfg`` has no size in -b..-e that holds one element (nccl-tests
    prints such sizes as zero-byte rows; a sweep of only those measures nothing)."""
    element_bytes = dtype_bytes(cfg.dtype)
    sizes = cfg.sizes
    for op in cfg.ops:
        for n in group_sizes:
            if all(op_count(op, size, n, element_bytes)[0] == 0 for size in sizes):
                need = smallest_size_bytes(op, n, element_bytes)
                per_rank = " per rank" if need > element_bytes else ""
                span = f"{sizes[0]} B" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]} B"
                raise ConfigError("sizes", f"-b {cfg.min_bytes} -e {cfg.max_bytes}",
                                  f"{op} of {DTYPES[cfg.dtype]} over {n} ranks needs messages of at least {need} B "
                                  f"(one {element_bytes}-byte element{per_rank}); {span} holds none, so nothing would "
                                  f"be measured: give -b and -e of at least {need}")



def parse_sizes_arg(text: str | int) -> int:
    """``-b``/``-e``/``-i`` values: bytes with K/M/G suffixes (binary, as nccl-tests)."""
    try:
        return parse_size_bytes(text)
    except ValueError as exc:
        raise ConfigError("size", text, str(exc).split(": ", 1)[-1]) from None
