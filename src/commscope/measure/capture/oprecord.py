"""The record a recording process group makes of one op (:mod:`commscope.measure.capture.pg`), as the log
(:class:`commscope.measure.capture.recorder.RankLog`) takes and writes it."""

from __future__ import annotations

from typing import Any

# A recording process group's record of one op is a list, by position (a list literal is the cheapest object to
# make, once per op inside the job's step; a 13-key dict cost ~1 us more with the caches cold):
R_SHAPE, R_SIZE, R_START, R_SEQ, R_IN, R_OUT, R_STEP, R_END, R_WORK, R_SINK = range(10)
"""``R_SHAPE``: ``(line forms, fields)``, made once per process group, op, dtype and backend op and shared by their
records: the writer's prepared line text (:func:`commscope.io.oplog.line_forms`) and the constant fields (``op``,
``group``, ``rank``, ``dtype``, ``backend``, ``group_name``, ``backend_op`` where it differs); for an op with a peer,
splits or a root, ``(None, its own fields)``. Then size_bytes, t_start_ns, seq, bytes_in, bytes_out, the training
step current at issue (None: setup), t_end_ns (None until seen complete), the backend's Work while the op is in
flight (None once handed to the log), and the log (:class:`commscope.measure.capture.recorder.RankLog`) it goes to."""


def record_fields(rec: list) -> dict[str, Any]:
    """A record (:data:`R_SHAPE` ...) as named fields, those the log line holds."""
    out = dict(rec[R_SHAPE][1])
    out.update(size_bytes=rec[R_SIZE], t_start_ns=rec[R_START], seq=rec[R_SEQ], bytes_in=rec[R_IN],
               bytes_out=rec[R_OUT])
    if rec[R_END] is not None:
        out["t_end_ns"] = rec[R_END]
    if rec[R_STEP] is not None:
        out["step"] = rec[R_STEP]
    return out
