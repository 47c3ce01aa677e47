"""``commscope record --out logs -- <command>``: record every communication op of a job you launch."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

_SITECUSTOMIZE = '''# written by `commscope record`: start recording in every Python process of the job
try:
    import commscope.capture.recorder as _r
    _r.install_from_env()
except ImportError as _exc:  # commscope or torch missing in this interpreter: run unrecorded, say so once
    import sys as _sys
    print(f"commscope record: not recording this process: {_exc}", file=_sys.stderr)
'''


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record", help="run a torch.distributed job and record every communication op",
                       description="Run COMMAND (python train.py, torchrun ..., srun ...) with recording on: each rank "
                                   "writes OUT/rank#####.jsonl. Works with any backend the job asks for.")
    p.add_argument("--out", type=Path, required=True, help="directory for the per-rank logs")
    from commscope.cli.common import add_model_args, add_parallel_args

    add_model_args(p)  # optional: the job, saved beside the logs (model.toml, parallel.toml) for `compare logs/`
    add_parallel_args(p)
    p.add_argument("job", nargs=argparse.REMAINDER, metavar="command", help="the command, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from commscope.errors import ConfigError

    command = list(args.job)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ConfigError("command", "", "give the job to run after --, e.g. commscope record --out logs -- torchrun train.py")
    from commscope.capture.recorder import check_fresh_logdir
    from commscope.cli.common import check_out_dir

    check_out_dir(args.out)
    check_fresh_logdir(args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    _save_job(args)
    with tempfile.TemporaryDirectory(prefix="commscope-record-") as hook_dir:
        Path(hook_dir, "sitecustomize.py").write_text(_SITECUSTOMIZE)
        env = dict(os.environ)
        env["COMMSCOPE_RECORD"] = str(args.out.resolve())
        env["PYTHONPATH"] = os.pathsep.join([hook_dir] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        try:
            proc = subprocess.run(command, env=env, check=False)
        except FileNotFoundError:
            raise ConfigError("command", command[0], "not found on PATH") from None
    print(f"commscope record: logs in {args.out} (exit status {proc.returncode})", file=sys.stderr)
    return proc.returncode


def _save_job(args: argparse.Namespace) -> None:
    """When the job's model or parallelism flags are given, save them beside the logs (``compare`` finds them)."""
    from commscope.cli.common import _given, resolve_model, resolve_parallel, write_job

    has_model = args.model is not None or bool(_given(args, "model"))
    has_parallel = args.parallel is not None or bool(_given(args, "parallel"))
    if has_model or has_parallel:
        write_job(args.out, resolve_model(args) if has_model else None, resolve_parallel(args) if has_parallel else None)
