"""Training data of the reference runs: random tokens, or real text tokenised byte by byte.

``--data`` spellings (:func:`parse_data`):

==================  ==========================================================================================
``random``          uniform random token ids (the router has nothing to learn: routing stays uniform)
``text``            the Python standard library's own source files (every Python installation ships them):
                    the ``*.py`` files at the top of ``sysconfig.get_paths()["stdlib"]`` (or the directory of
                    ``os.__file__``), in sorted name order, read until :data:`MAX_CORPUS_BYTES`
``text:PATH``       a text file, or every regular file under a directory (recursively, sorted by path; files
                    with a NUL byte in their first 8 KiB are skipped as binary), up to the same limit
==================  ==========================================================================================

Tokenisation is byte-level: token id = byte value (0-255), as in byte-level language models (ByT5 [byt5-2021]);
the model's vocabulary must hold 256 ids. Nothing is downloaded, and the selection is deterministic: the same
files in the same order give the same corpus, and training sequence windows are drawn from it by a seeded
generator (:func:`sample_windows`), one stream per rank.

Only the standard library and numpy are imported here.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from commscope.errors import ConfigError

#: Largest corpus read (bytes): 4 MiB of the standard library is ~100 files, ~130,000 sequences of 32 bytes.
MAX_CORPUS_BYTES = 4 * 1024 * 1024
#: Token ids of byte-level text: one per byte value.
BYTE_VOCAB = 256
_BINARY_PROBE_BYTES = 8192
_VALID = "valid: random, text (the Python standard library's sources), text:PATH (a file or a directory of text files)"


@dataclass(frozen=True, slots=True, kw_only=True)
class DataSpec:
    """What a reference run trains on (see the module docstring)."""

    kind: Literal["random", "text"]
    path: str | None = None
    """``text``: the user's file or directory; None: the standard library's sources."""

    @property
    def text(self) -> str:
        """The spelling that parses back to this spec."""
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Corpus:
    """A tokenised corpus: ``tokens`` uint8 byte values, and where they came from."""

    tokens: np.ndarray
    files: tuple[str, ...]
    root: str

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def description(self) -> str:
        return f"{self.num_tokens:,} byte tokens from {len(self.files)} file(s) under {self.root}"


def parse_data(text: str) -> DataSpec:
    """``"random"``, ``"text"`` or ``"text:PATH"`` -> DataSpec; ConfigError naming the valid spellings."""
    name, sep, path = str(text).partition(":")
    if name == "random" and not sep:
        return DataSpec(kind="random")
    if name == "text":
        if sep and not path:
            raise ConfigError("data", text, "text:PATH needs a path after the colon; " + _VALID)
        return DataSpec(kind="text", path=path or None)
    raise ConfigError("data", text, _VALID)


def stdlib_directory() -> Path:
    """The standard library's directory (``sysconfig``'s ``stdlib`` path, else where ``os`` lives)."""
    path = Path(sysconfig.get_paths().get("stdlib", ""))
    return path if path.is_dir() and any(path.glob("*.py")) else Path(os.__file__).parent


def corpus_files(spec: DataSpec) -> tuple[Path, list[Path]]:
    """(root, files in reading order) of a ``text`` spec; ConfigError when there is nothing to read."""
    if spec.path is None:
        root = stdlib_directory()
        return root, sorted(root.glob("*.py"), key=lambda p: p.name)
    root = Path(spec.path).expanduser()
    if root.is_file():
        return root.parent, [root]
    if not root.is_dir():
        raise ConfigError("data", spec.text, f"no such file or directory: {root}")
    files = sorted(p for p in root.rglob("*") if p.is_file() and not _is_binary(p))
    if not files:
        raise ConfigError("data", spec.text, f"{root} holds no text files (files without NUL bytes)")
    return root, files


def _is_binary(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return b"\0" in fh.read(_BINARY_PROBE_BYTES)
    except OSError:
        return True


def load_corpus(spec: DataSpec, *, max_bytes: int = MAX_CORPUS_BYTES, min_tokens: int = 2) -> Corpus:
    """The byte tokens of a ``text`` spec's files, concatenated in order up to ``max_bytes``; ConfigError when
    they hold fewer than ``min_tokens`` (one training window)."""
    root, files = corpus_files(spec)
    parts: list[bytes] = []
    used: list[str] = []
    left = max_bytes
    for path in files:
        if left <= 0:
            break
        try:
            with open(path, "rb") as fh:
                data = fh.read(left)
        except OSError as exc:
            raise ConfigError("data", spec.text, f"cannot read {path}: {exc.strerror or exc}") from None
        if b"\0" in data[:_BINARY_PROBE_BYTES]:
            continue
        if data:
            parts.append(data)
            used.append(str(path))
            left -= len(data)
    tokens = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
    if tokens.size < min_tokens:
        raise ConfigError("data", spec.text, f"the corpus holds {tokens.size} bytes; a training sequence needs "
                                             f"{min_tokens} (seq_len + 1)")
    return Corpus(tokens=tokens, files=tuple(used), root=str(root))


def sample_windows(corpus: Corpus, rng: np.random.Generator, count: int, length: int) -> np.ndarray:
    """(count, length) int64 token windows starting at uniformly drawn offsets of the corpus."""
    starts = rng.integers(0, corpus.num_tokens - length + 1, size=count)
    return corpus.tokens[starts[:, None] + np.arange(length)].astype(np.int64)


def check_data(spec: DataSpec, *, vocab_size: int, seq_len: int) -> Corpus | None:
    """Refuse a text spec the model cannot train on (vocabulary too small, corpus too short); returns the corpus
    (None for random tokens)."""
    if spec.kind == "random":
        return None
    if vocab_size < BYTE_VOCAB:
        raise ConfigError("vocab_size", vocab_size, f"byte-level text (--data {spec.text}) needs >= {BYTE_VOCAB} "
                                                    "token ids (one per byte value)")
    return load_corpus(spec, min_tokens=seq_len + 1)


__all__ = ["BYTE_VOCAB", "MAX_CORPUS_BYTES", "Corpus", "DataSpec", "check_data", "corpus_files", "load_corpus",
           "parse_data", "sample_windows", "stdlib_directory"]
