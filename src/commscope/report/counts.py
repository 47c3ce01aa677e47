"""Bytes and ops per axis of one iteration, predicted and measured, counted alike.

A prediction counts a collective once per group and a transfer once at its send; recorders log every rank's call.
The functions here put the two on the same footing (:func:`logical_measured_ops`, the capture module's rules), give
measured records without an axis the axis of the predicted group they ran on (:func:`with_axes`), and sum both per
axis. They are the arithmetic behind the report's measured-vs-predicted section and its measured heatmap, kept
apart from the section builders so that the numbers can be checked without building a page.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from commscope.commop import AXES, CommOp
from commscope.report.loaders import MeasuredLogs

__all__ = ["logical_measured_ops", "measured_bytes_by_axis", "predicted_bytes_by_axis", "with_axes"]


def predicted_bytes_by_axis(workload) -> dict[str, dict[str, int]]:
    """Bytes (sum of message sizes) and ops per axis of one predicted iteration, counted as measured logs
    record them (:func:`commscope.measure.capture.analysis.predicted_ops_by_kind`). Worked example: a TP all_reduce of
    13,107,200 bytes over 2 ranks is one op of 13,107,200 bytes; a balanced all_to_all of 4 x 1 MB over 4
    ranks is 4 ops of 4 MB.
    """
    from commscope.measure.capture.analysis import predicted_ops_by_kind

    out = {a: {"bytes": 0, "ops": 0} for a in AXES}
    for (axis, _op), (count, nbytes) in predicted_ops_by_kind(workload).items():
        out[axis]["bytes"] += nbytes
        out[axis]["ops"] += count
    return out


def logical_measured_ops(ops: Iterable[CommOp]) -> list[CommOp]:
    """Measured records counted the way :func:`predicted_bytes_by_axis` counts, setup records left out
    (:func:`commscope.measure.capture.analysis.is_logical`)."""
    from commscope.measure.capture.analysis import is_logical

    return [op for op in ops if op.phase != "setup" and is_logical(op)]


def with_axes(measured: MeasuredLogs, prediction) -> MeasuredLogs:
    """The logs with every record whose axis is ``other`` given the axis of the prediction's process group
    it ran on (the capture module's attribution: recorders do not know the parallelism)."""
    ops = list(measured.ops)
    unknown = [i for i, op in enumerate(ops) if op.axis == "other"]
    if not unknown or prediction is None:
        return measured
    try:
        from commscope.measure.capture.analysis import attribute_axes
    except ImportError:  # pragma: no cover - the capture module is part of the package
        return measured
    fixed = attribute_axes([ops[i] for i in unknown], prediction.workload.layout)
    for i, op in zip(unknown, fixed):
        ops[i] = op
    return replace(measured, ops=tuple(ops),
                   num_attributed=measured.num_attributed + sum(op.axis != "other" for op in fixed))


def measured_bytes_by_axis(ops: Iterable[CommOp]) -> dict[str, dict[str, int]]:
    """Bytes (``size_bytes x count``) and ops per axis of measured records, counted by :func:`logical_measured_ops`
    and, as ``summarize`` counts them, an all_to_all row of a whole group (nccl-tests) once per sending rank
    (:func:`commscope.io.runs.senders`)."""
    from commscope.io.runs import senders

    out = {a: {"bytes": 0, "ops": 0} for a in AXES}
    for op in logical_measured_ops(ops):
        n = op.count * senders(op, op.rank)
        out[op.axis]["bytes"] += op.size_bytes * n
        out[op.axis]["ops"] += n
    return out
