"""docs/architecture.md names only modules that exist, and names every package folder."""

from __future__ import annotations

import re
from pathlib import Path

import commscope

PACKAGE_DIR = Path(commscope.__file__).parent
PAGE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
# a path relative to src/commscope/: a module (x.py, dir/x.py) or a folder (dir/, dir/sub/)
_PATH = re.compile(r"(?<![\w/.-])((?:[a-z_]+/)*[a-z_]+\.py|(?:[a-z_]+/)+)(?![\w/])")


def named_paths(text: str) -> set[str]:
    return set(_PATH.findall(text))


def test_the_page_names_paths_the_way_the_check_reads_them() -> None:
    assert named_paths("`workload/dense.py` and layout.py, presets/gpus/; docs/x.md; a/b") == {
        "workload/dense.py", "layout.py", "presets/gpus/"}


def _exists(path: str) -> bool:
    """A path with a folder exists as written (under src/commscope/, or the repository for docs/ and tests/);
    a bare file name or folder (the picture lists a package's modules and subfolders under it:
    ``estimate/`` then ``compute/``) in some folder."""
    if (PACKAGE_DIR / path).exists() or (PAGE.parents[1] / path).exists():
        return True
    if path.count("/") > 1 or "/" in path.rstrip("/"):
        return False
    return any(PACKAGE_DIR.rglob(path.rstrip("/")))


def test_every_module_the_page_names_exists() -> None:
    paths = named_paths(PAGE.read_text())
    missing = sorted(p for p in paths if not _exists(p))
    assert len(paths) > 30 and not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_folder_is_on_the_page() -> None:
    text = PAGE.read_text()
    folders = sorted(p.name for p in PACKAGE_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()
                     or p.is_dir() and any(p.glob("*.py")))
    absent = [f for f in folders if f"{f}/" not in text]
    assert not absent, f"docs/architecture.md does not place these packages: {absent}"
