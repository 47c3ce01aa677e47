"""Readers and writers: op logs (JSON Lines, CSV) and traffic matrices (triplet CSV, NPZ)."""

from commscope.io.matrix import read_npz, read_triplets_csv, write_npz, write_triplets_csv
from commscope.io.oplog import OpLog, read_ops_csv, read_ops_jsonl, write_ops_csv, write_ops_jsonl

__all__ = [
    "OpLog",
    "read_npz",
    "read_ops_csv",
    "read_ops_jsonl",
    "read_triplets_csv",
    "write_npz",
    "write_ops_csv",
    "write_ops_jsonl",
    "write_triplets_csv",
]
