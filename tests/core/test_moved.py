"""Code written against the module paths before the house move (issue 34) keeps working: every old path gives the
module at its new path, the same object, with one DeprecationWarning that names where to import it from."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from commscope._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_path_is_the_new_module_with_a_warning_naming_it(old: str) -> None:
    new = importlib.import_module(f"commscope.{MOVED[old]}")
    sys.modules.pop(f"commscope.{old}", None)
    with pytest.warns(DeprecationWarning, match=rf"commscope\.{old} moved to commscope\.{MOVED[old]}; import it"):
        module = importlib.import_module(f"commscope.{old}")
    assert module is new
    assert module.__name__ == f"commscope.{MOVED[old]}" and module.__spec__.name == module.__name__


def test_old_from_imports_and_submodules_of_moved_packages_work_in_a_fresh_interpreter() -> None:
    """What a user's script does: ``from old.path import name`` and a submodule of a moved package, in a new
    process (no module cached yet), with warnings shown once each and the script's own output unchanged."""
    script = (
        "import warnings; warnings.simplefilter('always')\n"
        "from commscope.traffic import build_traffic\n"
        "from commscope.capture.recorder import RankLog\n"
        "import commscope.measure.capture.recorder as new\n"
        "from commscope.record import CommOp\n"
        "from commscope.commop import CommOp as CommOpNew\n"
        "assert RankLog is new.RankLog and CommOp is CommOpNew\n"
        "from commscope.estimate import estimate\n"
        "print(build_traffic.__module__, RankLog.__module__)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["commscope.pattern.traffic", "commscope.measure.capture.recorder"]
    warned = [line for line in run.stderr.splitlines() if "DeprecationWarning" in line]
    assert len(warned) == 4, run.stderr  # commscope.capture, then its recorder
    assert any("commscope.capture.recorder moved to commscope.measure.capture.recorder" in w for w in warned)


def test_new_paths_do_not_warn() -> None:
    script = ("import warnings; warnings.simplefilter('error')\n"
              "import commscope, commscope.pattern.traffic, commscope.measure.capture.recorder, commscope.estimate.many\n"
              "from commscope.estimate import estimate\n")
    run = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
