"""The Python API: one call from specs to the communication of an iteration.

    >>> import commscope
    >>> pred = commscope.predict(model="gpt-1.5b", cluster="dgx1-v100",
    ...                          parallel=commscope.ParallelSpec(tp=2, pp=4, dp=4, global_batch_size=512, micro_batch_size=4))
    >>> pred.summary()["bytes_by_axis"]["tp"] > 0
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from commscope.commop import REPORT_AXES
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.pattern.traffic import ALGORITHMS, TrafficMatrix, traffic_of
from commscope.pattern.workload.base import Workload
from commscope.pattern.workload.dense import build_workload, check_job


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The predicted communication of one iteration: the op list and its traffic matrix.

    Both are built when first asked for (and kept): :func:`commscope.estimate.estimate` of a Megatron job with
    balanced routing reads neither, so an estimate costs the same at any pipeline depth; what :func:`predict` can
    refuse it refuses at once.
    """

    model: ModelSpec
    parallel: ParallelSpec
    cluster: ClusterSpec
    algorithm: str = "ring"
    """How collectives are decomposed into flows (:data:`commscope.pattern.traffic.ALGORITHMS`)."""
    routing: Any = None
    """MoE routing as :func:`predict` took it (None: balanced)."""
    routing_iteration: int = 0
    _workload: Workload | None = field(default=None, init=False, repr=False, compare=False)
    _traffic: TrafficMatrix | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def workload(self) -> Workload:
        """Every op of the iteration (:func:`commscope.pattern.workload.dense.build_workload`)."""
        if self._workload is None:
            object.__setattr__(self, "_workload", build_workload(self.model, self.parallel, routing=self.routing,
                                                                 routing_iteration=self.routing_iteration))
        assert self._workload is not None
        return self._workload

    @property
    def traffic(self) -> TrafficMatrix:
        """Per-GPU-pair bytes of the workload's ops, decomposed by ``algorithm``."""
        if self._traffic is None:
            object.__setattr__(self, "_traffic", traffic_of(self.workload, self.cluster.gpus_per_node,
                                                            algorithm=self.algorithm))
        assert self._traffic is not None
        return self._traffic

    @property
    def balanced_megatron(self) -> bool:
        """A Megatron-LM job whose MoE all-to-alls (if any) follow balanced routing without a capacity: what
        :mod:`commscope.estimate.many` estimates in closed form, without the op list."""
        return (self.parallel.framework == "megatron" and self.routing is None
                and not (self.model.is_moe and self.model.capacity_factor is not None))

    @property
    def num_ops(self) -> int:
        """Op invocations per iteration: a collective counts once per group, a send and its recv separately."""
        return sum(s.num_ops for s in self.workload.opsets)

    def summary(self) -> dict[str, Any]:
        """The headline numbers (JSON-ready). Bytes are wire bytes of the traffic matrix per iteration,
        except ``logical_bytes_by_axis``: the sum of the ops' message sizes (nccl-tests convention)."""
        tm = self.traffic
        _, _, pair_bytes = tm.pairs()  # once: num_pairs and max_pair_bytes would each coalesce the matrix again
        by_axis = tm.bytes_by_axis()
        logical = self.workload.logical_bytes_by_axis()
        out_axes = {a: by_axis[a] for a in REPORT_AXES}
        if by_axis.get("other"):
            out_axes["other"] = by_axis["other"]
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "world_size": tm.world_size,
            "num_nodes": tm.num_nodes,
            "gpus_per_node": tm.gpus_per_node,
            "parallel": {"tp": self.parallel.tp, "pp": self.parallel.pp, "dp": self.parallel.dp, "cp": self.parallel.cp,
                         "ep": self.parallel.ep, "virtual_pipeline_size": self.parallel.virtual_pipeline_size,
                         "num_micro_batches": self.parallel.num_micro_batches, "order": self.parallel.order},
            "algorithm": tm.algorithm,
            "num_ops": self.num_ops,
            "total_bytes": tm.total_bytes,
            "bytes_by_axis": out_axes,
            "bytes_by_link": tm.bytes_by_link(),
            "bytes_by_axis_and_link": tm.bytes_by_axis_and_link(),
            "logical_bytes_by_axis": {a: logical[a] for a in REPORT_AXES},
            "num_pairs": int(pair_bytes.size),
            "max_pair_bytes": int(pair_bytes.max()) if pair_bytes.size else 0,
            "notes": list(self.workload.notes),
        }


def _as_model(model: ModelSpec | str) -> ModelSpec:
    if isinstance(model, ModelSpec):
        return model
    from commscope.spec.files import load_model

    return load_model(model)


def _as_cluster(cluster: ClusterSpec | str) -> ClusterSpec:
    if isinstance(cluster, ClusterSpec):
        return cluster
    from commscope.spec.files import load_cluster

    return load_cluster(cluster)


def predict(model: ModelSpec | str, parallel: ParallelSpec, cluster: ClusterSpec | str = "dgx-a100", *,
            algorithm: str = "ring", routing: Any = None, routing_iteration: int = 0) -> Prediction:
    """Predict every op of one iteration and its per-GPU-pair traffic.

    ``model`` and ``cluster`` are specs, preset names (``commscope presets``) or file paths.
    ``algorithm`` decomposes collectives (``ring``, ``direct``, ``tree``, ``hierarchical``).
    ``routing`` (MoE): ``None`` (balanced), an (ep, ep) token matrix or a :class:`~commscope.moe.RoutingTrace`,
    whose iteration ``routing_iteration`` sizes the EP all-to-alls (:func:`commscope.moe.routing_for_job` makes one).

    The job is checked here (ConfigError for what Megatron or the framework refuses); the op list and the traffic
    matrix are built when first read (:class:`Prediction`).
    """
    model_spec = _as_model(model)
    cluster_spec = _as_cluster(cluster)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r}: valid: {', '.join(ALGORITHMS)}")
    pred = Prediction(model=model_spec, parallel=parallel, cluster=cluster_spec, algorithm=algorithm, routing=routing,
                      routing_iteration=routing_iteration)
    if pred.balanced_megatron:
        check_job(model_spec, parallel)  # all that building the workload could refuse
    else:  # the framework's own checks and the routing's are part of building it
        pred.workload  # noqa: B018
    return pred
