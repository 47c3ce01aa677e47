"""``commscope record --out logs -- <command>``: record every communication op of a job you launch."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from commscope.cli.common import out_path

_SITECUSTOMIZE = '''# written by `commscope record`: start recording in every Python process of the job
try:
    import commscope.measure.capture.recorder as _r
    _r.install_from_env()
except ImportError as _exc:  # commscope or torch missing in this interpreter: run unrecorded, say so once
    import sys as _sys
    print(f"commscope record: not recording this process: {_exc}", file=_sys.stderr)
'''


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a torch.distributed job and record every communication op",
                       description="Run COMMAND (python train.py, torchrun ..., srun ...) with recording on: each rank "
                                   "writes OUT/rank#####.jsonl. Works with any backend the job asks for.")
    p.add_argument("--out", type=out_path, required=True, help="directory for the per-rank logs")
    p.add_argument("--force", action="store_true",
                   help="replace a recording of an earlier run in --out (default: refuse, naming its files)")
    from commscope.cli.common import add_model_args, add_parallel_args

    add_model_args(p)  # optional: the job, saved beside the logs (model.toml, parallel.toml) for `compare logs/`
    add_parallel_args(p)
    p.add_argument("job", nargs=argparse.REMAINDER, metavar="command", help="the command, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import shutil

    from commscope.errors import ConfigError

    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("command", "", "give the job to run after --, e.g. commscope record --out logs -- torchrun train.py")
    from commscope.measure.capture.recorder import RECORDING_FILES
    from commscope.cli.common import check_out_dir
    from commscope.cli.outputs import claim_dir

    check_out_dir(args.out)
    import commscope.measure.capture.pg  # noqa: F401  (needs torch: where it is missing, said before a folder is made)

    if shutil.which(command[0]) is None:  # before anything is written: no empty log folder left behind
        raise ConfigError("command", command[0], "not found on PATH")
    job = _job(args)  # checked (tp divides the heads, ...) before the job starts, saved once it may
    # one run records into a folder (the job's ranks share this claim), never beside an earlier recording
    with claim_dir(args, args.out, RECORDING_FILES, what="a recording") as claim:
        return _record(args, command, job, claim.env)


def _record(args: argparse.Namespace, command: list[str], job, claim_env: dict[str, str]) -> int:
    import uuid

    from commscope.measure.capture.pg import RUN_ID_ENV
    from commscope.measure.capture.recorder import mark_failed

    if job is not None:
        from commscope.cli.common import write_job

        write_job(args.out, *job)
    with tempfile.TemporaryDirectory(prefix="commscope-record-") as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env = dict(os.environ, **claim_env)
        env["COMMSCOPE_RECORD"] = str(args.out.resolve())
        env[RUN_ID_ENV] = uuid.uuid4().hex  # every rank's header names the run: logs of two runs are told apart
        env["PYTHONPATH"] = os.pathsep.join([hook_dir] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        proc = subprocess.Popen(command, env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # Ctrl-C reached the job too (same process group): let its ranks close their logs
            try:
                code = proc.wait(timeout=30)
            except (KeyboardInterrupt, subprocess.TimeoutExpired):
                proc.kill()
                code = proc.wait()
            mark_failed(args.out, "was interrupted (Ctrl-C)", rank=None, exitcode=code)
            print(f"commscope record: interrupted; the logs written so far are in {args.out}", file=sys.stderr)
            return 130
    logs = list(args.out.glob("rank*.jsonl"))
    if code != 0:  # a rank that raised has said so itself (failure.json); else the command's status is all there is
        mark_failed(args.out, f"exited with status {code}", rank=None, exitcode=code)
    if not logs:
        print(f"commscope record: no op was recorded (exit status {code}): the command started no "
              "torch.distributed process group in a Python process", file=sys.stderr)
        return code if code else 1
    stopped = sorted(p.name for p in logs if not p.with_suffix(".done").exists())
    if code == 0 and stopped:  # the job finished, its recording did not (a full disk): said once, for all ranks
        full = _disk_full(args.out)
        print(f"commscope record: error: the recording of {len(stopped)} of {len(logs)} rank(s) stopped before the "
              f"job ended ({stopped[0]} has no completion marker"
              + ("; no space left on device: the disk is full" if full else "") + "); the logs keep what was "
              f"written before it, and readers report them unfinished: {args.out}", file=sys.stderr)
        return 2
    saved = job[1] if job is not None else None  # the parallelism saved beside the logs, if any
    if saved is not None and saved.world_size != len(logs):
        print(f"commscope record: warning: {len(logs)} rank log(s), but the saved parallel.toml says "
              f"tp x pp x dp x cp = {saved.world_size} ranks: fix {args.out / 'parallel.toml'} before comparing",
              file=sys.stderr)
    print(f"commscope record: {len(logs)} rank log(s) in {args.out} (exit status {code}"
          f"{'' if code == 0 else ': the job failed, see failure.json'})", file=sys.stderr)
    return code


def _disk_full(folder: Path) -> bool:
    """Whether the filesystem of ``folder`` has no block left for an unprivileged writer."""
    try:
        return os.statvfs(folder).f_bavail == 0
    except OSError:
        return False


def _job(args: argparse.Namespace):
    """(model, parallel) to save beside the logs when the job's model or parallelism flags are given (``compare``
    finds them), each None when not given; None when neither is. Raises ConfigError for a job Megatron would
    refuse."""
    from commscope.cli.common import _given, resolve_model, resolve_parallel

    has_model = args.model is not None or bool(_given(args, "model"))
    has_parallel = args.parallel is not None or bool(_given(args, "parallel"))
    if not (has_model or has_parallel):
        return None
    model = resolve_model(args) if has_model else None
    parallel = resolve_parallel(args) if has_parallel else None
    if model is not None and parallel is not None:
        from commscope.pattern.workload.dense import check_job

        check_job(model, parallel)
    return model, parallel
