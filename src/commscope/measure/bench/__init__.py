"""Collective micro-benchmarks (nccl-tests' semantics through torch.distributed) and the bandwidth model fitted to them.

    commscope bench --nproc 4 --backend gloo -b 8 -e 64M -f 2 --out bench.json   # or: torchrun ... -m commscope.measure.bench
    commscope fit bench.json --out mycluster.toml                                  # -> estimate --bandwidth

:mod:`commscope.measure.bench.sweep` measures (needs torch, imported only when a sweep runs), :mod:`commscope.measure.bench.fit`
fits latency and bandwidth per op and group size, :mod:`commscope.estimate.fitted` is the resulting model the
estimator uses. Nothing here imports torch at import time.
"""

from commscope.measure.bench.sweep import OPS, BenchRow, SweepConfig, SweepResult, WrongResultsError, run_sweep

__all__ = ["OPS", "BenchRow", "SweepConfig", "SweepResult", "WrongResultsError", "run_sweep"]
