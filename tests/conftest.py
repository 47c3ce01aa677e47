"""Test helpers shared by every test module.

``../shared`` (beside the checkout, never inside it) holds third-party data: real nccl-tests, Kineto and DeepSpeed
logs from other people's clusters and published figures, whose licences mostly do not allow copying them into this
repository. A test that reads it says so with ``@requires_shared(*parts)`` (or calls ``shared_or_skip(*parts)`` in a
fixture), and is skipped with its reason on a fresh clone without it. CI, which has ``../shared``, sets
``COMMSCOPE_REQUIRE_SHARED=1``: there a missing file fails the test instead of skipping it. Fixtures the project
writes itself live under ``tests/``.

A test that exercises torch carries the marker ``torch``: conftest sets it where a test skips without torch
(``pytest.importorskip("torch")`` in its module, its body or a fixture it uses); a test that runs torch only in the
processes it starts says ``@pytest.mark.torch`` itself, and is skipped here when torch is not installed. ``pytest -m
torch`` selects them all (the recorder, the reference workloads, bench and tune ranks): CI runs that selection a second
time on another torch version.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).parent))  # for `import strategies`

# Property tests draw fresh examples on every local run (that is how they find bugs); the landing gate
# (`.ci/run` sets HYPOTHESIS_PROFILE=ci) draws the same ones every time, so that a merge is judged on its code,
# not on the luck of the draw. A failure found locally becomes an explicit regression test.
settings.register_profile("ci", derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
STRICT_ENV = "COMMSCOPE_REQUIRE_SHARED"


def _missing_reason(parts: tuple[str, ...]) -> str | None:
    """Why ``../shared/<parts>`` cannot be read, or None when it is there."""
    path = SHARED.joinpath(*parts)
    if path.exists():
        return None
    return (f"needs ../shared/{'/'.join(parts)} (third-party data kept beside the checkout, not in this "
            f"repository): {path} not found")


def _strict() -> bool:
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


def requires_shared(*parts: str) -> pytest.MarkDecorator:
    """Mark a test that reads ``../shared/<parts>`` (a file or a folder): skipped with its reason when absent."""
    return pytest.mark.requires_shared(*parts)


def shared_or_skip(*parts: str) -> Path:
    """``../shared/<parts>``, for fixtures and test bodies; when absent, skips (fails under
    ``COMMSCOPE_REQUIRE_SHARED``)."""
    reason = _missing_reason(parts)
    if reason is not None:
        if _strict():
            pytest.fail(f"{reason}; {STRICT_ENV} is set")
        pytest.skip(reason)
    return SHARED.joinpath(*parts)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "requires_shared(*parts): reads ../shared/<parts>; skipped with its reason when that is absent")
    config.addinivalue_line(
        "markers", "torch: exercises torch; set by conftest.py where the test skips without torch, by hand where only "
                   "the processes it starts run torch (then skipped here when torch is not installed)")


_IMPORTS_TORCH = re.compile(r"""importorskip\(\s*["']torch""")


@cache
def _module_imports_torch(path: str) -> bool:
    """Whether a statement at the top level of this file (column 0) skips without torch."""
    text = Path(path).read_text(encoding="utf-8")
    return any(_IMPORTS_TORCH.search(line) for line in text.splitlines() if line[:1] not in ("", " ", "#", "\t"))


def _needs_torch(item: pytest.Item) -> bool:
    """Whether the test skips without torch: in its module, its own body, or a fixture it uses (at any depth)."""
    if not isinstance(item, pytest.Function):
        return False
    if _module_imports_torch(str(item.path)):
        return True
    functions = [item.function]
    for defs in item._fixtureinfo.name2fixturedefs.values():
        functions.extend(d.func for d in defs)
    for function in functions:
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):  # a fixture pytest or a plugin defines without a source file
            continue
        if _IMPORTS_TORCH.search(source):
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    torch_installed = importlib.util.find_spec("torch") is not None
    for item in items:
        if _needs_torch(item):
            item.add_marker(pytest.mark.torch)
        elif not torch_installed and item.get_closest_marker("torch") is not None:
            item.add_marker(pytest.mark.skip(reason="needs torch (the package's torch extra), which is not installed"))
    if _strict():
        return  # pytest_runtest_setup fails them instead
    for item in items:
        for mark in item.iter_markers("requires_shared"):
            reason = _missing_reason(mark.args)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))
                break


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _strict():
        for mark in item.iter_markers("requires_shared"):
            shared_or_skip(*mark.args)
