"""The recorder's hand-built log line is exactly json.dumps of the record's CommOp dict, for every combination of
optional fields and for groups whose cached parts must not leak into one another."""

import itertools
import json

from commscope.measure.capture.recorder import _line, _to_commop_dict


def _expected(rec: dict) -> str:
    return json.dumps(_to_commop_dict(rec), separators=(",", ":"))


def test_line_equals_json_dumps_for_every_optional_field():
    base = {"op": "all_reduce", "group": [0, 1, 2, 3], "rank": 3, "size_bytes": 4, "dtype": "fp32",
            "t_start_ns": 1732435200000000000, "backend": "gloo", "group_name": "3", "seq": 123, "bytes_in": 4,
            "bytes_out": 4}
    absent = object()
    options = {"peer": [absent, None, 2], "splits": [absent, [1, 2, 0]], "backend_op": [absent, "all_reduce"],
               "root": [absent, None, 1], "step": [absent, None, 4], "group_name": [None, "a\"b"],
               "t_end_ns": [absent, 5], "backend": ["nccl", None], "seq": [absent, 7]}
    for combo in itertools.product(*options.values()):
        rec = dict(base)
        for key, value in zip(options, combo):
            if value is absent:
                rec.pop(key, None)
            else:
                rec[key] = value
        assert _line(rec) == _expected(rec), rec


def test_cached_parts_follow_the_group_and_op():
    group_a, group_b = [0, 1], [2, 3]
    for group, op, dtype, rank in itertools.product((group_a, group_b, [0, 1]), ("all_reduce", "send"), ("bf16", "fp32"),
                                                     (0, 2)):
        rec = {"op": op, "group": group, "rank": rank, "size_bytes": 8, "dtype": dtype, "backend": "gloo",
               "group_name": str(group[0]), "seq": 1, "bytes_in": 8, "bytes_out": 8}
        assert _line(rec) == _expected(rec)


def test_prepared_forms_write_the_same_line_as_the_general_path():
    """A process group's records carry their line's constant text (R_SHAPE's forms, per group, op and dtype): with
    and without a completion time and a step, and with text that %-formatting or JSON must escape, the line is the
    one the general path writes, which is json.dumps of the CommOp dict."""
    from commscope.measure.capture.oprecord import R_SHAPE, record_fields
    from commscope.io.oplog import line_forms

    for group_name, dtype, backend_op in (("3", "fp32", None), ('100% "odd"\\name', "torch.complex64", "all_reduce")):
        form = line_forms("reduce_scatter", [0, 4, 8], 4, dtype, group_name, "gloo", backend_op)
        base = {"op": "reduce_scatter", "group": [0, 4, 8], "rank": 4, "size_bytes": 1 << 40, "dtype": dtype,
                "t_start_ns": 1732435200000000000, "backend": "gloo", "group_name": group_name, "seq": 9,
                "bytes_in": 12, "bytes_out": 13, **({} if backend_op is None else {"backend_op": backend_op})}
        fields = {k: base[k] for k in ("op", "group", "rank", "dtype", "backend", "group_name", "backend_op") if k in base}
        for t_end, step in ((None, None), (1732435200000000500, None), (None, 0), (1732435200000000500, 7)):
            rec = [(form, fields), base["size_bytes"], base["t_start_ns"], base["seq"], base["bytes_in"],
                   base["bytes_out"], step, t_end, None, None]
            named = {**base, **({} if t_end is None else {"t_end_ns": t_end}), **({} if step is None else {"step": step})}
            assert record_fields(rec) == named
            assert _line(rec) == _line(named) == _line({**named, "step": None} if step is None else named)
            assert _line(rec) == _expected(named), (t_end, step)
            rec[R_SHAPE] = (None, fields)  # the general path, from the record's fields
            assert _line(rec) == _expected(named)
