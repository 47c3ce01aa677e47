"""Start N torch.distributed ranks on this machine from one Python process, and collect what they return.

    from commscope.measure.launch import spawn

    def work(rank, world_size, scale):
        t = torch.full((4,), float(rank))
        torch.distributed.all_reduce(t)
        return float(t[0]) * scale

    spawn(work, 4, args=(2.0,))          # [12.0, 12.0, 12.0, 12.0], in rank order

Why fork: every rank of a torchrun job imports torch itself (1-3 s of CPU each); on a 2-core machine 8 ranks
take ~16-27 s just to start. Forked children share the parent's already-imported torch (copy-on-write), so
8 ranks start in a fraction of a second and a small job finishes in ~2-10 s. :func:`spawn` imports torch in the
parent before it forks, so no rank imports it again whoever called it. ``fork`` is used where the
platform has it and the backend runs on the CPU; ``spawn`` (children import everything again; ``fn`` must
then be a module-level function) is the fallback, and the choice for NCCL, because a CUDA context does not
survive a fork.

Rendezvous goes through a ``FileStore`` in a fresh temporary directory rather than a TCP port: a port that
looks free can be taken by another process before rank 0 binds it (the classic flaky-test race), and a
``TCPStore`` server in the parent would run a thread across the fork. The store only exchanges addresses;
gloo and NCCL open their own connections (on this machine: loopback) afterwards.

Each child runs ``fn(rank, world_size, *args)`` between ``init_process_group`` and
``destroy_process_group`` with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` set, and one intra-op thread (``torch.set_num_threads(1)``: N ranks share the machine's
cores, and GNU OpenMP's pool must not be used in a child forked from a parent that used it). Results come
back pickled through one pipe per rank; ranks then wait for each other (through the store) before
destroying the group, so that none tears down while a peer is still connecting. If a rank raises, every
rank is stopped and :class:`LaunchError` names the rank and carries its traceback; a rank still running at
``timeout_s`` is killed the same way. A rank that dies without a word (a signal, ``os._exit``) is named before
the ranks that raised because their peer vanished, with how it died (``killed by signal SIGKILL``).

Every rank dies with the launcher: on Linux each asks the kernel for SIGKILL when its parent exits
(``PR_SET_PDEATHSIG``), so a launcher that is killed leaves no ranks behind. ``nproc`` is capped at
:func:`max_local_ranks` (4 per core, at least 8) unless ``oversubscribe``: a mistyped ``--nproc 100000``
must not fork until the machine stops answering.

:func:`ranks_from_env` reads the same variables from a job started by torchrun or Slurm.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from commscope.errors import ConfigError, JobFailed

__all__ = ["LaunchError", "RankEnv", "check_backend", "check_nproc", "max_local_ranks", "ranks_from_env", "spawn"]

#: Seconds a stopped rank gets to exit after SIGTERM before SIGKILL.
_TERM_GRACE_S = 2.0
#: Ranks per core :func:`spawn` starts without ``oversubscribe`` (the tests run 8 ranks on 2 cores).
RANKS_PER_CORE = 4
#: Ranks :func:`spawn` always allows, however few cores.
MIN_LOCAL_RANKS = 8


class LaunchError(JobFailed):
    """A rank failed or hung. ``rank`` is the first rank that failed (None: several hung), ``details`` its traceback,
    ``how`` how it ended (``raised ValueError: ...``, ``killed by signal SIGKILL``, ``exited with code 3``),
    ``exitcode`` its exit status (negative: the signal), ``failed_after`` the ranks that failed or were stopped
    after it, and ``summary`` all of that in one line."""

    def __init__(self, message: str, *, rank: int | None, details: str = "", timed_out: bool = False,
                 how: str = "", exitcode: int | None = None, failed_after: tuple[int, ...] = (),
                 summary: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.details = details
        self.timed_out = timed_out
        self.how = how
        self.exitcode = exitcode
        self.failed_after = failed_after
        self.summary = summary or message.splitlines()[0]


def max_local_ranks() -> int:
    """Ranks this machine runs without ``oversubscribe``: ``RANKS_PER_CORE`` per usable core, at least 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(MIN_LOCAL_RANKS, RANKS_PER_CORE * cores)


def check_nproc(nproc: int, *, oversubscribe: bool = False, field: str = "nproc") -> None:
    """Raise ConfigError unless ``nproc`` ranks can start here (>= 1; <= :func:`max_local_ranks` unless
    ``oversubscribe``)."""
    if nproc < 1:
        raise ConfigError(field, nproc, "must be >= 1")
    limit = max_local_ranks()
    if nproc > limit and not oversubscribe:
        raise ConfigError(field, nproc, f"is more ranks than this machine runs ({os.cpu_count()} cores: at most "
                                        f"{limit} local ranks); pass --oversubscribe to start them anyway")


def check_backend(backend: str, nproc: int = 1) -> None:
    """Raise ConfigError unless this torch has ``backend`` (gloo, nccl, mpi, ucc, or commscope's recording
    backend) and, for NCCL, one GPU per rank."""
    import torch.distributed as dist

    name = backend.lower()
    available = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available,
                 "ucc": getattr(dist, "is_ucc_available", lambda: False)}
    known = [k for k, ok in available.items() if ok()]
    if name in available and not available[name]():
        raise ConfigError("backend", backend, f"this torch {_torch_version()} was built without it; it has "
                                              f"{', '.join(known) or 'no backend'}")
    if name not in available and name != "commscope" and ":" not in name:
        raise ConfigError("backend", backend, f"not a torch.distributed backend; this torch has {', '.join(known)}")
    if name == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < nproc:
            raise ConfigError("backend", backend, f"NCCL needs one GPU per rank: {nproc} rank(s), but this machine "
                                                  f"has {gpus} (use --backend gloo, or fewer ranks)")


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent exits; exit at once if it already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no libc symbol: the parent's own cleanup still stops this rank
            return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def describe_exit(exitcode: int | None) -> str:
    """``killed by signal SIGKILL`` for a negative multiprocessing exit code, ``exited with code 3`` otherwise."""
    if exitcode is None:
        return "was still running"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by signal {name}"
    return f"exited with code {exitcode}"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankEnv:
    """Where this process sits in a job started by torchrun (or Slurm with the same variables)."""

    rank: int
    """Global rank (``RANK``)."""
    world_size: int
    """Number of ranks (``WORLD_SIZE``)."""
    local_rank: int
    """Rank on this node (``LOCAL_RANK``; 0 when unset), e.g. the index of this rank's GPU."""
    local_world_size: int
    """Ranks on this node (``LOCAL_WORLD_SIZE``; ``world_size`` when unset)."""


def ranks_from_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """The torchrun variables of this process, or None when ``RANK``/``WORLD_SIZE`` are not set.

    Raises ConfigError when they are set but are not integers or are inconsistent (rank >= world size).
    """
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    values = {}
    for key, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "0"), ("LOCAL_WORLD_SIZE", None)):
        text = env.get(key, default)
        if text is None:
            continue
        try:
            values[key] = int(text)
        except ValueError:
            raise ConfigError(key, text, "must be an integer (set by torchrun)") from None
    world = values["WORLD_SIZE"]
    if world < 1 or not 0 <= values["RANK"] < world:
        raise ConfigError("RANK", values["RANK"], f"must be in [0, WORLD_SIZE={world})")
    return RankEnv(rank=values["RANK"], world_size=world, local_rank=values["LOCAL_RANK"],
                   local_world_size=values.get("LOCAL_WORLD_SIZE", world))


def _start_method(backend: str) -> str:
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and "nccl" not in backend:
        return "fork"
    return "spawn"


def _child(fn: Callable[..., Any], rank: int, world_size: int, args: Sequence[Any], backend: str, store_path: str,
           timeout_s: float, env: Mapping[str, str], conn: multiprocessing.connection.Connection,
           parent_pid: int) -> None:
    """Body of one rank: init, run, send ("ok", value) or ("error", traceback, when) back, wait for all, destroy."""
    _die_with_parent(parent_pid)
    try:
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1"})
        os.environ.update(env)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        device_id = None
        if "nccl" in backend and torch.cuda.is_available():
            device_id = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device_id)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s), device_id=device_id)
        value = fn(rank, world_size, *args)
        conn.send(("ok", value))
        # Wait for every rank to finish fn before tearing down: gloo's init returns on one rank while a peer
        # may still be completing its connections (no init barrier by default since torch 2.3), and a rank
        # that closed its sockets then makes that peer fail with "connectFullMesh failed: Connection closed
        # by peer" (seen here: 8 of 300 trivial 3-rank jobs on a loaded 2-core machine). Through the store,
        # not the process group, so a recording backend sees no extra collective.
        store.set(f"commscope_launch/done/{rank}", "1")
        store.wait([f"commscope_launch/done/{r}" for r in range(world_size)], timedelta(seconds=timeout_s))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - everything a rank raises goes back to the parent
        # Report before anything closes this rank's connections: peers then fail *after* this moment, so
        # the parent can name the rank that failed first. No destroy_process_group: peers may be stuck in a
        # collective with this rank, and the parent stops them all.
        when = time.time()
        try:
            conn.send(("error", traceback.format_exc(), when))
        except Exception:  # noqa: BLE001, S110 - e.g. a broken pipe; the exit code still tells the parent
            pass
        conn.close()
        os._exit(1)  # skip interpreter teardown: a forked child must not run the parent's atexit hooks
    conn.close()


def _stop(procs: Sequence[Any]) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _TERM_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()


def spawn(fn: Callable[..., Any], nproc: int, *, args: Sequence[Any] = (), backend: str = "gloo",
          timeout_s: float = 120.0, env: Mapping[str, str] | None = None,
          start_method: str | None = None, oversubscribe: bool = False) -> list[Any]:
    """Run ``fn(rank, nproc, *args)`` on ``nproc`` ranks of a fresh process group; return the values in rank order.

    ``backend``: the torch.distributed backend (``gloo``; ``nccl`` puts rank r on ``cuda:r``).
    ``timeout_s``: wall-clock limit for the whole job (start, ``fn`` and teardown); also the process
    group's collective timeout. ``env``: extra environment variables for the ranks.
    ``start_method``: ``fork`` (default where available and the backend is not NCCL) or ``spawn``.
    ``oversubscribe``: allow more than :func:`max_local_ranks` ranks.

    Raises ConfigError for a rank count beyond the machine or a backend this torch lacks, LaunchError (a RuntimeError) naming the failing rank with its traceback, or the hung ranks.
    """
    check_nproc(nproc, oversubscribe=oversubscribe)
    if "commscope" not in backend:  # the recording backend wraps one the job's code checks
        check_backend(backend, nproc)
    if timeout_s <= 0:
        raise ConfigError("timeout_s", timeout_s, "must be > 0")
    method = start_method or _start_method(backend)
    if method == "fork":
        # import torch once, here: forked ranks inherit it; a parent that had not (``bench --backend gloo``,
        # ``tune``) made every rank import it again, 1-3 s of CPU each
        import torch.distributed  # noqa: F401
    ctx = multiprocessing.get_context(method)
    tmpdir = tempfile.mkdtemp(prefix="commscope-launch-")
    store_path = os.path.join(tmpdir, "store")
    procs, conns = [], []
    try:
        for rank in range(nproc):
            parent_end, child_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child,  # type: ignore[attr-defined]  # typeshed's BaseContext lacks Process name=f"commscope-rank-{rank}", daemon=True,
                            args=(fn, rank, nproc, tuple(args), backend, store_path, timeout_s, dict(env or {}),
                                  child_end, os.getpid()))
            p.start()
            child_end.close()
            procs.append(p)
            conns.append(parent_end)
        values = _collect(procs, conns, timeout_s)
        deadline = time.monotonic() + _TERM_GRACE_S
        for p in procs:  # every value is in: give the ranks a moment to tear down cleanly
            p.join(max(0.0, deadline - time.monotonic()))
        return values
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        shutil.rmtree(tmpdir, ignore_errors=True)


def _died(rank: int, exitcode: int | None) -> tuple[int, float, int, str]:
    """An ``errors`` entry of :func:`_collect` for a rank that ended without sending a result or an error."""
    return (0, time.time(), rank, f"rank {rank} {describe_exit(exitcode)} without returning a result\n")


def _ranks_text(ranks: Sequence[int]) -> str:
    """``0, 1, 2`` for up to 16 ranks, ``0, 1, ..., 99 (100 ranks)`` beyond."""
    if len(ranks) <= 16:
        return ", ".join(map(str, ranks))
    return f"{', '.join(map(str, ranks[:8]))}, ..., {ranks[-1]} ({len(ranks)} ranks)"


def _collect(procs, conns, timeout_s: float) -> list[Any]:
    nproc = len(procs)
    deadline = time.monotonic() + timeout_s
    results: dict[int, Any] = {}
    errors: list[tuple[int, float, int, str]] = []  # (0 died silently / 1 raised, when, rank, text)
    rank_of_conn = {id(c): r for r, c in enumerate(conns)}
    rank_of_sentinel = {p.sentinel: r for r, p in enumerate(procs)}
    pending_conns = list(conns)
    exited: set[int] = set()
    first_error_at: float | None = None
    while len(results) < nproc:
        now = time.monotonic()
        if first_error_at is not None and now - first_error_at > 0.5:
            break  # a short grace to hear from other failing ranks, so the earliest failure is the one named
        if now >= deadline:
            break
        wait_s = deadline - now if first_error_at is None else 0.5 - (now - first_error_at)
        sentinels = [p.sentinel for r, p in enumerate(procs) if r not in exited]
        ready = multiprocessing.connection.wait(pending_conns + sentinels, timeout=max(0.0, wait_s))
        for obj in ready:
            if isinstance(obj, int):  # a process sentinel: that rank exited
                rank = rank_of_sentinel[obj]
                exited.add(rank)
                conn = conns[rank]
                procs[rank].join(_TERM_GRACE_S)  # reap it, so its exit code and closed pipe are visible
                if conn in pending_conns and not conn.poll():  # no message and no EOF (a child of it holds the pipe)
                    pending_conns.remove(conn)
                    errors.append(_died(rank, procs[rank].exitcode))
                    first_error_at = first_error_at or time.monotonic()
                continue
            rank = rank_of_conn[id(obj)]
            pending_conns.remove(obj)
            try:
                message = conns[rank].recv()  # obj, typed as a Connection
            except (EOFError, OSError):  # the rank closed its pipe without a word: it died
                procs[rank].join(_TERM_GRACE_S)
                errors.append(_died(rank, procs[rank].exitcode))
                first_error_at = first_error_at or time.monotonic()
                continue
            if message[0] == "ok":
                results[rank] = message[1]
            else:
                errors.append((1, float(message[2]), rank, str(message[1])))
                first_error_at = first_error_at or time.monotonic()
    if errors:
        # A rank that died without a word (a signal, os._exit) caused the failures its peers then raised
        # ("Connection closed by peer"), whatever the order the parent heard of them: it is named first.
        errors.sort()
        silent, _, rank, text = errors[0]
        after = tuple(r for r in range(nproc) if r != rank and r not in results)
        if silent == 0:
            how = describe_exit(procs[rank].exitcode)
        else:
            last = [ln for ln in text.strip().splitlines() if ln.strip()]
            how = f"raised {last[-1].strip() if last else 'an exception'}"
        also = f"; rank(s) {_ranks_text(after)} failed or were stopped after it" if after else ""
        summary = f"rank {rank} of {nproc} failed first: it {how}{also}"
        raise LaunchError(f"rank {rank} of {nproc} failed{also}:\n{text}", rank=rank, details=text, how=how,
                          exitcode=procs[rank].exitcode if silent == 0 else 1, failed_after=after, summary=summary)
    if len(results) < nproc:
        hung = [r for r in range(nproc) if r not in results]
        raise LaunchError(f"rank(s) {_ranks_text(hung)} of {nproc} still running after timeout_s={timeout_s:g}; "
                          f"all ranks were killed", rank=hung[0] if len(hung) == 1 else None, timed_out=True,
                          how="hung", failed_after=tuple(hung[1:]) if len(hung) == 1 else tuple(hung))
    return [results[r] for r in range(nproc)]
