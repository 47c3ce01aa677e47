"""Shared by the golden iteration-time tests: estimate each published run and print the per-case table."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from commscope.api import predict
from commscope.estimate.iteration import Estimate, estimate


@dataclass(frozen=True)
class Case:
    case_id: str
    label: str
    prediction: object
    measured_s: float
    bandwidth: object = None
    """A measured bandwidth model of the run's own cluster (``estimate --bandwidth``), else the preset's."""


def run_cases(cases: list[Case], title: str) -> tuple[list[tuple[Case, Estimate, float]], float, float]:
    """(rows, mean absolute error, worst absolute error), printing the table as it goes (pytest -s shows it)."""
    rows = []
    for case in cases:
        est = estimate(case.prediction, bandwidth=case.bandwidth)
        rows.append((case, est, est.iteration_time_s / case.measured_s - 1))
    mean = sum(abs(r[2]) for r in rows) / len(rows)
    worst = max(abs(r[2]) for r in rows)
    print(f"\n{title}")
    print(f"{'case':<22}{'run':<16}{'measured s':>11}{'predicted s':>12}{'error':>8}{'comp':>7}{'tp':>6}{'pp':>6}"
          f"{'dp':>6}{'opt':>6}{'bubble':>7}{'hidden':>7}")
    for case, est, err in rows:
        print(f"{case.case_id:<22}{case.label:<16}{case.measured_s:>11.3f}{est.iteration_time_s:>12.3f}{err:>+8.1%}"
              f"{est.compute_s:>7.2f}{est.tp_s:>6.2f}{est.pp_s:>6.2f}{est.dp_s:>6.2f}{est.optimizer_s:>6.2f}"
              f"{est.bubble_s:>7.2f}{sum(est.hidden_s.values()):>7.2f}")
    print(f"mean absolute error {mean:.1%}, worst {worst:.1%} over {len(rows)} cases")
    return rows, mean, worst


def with_stack(cases: list[Case], stack: str | None) -> list[Case]:
    """The same runs estimated with the software stack ``stack`` named (``ParallelSpec.stack``)."""
    out = []
    for case in cases:
        pred = case.prediction
        out.append(replace(case, prediction=replace(pred, parallel=replace(pred.parallel, stack=stack))))
    return out


#: Compute efficiencies a stack preset is chosen from: steps of 0.01.
EFFICIENCY_GRID = np.round(np.arange(0.50, 1.2001, 0.01), 2)


def best_efficiency(cases: list[Case], grid: np.ndarray = EFFICIENCY_GRID) -> tuple[float, float]:
    """(compute efficiency, mean absolute error): the efficiency of ``grid`` that minimises the mean error of the
    runs (what a stack preset holds: see presets/stacks/), ties to the first."""
    measured = np.array([c.measured_s for c in cases])
    best = (1.0, float("inf"))
    for e in grid:
        times = []
        for c in cases:
            pred = c.prediction
            cluster = replace(pred.cluster, compute_efficiency=float(e))
            times.append(estimate(replace(pred, cluster=cluster), bandwidth=c.bandwidth).iteration_time_s)
        mean = float(np.mean(np.abs(np.array(times) / measured - 1)))
        if mean < best[1] - 1e-12:
            best = (round(float(e), 2), mean)
    return best


__all__ = ["Case", "best_efficiency", "predict", "run_cases", "with_stack"]
