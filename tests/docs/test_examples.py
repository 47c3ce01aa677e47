"""The examples of the README and of docs/guide.md run, in the order they are written, from one empty folder as on
a fresh clone, and each describes a job that runs: no example is refused because an earlier one wrote the same
folder, none warns that its job does not fit in memory.

What runs: every line of a code block that starts with ``commscope`` (a continuation ``\\`` joins the next line;
``  # ...`` ends it), in-process through ``commscope.cli.main.main``; a line ``$ commscope ...`` is run and the
lines under it, up to the next ``$``, must be in what it printed; a ``python`` block is run as a script in the
same folder. What does not: lines with a ``<placeholder>`` or an elided ``...`` (templates for a file of your
own), ``pip`` (the environment this runs in), ``torchrun`` lines (inside a cluster job), ``python benchmarks/``
(measurements, docs/performance.md), a Python block that starts ``# in your training script`` and one whose extra
is not installed (a command of an extra alike), and a line naming ``../shared`` on a clone without it (as the
rest of the suite skips).

Commands whose text says they take long run with the smaller sizes of :data:`SMALLER` (fewer steps, iterations
and bytes; the same flags otherwise).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import SHARED

from commscope.cli.main import main

pytest.importorskip("torch")  # the tours record real ranks

ROOT = Path(__file__).resolve().parents[2]

#: (what the docs write, what the test runs): each command the text says takes long (seconds to minutes on two cores)
SMALLER: tuple[tuple[str, str], ...] = (
    ("-b 8 -e 64M -f 2", "-b 8 -e 64K -f 8 -n 5 -w 1"),  # bench's seven ops on 4 ranks: ~1 min
    ("-b 1K -e 4M -f 4", "-b 1K -e 64K -f 8 -n 5 -w 1"),  # the README's sweep
    ("-b 1K -e 1M -f 4", "-b 1K -e 64K -f 8 -n 5 -w 1"),  # the communication scale on 8 ranks
    ("-b 1K -e 64M --out tuning.json", "-b 1K -e 16K -f 4 -n 5 -w 1 --out tuning.json"),  # tune: every backend
    ("-b 1K -e 64K -f 4", "-b 1K -e 16K -f 4 -n 5 -w 1"),  # the benchmark recorded under torchrun
    ("calibrate --nproc 2 --out", "calibrate --nproc 2 -e 1M --time-budget 0.01 --out"),  # 10-40 s
    ("calibrate --nproc 4 --out", "calibrate --nproc 4 -e 1M --time-budget 0.01 --out"),
    ("--steps 400", "--steps 3"),  # the router that learns: ~35-55 s (fitting its switching needs 3)
    ("--iterations 200", "--iterations 30"),
)


@dataclass
class Example:
    where: str
    kind: str  # "command", "transcript", "python"
    text: str
    expected: list[str] = field(default_factory=list)


def examples(path: Path) -> list[Example]:
    """The examples of a Markdown file in order: shell lines of indented or fenced code blocks, and python blocks."""
    out: list[Example] = []
    lines = path.read_text().splitlines()
    fence: str | None = None
    block: list[tuple[int, str]] = []
    previous_blank = True

    def flush_shell(body: list[tuple[int, str]]) -> None:
        transcript = any(raw.strip().startswith("$ ") for _, raw in body)  # then every other line is output
        pending = ""
        for number, raw in body:
            line = raw.strip()
            if pending:
                line, pending = pending + " " + line, ""
            if line.endswith("\\"):
                pending = line[:-1].rstrip()
                continue
            where = f"{path.name}:{number}"
            if line.startswith("$ "):
                out.append(Example(where, "transcript", re.sub(r"\s+#\s.*$", "", line[2:])))
            elif transcript:
                if line and out and out[-1].kind == "transcript":
                    out[-1].expected.append(line)
            elif line.startswith(("commscope ", "pip ", "python ", "torchrun ")):
                for part in re.sub(r"\s+#\s.*$", "", line).split(" && "):  # `install && run`: each on its own
                    out.append(Example(where, "command", part.strip()))

    for number, line in enumerate(lines, start=1):
        if fence is not None:
            if line.startswith("```"):
                if fence == "python":
                    out.append(Example(f"{path.name}:{block[0][0]}", "python", "\n".join(t for _, t in block)))
                else:
                    flush_shell(block)
                fence, block = None, []
            else:
                block.append((number, line))
            continue
        if line.startswith("```"):
            if block:
                flush_shell(block)
            fence, block = line[3:].strip() or "text", []
            continue
        if line.startswith("    ") and (previous_blank or block):
            block.append((number, line[4:]))
            continue
        if block and not line.strip():
            block.append((number, ""))
            continue
        if block:
            flush_shell(block)
            block = []
        previous_blank = not line.strip()
    if block:
        flush_shell(block)
    return out


def _why_not_run(example: Example) -> str | None:
    text = example.text
    if example.kind == "python":
        if text.lstrip().startswith("# in your training script"):
            return "a sketch of your own script"
        for module in re.findall(r"^import (\w+)", text, re.MULTILINE):
            try:
                __import__(module)
            except ImportError:
                return f"the {module} extra is not installed"
        return None
    if re.search(r"<[^>]+>", text) or " ... " in f"{text} ":
        return "a template for a file of your own"
    if text.startswith(("pip ", "python -m pytest")):
        return "the environment this test runs in"
    if text.startswith("torchrun "):
        return "inside a cluster job"
    if text.startswith("python benchmarks/"):
        return "a measurement (docs/performance.md)"
    if "../shared" in text and not SHARED.exists():
        return "needs ../shared beside the checkout"
    for words, module in (("export chakra", "chakra"), ("--format parquet", "pyarrow"), ("export parquet", "pyarrow")):
        if words in text and importlib.util.find_spec(module) is None:
            return f"the {module} extra is not installed"
    return None


def _smaller(command: str) -> str:
    for long, short in SMALLER:
        command = command.replace(long, short)
    return command


def _run(command: str) -> tuple[int, str]:
    """A commscope command in-process: its exit status and everything it printed."""
    argv = shlex.split(command)
    assert argv[0] == "commscope", command
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv[1:])
        except SystemExit as exc:  # argparse's --help and its errors
            code = int(exc.code or 0)
    return code, out.getvalue() + err.getvalue()


def _run_all(path: Path, folder: Path) -> list[str]:
    """Run every example of ``path`` in order in ``folder``; returns the examples not run, with why."""
    skipped = []
    ran = 0
    for example in examples(path):
        why = _why_not_run(example)
        if why is not None:
            skipped.append(f"{example.where}: {why}")
            continue
        ran += 1
        if example.kind == "python":
            done = subprocess.run([sys.executable, "-c", example.text], cwd=folder, capture_output=True, text=True,
                                  timeout=300, check=False)
            assert done.returncode == 0, f"{example.where}: the python example failed:\n{done.stderr[-3000:]}"
            continue
        code, printed = _run(_smaller(example.text))
        if example.kind == "transcript":
            for expected in example.expected:
                assert expected.split(" ...")[0] in printed, f"{example.where}: `{example.text}` did not print " \
                                                              f"{expected!r}:\n{printed[-3000:]}"
            continue
        assert code == 0, f"{example.where}: `{example.text}` exited {code}:\n{printed[-3000:]}"
        assert "does not fit in memory" not in printed, f"{example.where}: the example's job does not fit"
        assert "already holds" not in printed, f"{example.where}: an earlier example wrote the same folder"
    assert ran >= 8, f"{path.name}: only {ran} examples ran"
    return skipped


@pytest.fixture
def fresh_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder, with ../shared beside it when the checkout has one (as on a clone beside it)."""
    folder = tmp_path / "clone"
    folder.mkdir()
    if SHARED.exists():
        os.symlink(SHARED, tmp_path / "shared")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("COLUMNS", "120")
    return folder


def test_the_readme_is_a_front_door_of_at_most_250_lines() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    head = text[:text.index("## ")]  # the two fresh-machine commands come before anything else
    assert 'pip install -e ".[plots]" && commscope traffic --out run/' in head
    assert 'pip install torch==2.13.0 && pip install -e ".[test]" && python -m pytest -q' in head
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).exists(), page
    assert not re.search(r"src/commscope|commscope/\w+/\w+\.py", text)  # module paths move; the guide may name them


def test_the_readmes_examples_run_in_order(fresh_clone: Path) -> None:
    skipped = _run_all(ROOT / "README.md", fresh_clone)
    assert not [s for s in skipped if "template" in s or "shared" in s], skipped  # the tour runs whole


def test_the_guides_examples_run_in_order(fresh_clone: Path) -> None:
    _run_all(ROOT / "docs" / "guide.md", fresh_clone)


def test_examples_are_found_as_written() -> None:
    found = examples(ROOT / "README.md")
    commands = [e.text for e in found if e.kind == "command"]
    assert commands[:2] == ['pip install -e ".[plots]"', "commscope traffic --out run/"]
    assert any(c.startswith("commscope estimate --model llama3-405b") and c.endswith("--overlap-param-gather")
               for c in commands)  # continuation lines joined
