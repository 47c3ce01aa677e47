"""Outputs are written beside their target and renamed into place, never through a link; one run claims an output
(issue 36). Real files, real processes (a claim held by another process, a writer killed with SIGKILL), and a real
full filesystem where this machine lets an unprivileged user mount one (``unshare -rm``; skipped otherwise)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from commscope.errors import ConfigError
from commscope.io.atomic import TMP_PREFIX, OutputSet, atomic_path, open_append, sweep, write_new_text, write_text
from commscope.io.claim import CLAIM_ENV, claim_file, claim_folder, claimed_for_me, lock_path, share_folder
from tmpfs import on_tmpfs

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_write_replaces_the_file_whole_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    target.chmod(0o640)
    write_text(target, "new")
    assert target.read_text() == "new" and (target.stat().st_mode & 0o777) == 0o640  # the mode it had
    assert _left(tmp_path) == []


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "ops.jsonl"
    target.write_text("the earlier run's log\n")
    with pytest.raises(RuntimeError, match="writer failed"), atomic_path(target) as tmp:
        tmp.write_text("half a reco")
        raise RuntimeError("writer failed")
    assert target.read_text() == "the earlier run's log\n" and _left(tmp_path) == []


def test_an_os_error_names_the_target_not_the_temporary_file(tmp_path):
    target = tmp_path / "traffic.npz"
    with pytest.raises(OSError) as info, atomic_path(target) as tmp:
        raise OSError(28, "No space left on device", str(tmp))
    assert info.value.filename == str(target) and info.value.errno == 28
    assert not target.exists() and _left(tmp_path) == []


def test_never_through_a_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    out = tmp_path / "out"
    out.mkdir()
    (out / "ops.jsonl").symlink_to(victim)
    (out / "dangling.json").symlink_to(tmp_path / "nowhere")
    for name in ("ops.jsonl", "dangling.json"):
        with pytest.raises(ConfigError, match=f"{name}'.*is a symbolic link"):
            write_text(out / name, "x")
        with pytest.raises(ConfigError, match="symbolic link"):
            write_new_text(out / name, "x")
        with pytest.raises(ConfigError, match="symbolic link"), OutputSet(out) as files:
            files.path(name)
    with pytest.raises(ConfigError, match="symbolic link"):
        open_append(out / "ops.jsonl", create=False)
    assert victim.read_text() == "the user's file" and not (tmp_path / "nowhere").exists()


def test_a_link_planted_while_the_data_is_written_is_refused(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's file")
    target = tmp_path / "summary.json"
    with pytest.raises(ConfigError, match="symbolic link"), atomic_path(target) as tmp:
        tmp.write_text("{}")
        target.symlink_to(victim)
    assert victim.read_text() == "the user's file" and os.path.islink(target)


def test_a_device_is_no_output(tmp_path):
    with pytest.raises(ConfigError, match="not a regular file"):
        write_text("/dev/null", "x")


def test_an_output_set_renames_all_or_nothing(tmp_path):
    (tmp_path / "a.csv").write_text("old a")
    (tmp_path / "b.csv").write_text("old b")
    with pytest.raises(ValueError), OutputSet(tmp_path) as files:
        files.write_text("a.csv", "new a")
        files.path("b.csv").write_text("new b, half")
        raise ValueError("the third file could not be written")
    assert (tmp_path / "a.csv").read_text() == "old a" and (tmp_path / "b.csv").read_text() == "old b"
    assert _left(tmp_path) == []
    with OutputSet(tmp_path) as files:
        files.write_text("a.csv", "new a")
        files.path("c.png").write_bytes(b"png")
        files.path("d.png")
        files.drop("d.png")  # its writer gave up: never an empty file in place
    assert files.written == [tmp_path / "a.csv", tmp_path / "c.png"]
    assert (tmp_path / "a.csv").read_text() == "new a" and not (tmp_path / "d.png").exists()


def test_write_new_text_keeps_the_first(tmp_path):
    target = tmp_path / "failure.json"
    assert write_new_text(target, "first\n") is True
    assert write_new_text(target, "second\n") is False
    assert target.read_text() == "first\n" and _left(tmp_path) == []


def test_a_log_is_never_appended_to_another_runs(tmp_path):
    log = tmp_path / "rank00000.jsonl"
    with open_append(log, create=True) as fh:
        fh.write("a\n")
    with pytest.raises(FileExistsError):
        open_append(log, create=True)
    with open_append(log, create=False) as fh:  # reopened by its own writer
        fh.write("b\n")
    assert log.read_text() == "a\nb\n"


def _hold(target: Path, kind: str, names: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """Another process that claims ``target`` (a folder: with the output ``names`` it writes there) and holds it
    until killed; returns once it holds it."""
    how = f"claim_folder(Path({str(target)!r}), names={names!r})" if kind == "folder" else \
        f"claim_file(Path({str(target)!r}))"
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from commscope.io.claim import claim_file, claim_folder
        claim = {how}
        print("held", flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
    out = tmp_path / "out"
    holder = _hold(out, "folder")
    try:
        with pytest.raises(ConfigError) as info:
            claim_folder(out, field="record")
        text = str(info.value)
        assert text.startswith(f"record='{out}': is being written by another commscope run (pid {holder.pid}")
        assert "choose another directory" in text
        with pytest.raises(ConfigError, match="being written by another commscope run"):
            share_folder(out)  # a recording process of another job
    finally:
        _stop(holder)
    with claim_folder(out) as claim:  # the kernel released it with the process
        assert claim.lock == lock_path(out, folder=True)
    assert not lock_path(out, folder=True).exists()


def test_a_file_claim_is_per_file(tmp_path):
    holder = _hold(tmp_path / "b.json", "file")
    try:
        with pytest.raises(ConfigError, match=r"out='.*b\.json': is being written by another commscope run"):
            claim_file(tmp_path / "b.json")
        claim_file(tmp_path / "c.json").release()  # another file of the same folder is another output
    finally:
        _stop(holder)


def test_a_claim_is_handed_to_the_jobs_ranks(tmp_path, monkeypatch):
    out = tmp_path / "logs"
    with claim_folder(out) as claim:
        assert not claimed_for_me(out)
        monkeypatch.setenv(CLAIM_ENV, claim.env[CLAIM_ENV])
        assert claimed_for_me(out)
        assert not claimed_for_me(tmp_path / "other")
        monkeypatch.setenv(CLAIM_ENV, claim.env[CLAIM_ENV].replace(claim.token, "0" * 16))
        assert not claimed_for_me(out)  # a token of another run


def test_a_killed_writer_leaves_the_old_file_and_its_temporary_file_is_swept(tmp_path):
    target = tmp_path / "big.json"
    target.write_text("the earlier run\n")
    code = textwrap.dedent(f"""
        from pathlib import Path
        from commscope.io.atomic import atomic_path
        from commscope.io.claim import claim_file
        claim = claim_file(Path({str(target)!r}))
        with atomic_path(Path({str(target)!r})) as tmp:
            with open(tmp, "w") as fh:
                fh.write("x" * 100000)
                fh.flush()
                print("writing", flush=True)
                import time; time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": SRC})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    _stop(proc)
    assert target.read_text() == "the earlier run\n"
    left = [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert len(left) == 1 and left[0].name.endswith("-big.json")
    with claim_file(target):  # the next run's claim removes what the killed one left
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(TMP_PREFIX)]
    assert sweep(tmp_path) == []


def test_a_full_disk_leaves_the_old_file_or_nothing(tmp_path):
    """A 64 KiB tmpfs: the first write fits, the second does not and leaves the first whole."""
    mnt = tmp_path / "mnt"
    code = textwrap.dedent(f"""
        import sys
        from commscope.io.atomic import write_text
        write_text({str(mnt / 'a.txt')!r}, "first\\n")
        try:
            write_text({str(mnt / 'a.txt')!r}, "y" * 200000)
        except OSError as exc:
            print(exc.errno, exc.filename)
        import os
        print(open({str(mnt / 'a.txt')!r}).read().strip(), sorted(os.listdir({str(mnt)!r})))
    """)
    script = tmp_path / "fill.py"
    script.write_text(code)
    run = on_tmpfs(mnt, "64k", [[sys.executable, str(script)]])
    assert run.stdout.splitlines() == [f"28 {mnt / 'a.txt'}", "first ['a.txt']", "rc=0"], run.stderr



def test_an_output_set_on_a_full_disk_names_the_file(tmp_path):
    """A text file of an OutputSet (traffic's summary.json, Chakra's comm_group.json) that fills the disk: the error
    named no file, as a write's error names none."""
    mnt = tmp_path / "mnt"
    code = textwrap.dedent(f"""
        import os
        from commscope.io.atomic import OutputSet
        try:
            with OutputSet({str(mnt)!r}) as out:
                out.write_text("small.json", "{{}}")
                out.write_text("summary.json", "y" * 200000)
        except OSError as exc:
            print(exc.errno, exc.filename)
        print(sorted(os.listdir({str(mnt)!r})))
    """)
    script = tmp_path / "fill.py"
    script.write_text(code)
    run = on_tmpfs(mnt, "64k", [[sys.executable, str(script)]])
    assert run.stdout.splitlines() == [f"28 {mnt / 'summary.json'}", "[]", "rc=0"], run.stdout + run.stderr


def test_a_file_claim_and_a_folder_claim_on_one_file_refuse_each_other(tmp_path):
    """``report --out d/ops.jsonl`` beside ``traffic --out d``: a file's claim and a folder's are two locks, so
    each run once let the other write ops.jsonl. A folder claim names the files it writes; a file of those names
    in a claimed folder is refused, and so is a folder whose such file is claimed. Other files stay free."""
    out = tmp_path / "d"
    holder = _hold(out, "folder", ("ops.jsonl", "*.png"))
    try:
        with pytest.raises(ConfigError) as info:
            claim_file(out / "ops.jsonl", field="out")
        text = str(info.value)
        assert text.startswith(f"out='{out / 'ops.jsonl'}': is among the files another commscope run writes in {out} "
                               f"(pid {holder.pid}"), text
        with pytest.raises(ConfigError, match="is among the files"):
            claim_file(out / "heatmap.png")
        claim_file(out / "r.html").release()  # not one of its names: another output
    finally:
        _stop(holder)
    claim_file(out / "ops.jsonl").release()  # the folder's writer is gone
    holder = _hold(out / "ops.jsonl", "file")
    try:
        with pytest.raises(ConfigError) as info:
            claim_folder(out, field="out", names=("ops.jsonl",))
        assert f"its file ops.jsonl is being written by another commscope run (pid {holder.pid}" in str(info.value)
        claim_folder(out, names=("traffic.csv",)).release()
    finally:
        _stop(holder)

