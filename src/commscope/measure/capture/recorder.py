"""Recording a real torch.distributed job: one JSONL log of CommOps per rank.

    with commscope.measure.capture.record("logs/"):      # before init_process_group
        train()

``record`` routes ``init_process_group`` (and every group created from it: ``new_group``, DeviceMesh
dimensions, pipelining's groups) through the ``commscope`` backend, which wraps the backend the job asked
for (gloo, or NCCL on GPUs) and records each op. Records are flushed in bounded batches (at most
``batch`` records or ``flush_s`` seconds unwritten), so a crashed job keeps all but its last batch; a
reader skips a truncated final line and says so.

The same works for jobs started by torchrun or Slurm: ``commscope record --out logs -- torchrun ...``
sets ``COMMSCOPE_RECORD`` and puts a ``sitecustomize`` on ``PYTHONPATH`` that calls
:func:`install_from_env` in every rank.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO
from collections.abc import Callable, Iterator

from commscope.measure.capture.oprecord import R_END, R_IN, R_OUT, R_SEQ, R_SHAPE, R_SIZE, R_START, R_STEP, record_fields
from commscope.io.oplog import FAILURE_FILE, STEP_KEY, json_quote

RECORD_ENV = "COMMSCOPE_RECORD"
LOG_FORMAT = "commscope-ops"


#: The files of a recording (a run's rank logs, their completion markers, the failure marker, the job beside them,
#: the routing of a MoE run): what an earlier recording in a folder is made of.
RECORDING_FILES = ("rank*.jsonl", "rank*.jsonl.gz", "rank*.done", FAILURE_FILE, "model.toml", "parallel.toml",
                   "cluster.toml", "routing/routing-rank*.npz", "routing/group*/routing-rank*.npz")


def check_fresh_logdir(logdir: str | os.PathLike, field: str = "out") -> None:
    """Refuse a directory that already holds a recording (``rank*.jsonl``): records are never appended to an
    earlier run's logs, where they would be mixed with it."""
    from commscope.errors import ConfigError

    path = Path(logdir)
    if path.exists() and not path.is_dir():
        raise ConfigError(field, str(path), "is a file, not a directory; give a directory for the rank logs")
    old = sorted(path.glob("rank*.jsonl")) if path.is_dir() else []
    if old:
        raise ConfigError(field, str(path), f"already holds a recording ({old[0].name}, {len(old)} rank log(s)); "
                                            "choose a new directory or remove the old one (recordings are never "
                                            "appended to)")


def write_failure(logdir: Path, error: Any, *, world_size: int) -> None:
    """Leave ``logdir/failure.json`` naming the rank that failed first and how (from a
    :class:`commscope.measure.launch.LaunchError`), so a reader tells it from the ranks stopped because of it. The launcher
    saw every rank end: its marker replaces any a rank left."""
    mark_failed(logdir, error.how, rank=error.rank, exitcode=error.exitcode, world_size=world_size,
                timed_out=error.timed_out, stopped_after=list(error.failed_after), replace=True)


def mark_failed(logdir: Path, how: str, *, rank: int | None, exitcode: int | None = None,
                world_size: int | None = None, timed_out: bool = False, stopped_after: list[int] | None = None,
                replace: bool = False) -> bool:
    """Leave ``logdir/failure.json``: ``rank`` (None when only the launched command's exit status is known), how
    it failed, and the ranks stopped after it. Unless ``replace``, a marker there already stays (the first failure is
    the one to name). True when this call wrote it."""
    from commscope.errors import ConfigError
    from commscope.io.atomic import write_new_text, write_text

    marker = {"rank": rank, "how": how, "exitcode": exitcode, "timed_out": timed_out,
              "stopped_after": stopped_after or [], "world_size": world_size, "time_ns": time.time_ns()}
    text = json.dumps(marker) + "\n"
    try:
        logdir.mkdir(parents=True, exist_ok=True)
        if replace:
            write_text(logdir / FAILURE_FILE, text, field="logdir")
            return True
        return write_new_text(logdir / FAILURE_FILE, text, field="logdir")  # two ranks failing at once leave the first
    except (OSError, ConfigError):  # not writable, a full disk, a link: the failure itself is what the user must hear
        return False


class RankLog:
    """Thread-safe JSONL writer for one rank: the sink the recording process groups hand records to.

    The process groups append finished records (lists, :data:`R_SHAPE` ...) to :attr:`buf` themselves, and on
    issuing an op flush it when :meth:`due` (``len(buf) >= batch`` or the clock past :attr:`flush_due_ns`); anything
    else hands a record over with :meth:`take`."""

    def __init__(self, logdir: Path, *, batch: int = 256, flush_s: float = 1.0, rank: int | None = None,
                 say_stop: bool = True) -> None:
        self.logdir = Path(logdir)
        self.batch = batch
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self.buf: list[Any] = []
        """Records and step lines not yet written (appended without the lock; never replaced, see flush)."""
        self._file: TextIO | None = None
        self.flush_due_ns = time.time_ns() + int(flush_s * 1e9)
        """When the records unwritten by then are written, whatever their number (the wall clock, which the records'
        times read anyway: one stepped back delays this; full batches still go out)."""
        self._num_written = 0
        self.rank: int | None = rank
        """This process's rank: given when known before its first op (a launcher's rank), so that a rank that
        communicates nothing (a world of one) still leaves its log, header and step lines; else read from the first
        op."""
        self._step: int | None = None
        self._step_start_ns: int | None = None  # start of the step being timed (None: no step open)
        self._written = False  # whether this log has written its file (a reopen after close appends to it)
        self.refused = False
        """Whether the folder held this rank's log of another run when it first wrote: the folder is that run's."""
        self._broken: str | None = None  # why this log stopped writing (a full disk): its records are dropped
        self._dropped = 0
        self._say_stop = say_stop  # False: a launcher reports :attr:`stopped` in one line for all its ranks

    @property
    def step(self) -> int | None:
        """Training step the next records belong to (None: setup, before the first step)."""
        return self._step

    @step.setter
    def step(self, index: int | None) -> None:
        from commscope.measure.capture.pg import observe_completions

        observe_completions()  # a step boundary is a moment to look: ops of the last step complete by now
        self.end_step()
        self._step = index
        if index is not None:
            self._step_start_ns = time.time_ns()
        if self.due(time.time_ns()):
            self.flush()

    def end_step(self) -> None:
        """Mark the end of the step being timed (else it ends when the next one starts, or at close): writes its
        step line, ``{"commscope_step": {"step", "t_start_ns", "t_end_ns"}}``. Ops keep the step's tag."""
        if self._step is None or self._step_start_ns is None:
            return
        from commscope.measure.capture.pg import observe_completions

        observe_completions()
        mark = {STEP_KEY: {"step": self._step, "t_start_ns": self._step_start_ns, "t_end_ns": time.time_ns()}}
        self._step_start_ns = None
        self.buf.append(mark)

    # ----- records -----
    def due(self, now_ns: int) -> bool:
        """Whether the records unwritten are to be written now (a full batch, or ``flush_s`` since the last write)."""
        return len(self.buf) >= self.batch or now_ns >= self.flush_due_ns

    def take(self, rec: list) -> None:
        """Take the record of an op seen complete (or, at the end, of one never seen so): a list append (atomic; the
        writer takes the records under its lock and removes only those), and a flush when one is due."""
        self.buf.append(rec)
        if self.due(time.time_ns()):
            self.flush()

    @property
    def stopped(self) -> str | None:
        """Why this log stopped writing before the job ended (``No space left on device (the disk is full):
        logs/rank00000.jsonl``), or None: then it holds every record taken."""
        return self._broken

    @property
    def num_records(self) -> int:
        """Op records taken so far (written or not; step lines not counted)."""
        return self._num_written + sum(1 for rec in list(self.buf) if type(rec) is list)

    def _open(self, rec: list | None) -> None:
        """Open this rank's log (its rank and backend from ``rec``, the first op record, when there is one)."""
        import torch

        fields = rec[R_SHAPE][1] if rec is not None else {}
        if rec is not None:
            self.rank = int(fields["rank"])
        assert self.rank is not None  # from the record, or given
        self.logdir.mkdir(parents=True, exist_ok=True)
        path = self.logdir / f"rank{self.rank:05d}.jsonl"
        from commscope.io.atomic import open_append

        fresh = not self._written
        try:  # never through a link; a new log never appended to another run's
            self._file = open_append(path, create=fresh)
        except FileExistsError:
            from commscope.errors import ConfigError

            self.refused = True
            raise ConfigError("logdir", str(self.logdir), f"already holds {path.name} of an earlier recording; "
                                                          "record into a new directory") from None
        self._written = True
        if not fresh:  # reopened by this log (a late record after close): no second header
            return
        from commscope.measure.capture.pg import run_info

        run = run_info()  # the default group's size: known even after the job destroyed its process groups
        world = run.get("world_size")
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            world = dist.get_world_size() if dist.is_initialized() else world
        header = {"commscope_header": {"format": LOG_FORMAT, "format_version": 1, "kind": "measured", "rank": self.rank,
                                       "world_size": world, "hostname": socket.gethostname(), "pid": os.getpid(),
                                       "torch": torch.__version__, "backend": fields.get("backend"),
                                       "started_ns": time.time_ns()}}
        if run.get("run_id"):
            header["commscope_header"]["run_id"] = run["run_id"]  # every rank of one run has the same
        self._file.write(json.dumps(header) + "\n")
        self._file.flush()

    def _flush_locked(self) -> None:
        buf = self.buf
        batch = buf[:]  # what is there now; records appended meanwhile stay for the next flush
        if batch and self._broken is not None:  # the log stopped (a full disk): the job goes on, unrecorded
            del buf[:len(batch)]
            self._dropped += sum(1 for rec in batch if type(rec) is list)
        elif batch:
            if self._file is None:
                first = next((r for r in batch if type(r) is list), None)
                if first is None and (self.rank is None or self._written):  # step lines only: the rank (and so the
                    return  # file) is known from the first op, unless given
            try:
                if self._file is None:
                    self._open(first)
                assert self._file is not None  # _open opened it
                self._file.write("\n".join(map(_line, batch)) + "\n")
                self._file.flush()
            except OSError as exc:
                self._stop_writing(exc)
                del buf[:len(batch)]
                self._dropped += sum(1 for rec in batch if type(rec) is list)
            else:
                del buf[:len(batch)]
                self._num_written += sum(1 for rec in batch if type(rec) is list)
        self.flush_due_ns = time.time_ns() + int(self.flush_s * 1e9)

    def _stop_writing(self, exc: OSError) -> None:
        """A write failed (a full disk, a quota): say so once, in one line naming the log, and record no more. The
        log keeps what was written before (its last line perhaps cut, which readers skip with a warning) and gets no
        completion marker, so every reader reports it unfinished; the training itself goes on."""
        import errno

        path = self.logdir / f"rank{self.rank:05d}.jsonl"
        full = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        self._broken = f"{exc.strerror or exc}{full}: {path}"
        if self._say_stop:
            print(f"commscope: recording of rank {self.rank} stopped: {self._broken}; {path.name} keeps the records "
                  "written before it", file=sys.stderr)
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
        self._file = None

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        from commscope.measure.capture.pg import finish_inflight, wait_inflight

        wait_inflight(2.0, sink=self)  # ops still in flight: seen complete before the file closes, or
        finish_inflight(sink=self)  # written without a completion time
        self.end_step()
        self.flush()
        with self._lock:
            if self._file is None and not self._written and self.rank is not None and self._broken is None:
                try:
                    self._open(None)  # a rank that logged nothing, known by its launcher: its log says so
                except OSError as exc:
                    self._stop_writing(exc)
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError as exc:
                    self._stop_writing(exc)
                self._file = None
                if self._broken is None:  # the completion marker: a log without it is reported as unfinished
                    from commscope.io.atomic import write_text

                    write_text(self.logdir / f"rank{self.rank:05d}.done", f"{self.num_records}\n", field="logdir")


def _to_commop_dict(rec: dict) -> dict:
    """The recorder's raw record as a CommOp dict (axis unknown until attributed from a layout)."""
    out = {"op": rec["op"], "axis": "other", "group": rec["group"], "size_bytes": rec["size_bytes"],
           "dtype": rec["dtype"], "rank": rec["rank"]}
    for key in ("peer", "splits", "t_start_ns", "t_end_ns", "backend_op"):
        if rec.get(key) is not None:
            out[key] = rec[key]
    extra = {k: rec[k] for k in _EXTRA_KEYS if k in rec and (k != "step" or rec[k] is not None)}  # step None: setup
    out["extra"] = extra
    return out


_EXTRA_KEYS = ("group_name", "seq", "bytes_in", "bytes_out", "backend", "root", "step")
_EXTRA_NAMES = tuple((key, json_quote(key) + ":") for key in _EXTRA_KEYS)


#: (op, id of the group list) -> (the group list, the line up to "size_bytes":); (dtype, rank) -> what follows the
#: size. The process group hands the same group list with every record, so each is built once per group and op.
_HEADS: dict[tuple[str, int], tuple[list, str]] = {}
_MIDS: dict[tuple[str, int], str] = {}
_TAILS: dict[tuple[str, str], tuple[str, str]] = {}


def _head(op: str, group: list) -> str:
    entry = _HEADS.get((op, id(group)))
    if entry is None or entry[0] is not group:
        entry = (group, '{"op":' + json_quote(op) + ',"axis":"other","group":[' + ",".join(map(str, group))
                 + '],"size_bytes":')
        if len(_HEADS) < 4096:
            _HEADS[(op, id(group))] = entry  # keeps the list alive, so its id cannot name another
    return entry[1]


def _line(rec: list | dict) -> str:
    """The log line of a record (a process group's list, :data:`R_SHAPE` ..., or a dict of named fields as
    :func:`record_fields` gives): ``json.dumps(_to_commop_dict(fields), separators=(",", ":"))``, built by hand, the
    recorder's share of each op's cost. A process group's record of the common shape is one %-format of its prepared
    text (:func:`commscope.io.oplog.line_forms`); otherwise the line is assembled from parts cached per group (about
    1 us instead of 4). A step line (:data:`STEP_KEY`) is written as it is."""
    if isinstance(rec, list):
        form = rec[R_SHAPE][0]
        if form is None:
            return _line(record_fields(rec))
        t_end, step = rec[R_END], rec[R_STEP]
        if t_end is not None and step is not None:  # an op of a training step, seen complete: nearly every line
            return form[3] % (rec[R_SIZE], rec[R_START], t_end, rec[R_SEQ], rec[R_IN], rec[R_OUT], step)
        values = [rec[R_SIZE], rec[R_START]] + ([] if t_end is None else [t_end]) + [rec[R_SEQ], rec[R_IN], rec[R_OUT]]
        if step is not None:
            values.append(step)
        return form[(t_end is not None) + 2 * (step is not None)] % tuple(values)
    if STEP_KEY in rec:
        return json.dumps(rec, separators=(",", ":"))
    get = rec.get
    mid = _MIDS.get((rec["dtype"], rec["rank"]))
    if mid is None:
        mid = _MIDS.setdefault((rec["dtype"], rec["rank"]), ',"dtype":' + json_quote(rec["dtype"]) + ',"rank":'
                               + str(rec["rank"]))
    parts = [_head(rec["op"], rec["group"]), str(rec["size_bytes"]), mid]
    if get("peer") is not None:
        parts += (',"peer":', str(rec["peer"]))
    if get("splits") is not None:
        parts += (',"splits":[', ",".join(map(str, rec["splits"])), "]")
    if get("t_start_ns") is not None:
        parts += (',"t_start_ns":', str(rec["t_start_ns"]))
    if get("t_end_ns") is not None:
        parts += (',"t_end_ns":', str(rec["t_end_ns"]))
    if get("backend_op") is not None:
        parts += (',"backend_op":', json_quote(rec["backend_op"]))
    gn, backend = get("group_name"), get("backend")
    if type(gn) is str and type(backend) is str and "seq" in rec and "bytes_in" in rec and "bytes_out" in rec:
        # what every process-group record holds: the constant strings of the group come from a cache
        tail = _TAILS.get((gn, backend))
        if tail is None:
            tail = _TAILS.setdefault((gn, backend), (',"extra":{"group_name":' + json_quote(gn) + ',"seq":',
                                                     ',"backend":' + json_quote(backend)))
        parts += (tail[0], str(int(rec["seq"])), ',"bytes_in":', str(int(rec["bytes_in"])), ',"bytes_out":',
                  str(int(rec["bytes_out"])), tail[1])
        if get("root") is not None:
            parts += (',"root":', str(int(rec["root"])))
        elif "root" in rec:
            parts.append(',"root":null')
        if get("step") is not None:
            parts += (',"step":', str(int(rec["step"])))
        parts.append("}}")
        return "".join(parts)
    sep = ',"extra":{'
    for key, name in _EXTRA_NAMES:
        if key in rec:
            value = rec[key]
            if value is None:
                if key == "step":
                    continue
                text = "null"
            else:
                text = json_quote(value) if isinstance(value, str) else str(int(value))
            parts += (sep, name, text)
            sep = ","
    parts.append("}}" if sep == "," else ',"extra":{}}')
    return "".join(parts)


_ACTIVE: RankLog | None = None
_ORIGINAL_INIT: Callable[..., Any] | None = None


def _patched_init(backend: str | None = None, *args, **kwargs):
    """init_process_group that records: the requested backend becomes the inner one of ``commscope``."""
    from commscope.measure.capture.pg import BACKEND_NAME, INNER_BACKEND_ENV

    requested = kwargs.pop("backend", backend)
    if requested not in (None, BACKEND_NAME):
        name = str(requested).lower()
        inner = "nccl" if "nccl" in name and ("cuda" not in name or "cuda:nccl" in name) else "gloo"
        if "," in name:  # "cpu:gloo,cuda:nccl": one wrapper per process, pick the device the job uses
            import torch

            inner = "nccl" if torch.cuda.is_available() and "nccl" in name else "gloo"
        os.environ[INNER_BACKEND_ENV] = inner
    assert _ORIGINAL_INIT is not None  # start() saved it before patching
    return _ORIGINAL_INIT(BACKEND_NAME, *args, **kwargs)


def start(logdir: str | os.PathLike, *, batch: int = 256, flush_s: float = 1.0) -> RankLog:
    """Start recording into ``logdir`` (call before init_process_group); returns this process's log."""
    global _ACTIVE, _ORIGINAL_INIT
    import torch.distributed as dist

    from commscope.measure.capture import pg

    if dist.is_available() and dist.is_initialized():
        default = dist.group.WORLD
        if not isinstance(default, pg.RecordingProcessGroup):
            raise RuntimeError("commscope.measure.capture.record() must start before torch.distributed.init_process_group(); "
                               "the default process group already exists and cannot be wrapped")
    from commscope.io.claim import claimed_for_me, share_folder

    launched = claimed_for_me(Path(logdir))  # `commscope record` claimed and checked it before the job started
    if not launched:
        check_fresh_logdir(logdir, "logdir")
        share_folder(Path(logdir))  # the ranks of this job share it; another run writing it is refused
    pg.register()
    # a log that stops (a full disk) is said by `commscope record`, once for all ranks; else by the rank itself
    log = RankLog(Path(logdir), batch=batch, flush_s=flush_s, say_stop=not launched)
    pg.set_sink(log)
    _ACTIVE = log
    if _ORIGINAL_INIT is None:
        _ORIGINAL_INIT = dist.init_process_group
        dist.init_process_group = _patched_init
    atexit.register(_close_at_exit, log)
    _mark_uncaught_exceptions()
    return log


def _close_at_exit(log: RankLog) -> None:
    """Close a log as the interpreter ends: a log that cannot be written is one line on stderr, not a traceback
    after the job's own output."""
    from commscope.errors import ConfigError

    try:
        log.close()
    except (ConfigError, OSError) as exc:
        print(f"commscope: recording of this process not closed: {exc}", file=sys.stderr)


def _failed_rank() -> int | None:
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        if dist.is_initialized():
            return int(dist.get_rank())
    rank = os.environ.get("RANK")
    return int(rank) if rank is not None and rank.isdigit() else None


def _note_failure(exc: BaseException) -> None:
    """This rank is ending on an uncaught exception: say so beside the logs (its log still closes, with its
    completion marker: the marker says the log is whole, this file says the job was not)."""
    if _ACTIVE is None or _ACTIVE.refused:  # the folder is another run's: its recording is not this job's to mark
        return
    from commscope.measure.capture.pg import run_info

    what = "was interrupted" if isinstance(exc, KeyboardInterrupt) else f"raised {type(exc).__name__}"
    text = str(exc).strip().splitlines()
    mark_failed(_ACTIVE.logdir, what + (f": {text[0][:200]}" if text else ""), rank=_failed_rank(),
                world_size=run_info().get("world_size"))


_PREVIOUS_EXCEPTHOOK: Callable[..., Any] | None = None


def _excepthook(kind, exc, tb) -> None:
    with contextlib.suppress(Exception):
        _note_failure(exc)
    (_PREVIOUS_EXCEPTHOOK or sys.__excepthook__)(kind, exc, tb)


def _mark_uncaught_exceptions() -> None:
    global _PREVIOUS_EXCEPTHOOK
    if sys.excepthook is not _excepthook:
        _PREVIOUS_EXCEPTHOOK = sys.excepthook
        sys.excepthook = _excepthook


def stop() -> None:
    """Flush and close this process's log and restore init_process_group."""
    global _ACTIVE, _ORIGINAL_INIT
    import torch.distributed as dist

    from commscope.measure.capture import pg

    if _ACTIVE is not None:
        _ACTIVE.close()
        _ACTIVE = None
    pg.set_sink(None)
    if _ORIGINAL_INIT is not None:
        dist.init_process_group = _ORIGINAL_INIT
        _ORIGINAL_INIT = None


@contextlib.contextmanager
def record(logdir: str | os.PathLike, **kwargs: Any) -> Iterator[RankLog]:
    """Record every communication op of this process into ``logdir/rank#####.jsonl``."""
    log = start(logdir, **kwargs)
    try:
        yield log
    except BaseException as exc:  # the job's block failed: said beside the logs before they close
        if not isinstance(exc, SystemExit) or exc.code not in (0, None):
            _note_failure(exc)
        raise
    finally:
        stop()


def step(index: int) -> None:
    """Mark that the ops from now on belong to training step ``index`` (ops before the first mark are setup)."""
    if _ACTIVE is not None:
        _ACTIVE.step = int(index)


def install_from_env() -> None:
    """Start recording when ``COMMSCOPE_RECORD`` names a directory (used by ``commscope record``)."""
    logdir = os.environ.get(RECORD_ENV)
    if logdir:
        start(logdir)
