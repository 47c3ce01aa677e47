"""Calibrate to your own runs: the few, bounded efficiency factors that make the estimate match measured iterations.

``commscope validate RUNS.csv --fit --out mycluster.toml`` fits, to the runs of one cluster:

``compute_efficiency``
    the cluster's compute at that fraction of the modelled speed (the kernel-level model of
    :mod:`commscope.estimate.compute` times its in-training effects): what its software stack, its data pipeline, its
    real-data clocks do that the model does not. Bounded to [0.3, 1.2].
``network_efficiency``
    the cluster's links at that fraction of its file's bandwidth (both tiers): what its fabric, its NCCL version,
    its congestion do. Bounded to [0.3, 1.2]. Not fitted where ``--bandwidth`` gives measured collectives (they
    already are the network), nor when no run communicates across a link enough to inform it.

Each is a single number for the whole cluster, never one per run. The fit minimises the mean squared log ratio of
predicted to measured iteration time (:func:`commscope.estimate.compute.calibration.minimize`), and says how well it
predicts a run it has not seen: each run predicted by the factors fitted on the others (leave-one-run-out). The
written cluster file holds the factors (``compute_efficiency``, the scaled link bandwidths) and where they came
from, and serves as ``--cluster FILE`` in every command.

A software stack whose efficiency was measured once (:mod:`commscope.estimate.stacks`, e.g. ``megatron-core-2024``) is
the same factor kept as a preset; a run's ``stack`` column applies it before this fit, which then fits what is left.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from commscope.errors import ConfigError
from commscope.spec.cluster import ClusterSpec
from commscope.estimate.validate import Run, _at, _bandwidth_for

__all__ = ["FIT_PARAMETERS", "RunFit", "fit_runs", "fitted_cluster"]

#: Factors :func:`fit_runs` can fit: name -> (lowest, highest, what it means).
FIT_PARAMETERS: dict[str, tuple[float, float, str]] = {
    "compute_efficiency": (0.3, 1.2, "compute at this fraction of the modelled speed"),
    "network_efficiency": (0.3, 1.2, "links at this fraction of the cluster file's bandwidth"),
}


def fitted_cluster(cluster: ClusterSpec, parameters: dict[str, float]) -> ClusterSpec:
    """``cluster`` with the fitted factors applied: its compute efficiency multiplied, its link tiers' bandwidth
    scaled by ``network_efficiency``."""
    out = cluster
    if "compute_efficiency" in parameters:
        out = replace(out, compute_efficiency=cluster.compute_efficiency * parameters["compute_efficiency"])
    n = parameters.get("network_efficiency")
    if n is not None and n != 1.0:
        out = replace(out, intra_node=replace(out.intra_node, bandwidth_bytes_per_s=out.intra_node.bandwidth_bytes_per_s * n),
                      inter_node=replace(out.inter_node, bandwidth_bytes_per_s=out.inter_node.bandwidth_bytes_per_s * n))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFit:
    """The fitted factors and how well they predict the runs."""

    parameters: dict[str, float]
    case_ids: tuple[str, ...]
    default_errors: tuple[float, ...]
    """predicted / measured - 1 of each run with the cluster as given."""
    fitted_errors: tuple[float, ...]
    """The same with the factors fitted on every run."""
    loo_errors: tuple[float, ...] | None
    """The same with each run predicted by factors fitted without it (None: fewer than 2 runs)."""
    notes: tuple[str, ...] = field(default_factory=tuple)

    @staticmethod
    def _mean(errors: Sequence[float] | None) -> float | None:
        return None if not errors else float(np.mean(np.abs(errors)))

    @property
    def default_mean_abs_error(self) -> float:
        return float(np.mean(np.abs(self.default_errors)))

    @property
    def mean_abs_error(self) -> float:
        return float(np.mean(np.abs(self.fitted_errors)))

    @property
    def loo_mean_abs_error(self) -> float | None:
        return self._mean(self.loo_errors)

    def to_dict(self) -> dict[str, Any]:
        return {"parameters": dict(self.parameters), "default_mean_abs_error": self.default_mean_abs_error,
                "mean_abs_error": self.mean_abs_error, "loo_mean_abs_error": self.loo_mean_abs_error,
                "runs": [{"case_id": c, "default_error": d, "fitted_error": f,
                          "loo_error": None if self.loo_errors is None else self.loo_errors[i]}
                         for i, (c, d, f) in enumerate(zip(self.case_ids, self.default_errors, self.fitted_errors))],
                "notes": list(self.notes)}


def fit_runs(runs: Sequence[Run], *, parameters: Sequence[str] = ("compute_efficiency", "network_efficiency"),
             bandwidth: Any = None, loo: bool = True) -> RunFit:
    """Fit ``parameters`` (names of :data:`FIT_PARAMETERS`) to ``runs`` (see the module docstring)."""
    from commscope.api import predict
    from commscope.estimate.compute.calibration import minimize
    from commscope.estimate.iteration import estimate

    if not runs:
        raise ConfigError("runs", 0, "no runs to fit")
    names = list(dict.fromkeys(parameters))
    for name in names:
        if name not in FIT_PARAMETERS:
            raise ConfigError("fit", name, f"valid: {', '.join(FIT_PARAMETERS)}")
    notes: list[str] = []
    if bandwidth is not None and "network_efficiency" in names:
        names.remove("network_efficiency")
        notes.append("network_efficiency not fitted: --bandwidth gives the measured collectives")
    predictions = []
    for run in runs:
        try:
            predictions.append(predict(run.model, run.parallel, run.cluster))
        except ConfigError as exc:
            raise _at(exc, run.where or run.case_id) from None
    measured = np.array([r.measured_iteration_time_s for r in runs])
    models = [_bandwidth_for(bandwidth, r.cluster) for r in runs]

    def times(values: dict[str, float], idx: Sequence[int]) -> np.ndarray:
        out = []
        for i in idx:
            pred = predictions[i]
            cluster = fitted_cluster(pred.cluster, values)
            out.append(estimate(replace(pred, cluster=cluster), bandwidth=models[i]).iteration_time_s)
        return np.array(out)

    if "network_efficiency" in names:
        comm = np.array([_comm_share(estimate(p, bandwidth=m)) for p, m in zip(predictions, models)])
        if float(np.max(comm)) < 0.02:
            names.remove("network_efficiency")
            notes.append(f"network_efficiency not fitted: exposed communication is under 2% of every run "
                         f"(at most {float(np.max(comm)):.1%}): the runs cannot tell it")

    lo = [FIT_PARAMETERS[n][0] for n in names]
    hi = [FIT_PARAMETERS[n][1] for n in names]

    def fit(idx: Sequence[int], start: Sequence[float]) -> dict[str, float]:
        if not names:
            return {}
        meas = measured[list(idx)]
        x = minimize(lambda v: float(np.mean(np.log(times(dict(zip(names, map(float, v))), idx) / meas) ** 2)),
                     start, lo, hi, iters=150, tol=1e-7)
        return {n: round(float(v), 4) for n, v in zip(names, x)}

    everything = list(range(len(runs)))
    default = times({}, everything) / measured - 1
    params = fit(everything, [1.0] * len(names))
    fitted = times(params, everything) / measured - 1
    loo_errors = None
    if loo and len(runs) > 1 and names:
        loo_list = []
        for i in everything:
            others = [j for j in everything if j != i]
            p_i = fit(others, [params[n] for n in names])
            loo_list.append(float(times(p_i, [i])[0] / measured[i] - 1))
        loo_errors = tuple(loo_list)
    for n in names:
        lo_n, hi_n, _ = FIT_PARAMETERS[n]
        if math.isclose(params[n], lo_n, rel_tol=1e-3) or math.isclose(params[n], hi_n, rel_tol=1e-3):
            notes.append(f"{n} = {params[n]:g} sits at its bound [{lo_n:g}, {hi_n:g}]: the runs ask for more than the "
                         "model's physics allows; check the runs' settings (a column left blank takes a default)")
    return RunFit(parameters=params, case_ids=tuple(r.case_id for r in runs), default_errors=tuple(map(float, default)),
                  fitted_errors=tuple(map(float, fitted)), loo_errors=loo_errors, notes=tuple(notes))


def _comm_share(est: Any) -> float:
    return float(est.comm_s / est.iteration_time_s) if est.iteration_time_s else 0.0
