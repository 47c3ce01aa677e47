"""Named unit constants. Formulas use these instead of bare powers of ten.

Everything inside commscope is SI: bytes, seconds, bytes per second, FLOP per second.
Human units (GB/s, MiB, us) appear only where values are read from files or shown.
"""

from __future__ import annotations

KB = 1_000
MB = 1_000_000
GB = 1_000_000_000
TB = 1_000_000_000_000

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
TiB = 1 << 40

US = 1e-6  # one microsecond, in seconds
MS = 1e-3  # one millisecond, in seconds
NS = 1e-9  # one nanosecond, in seconds

TFLOP = 1e12  # FLOP
GBIT = 1e9 / 8  # one gigabit, in bytes (for link rates given in Gb/s)

#: Bytes per element of each dtype commscope knows, by the names torch and Megatron use.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "tf32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "float8": 1,
    "int8": 1,
    "uint8": 1,
    "int32": 4,
    "int64": 8,
    "float64": 8,
    "fp64": 8,
}

#: Canonical short names.
_CANONICAL = {
    "float32": "fp32",
    "float16": "fp16",
    "bfloat16": "bf16",
    "float8": "fp8",
    "float64": "fp64",
}


def canonical_dtype(name: str) -> str:
    """Return the short canonical name of a dtype (``bfloat16`` -> ``bf16``); raise for unknown names."""
    if isinstance(name, str) and name in _AS_WRITTEN:  # a name as the tables spell it (most calls)
        return _AS_WRITTEN[name]
    key = str(name).strip().lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; valid: {', '.join(sorted({_CANONICAL.get(k, k) for k in DTYPE_BYTES}))}")
    return _CANONICAL.get(key, key)


#: Every name of :data:`DTYPE_BYTES` exactly as written there, to its canonical name.
_AS_WRITTEN = {key: _CANONICAL.get(key, key) for key in DTYPE_BYTES}


def dtype_among(field: str, name: str, allowed: tuple[str, ...], what: str = "valid") -> str:
    """The canonical name of ``name`` when it is one of ``allowed``; else a ConfigError naming ``field`` and
    ``what`` the allowed ones are."""
    from commscope.errors import ConfigError

    try:
        canonical = canonical_dtype(name)
    except ValueError:
        canonical = None
    if canonical not in allowed:
        raise ConfigError(field, name, f"{what}: {', '.join(allowed)}")
    return canonical


def dtype_bytes(name: str) -> int:
    """Bytes per element of ``name`` (``bf16`` -> 2)."""
    return DTYPE_BYTES[canonical_dtype(name)]


_SIZE_SUFFIX = {"": 1, "B": 1, "K": KiB, "KB": KiB, "KIB": KiB, "M": MiB, "MB": MiB, "MIB": MiB, "G": GiB, "GB": GiB, "GIB": GiB, "T": TiB, "TB": TiB, "TIB": TiB}


def parse_size_bytes(text: str | int) -> int:
    """Parse ``8``, ``64K``, ``1M``, ``2G`` (binary multiples, as nccl-tests reads them) into bytes."""
    if isinstance(text, int):
        return text
    s = str(text).strip().upper()
    num = s.rstrip("KMGTIB")
    suffix = s[len(num):]
    if suffix not in _SIZE_SUFFIX or not num:
        raise ValueError(f"cannot read size {text!r}: expected a number with an optional K, M, G or T suffix, e.g. 64M")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"cannot read size {text!r}: expected a number with an optional K, M, G or T suffix, e.g. 64M") from None
    return int(value * _SIZE_SUFFIX[suffix])


def bytes_label(size_bytes: float) -> str:
    """Short binary size for figures, as the CLI and the report page show sizes: ``bytes_label(3 * MiB) == '3 MiB'``,
    ``bytes_label(1.5 * GiB) == '1.50 GiB'`` (three significant digits at most)."""
    v, units = float(size_bytes), ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = 0
    while abs(v) >= 1024 and i < len(units) - 1:
        v /= 1024
        i += 1
    text = f"{v:.0f}" if v == int(v) or abs(v) >= 100 else (f"{v:.1f}" if abs(v) >= 10 else f"{v:.2f}")
    return f"{text} {units[i]}"


def format_bytes(size_bytes: float) -> str:
    """Human-readable binary size: ``format_bytes(3 * MiB) == '3.00 MiB'``."""
    value = float(size_bytes)
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(value) >= scale:
            return f"{value / scale:.2f} {unit}"
    return f"{value:.0f} B"


def divisors(n: int) -> list[int]:
    """Divisors of ``n`` in increasing order, in O(sqrt(n)) steps (``plan --gpus 100000000`` must not loop 10^8
    times). ``divisors(12) == [1, 2, 3, 4, 6, 12]``."""
    import math

    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
