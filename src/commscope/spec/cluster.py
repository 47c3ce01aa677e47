"""The cluster: GPUs per node, GPU peak FLOP/s, and link tiers (intra-node, inter-node).

Bandwidths are per GPU and per direction, as nccl-tests' bus bandwidth (busbw) reports them at large
messages: that is the number that makes ring-collective times come out as size x factor / bandwidth.
Latencies are the per-step alpha of the alpha-beta model (Hockney 1994; Thakur et al. 2005).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from commscope.errors import check

LINK_CLASSES = ("intra_node", "inter_node")


#: Bandwidth any real interconnect has per GPU and direction: 10 MB/s (below 100 Mb/s Ethernet, [ieee-802.3u]) to
#: 10 TB/s (over 10x NVLink 5's 900 GB/s per direction, [nvlink5]). Outside it a number is a typo or a unit slip
#: (GB/s given as B/s), or a measurement that timed nothing: files are refused, fits flagged unreliable.
LINK_BANDWIDTH_RANGE_BYTES_PER_S = (1e7, 1e13)
#: Per-step latency of any real link: 100 ns (below any NCCL or MPI operation on any hardware) to 1 s.
LINK_LATENCY_RANGE_S = (1e-7, 1.0)


def implausible_link(bandwidth_bytes_per_s: float | None = None, latency_s: float | None = None) -> str | None:
    """Why a bandwidth or latency lies outside any real hardware's range (None: it does not)."""
    lo, hi = LINK_BANDWIDTH_RANGE_BYTES_PER_S
    if bandwidth_bytes_per_s is not None and not lo <= bandwidth_bytes_per_s <= hi:
        return (f"{bandwidth_bytes_per_s / 1e9:.6g} GB/s is outside any real link's range ({lo / 1e9:g}-{hi / 1e9:g} "
                "GB/s per GPU and direction)")
    lo, hi = LINK_LATENCY_RANGE_S
    if latency_s is not None and not lo <= latency_s <= hi:
        return f"{latency_s * 1e6:.6g} us is outside any real link's latency range ({lo * 1e6:g} us - {hi:g} s)"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkTier:
    """One level of the network."""

    name: str
    """Technology, e.g. ``NVLink3/NVSwitch``, ``PCIe Gen4``, ``8x HDR InfiniBand``."""
    bandwidth_bytes_per_s: float
    """Achievable bus bandwidth per GPU per direction at large messages."""
    latency_s: float = 5e-6
    """Per-step latency (alpha)."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        check(self.bandwidth_bytes_per_s > 0, f"{self.name}.bandwidth_bytes_per_s", self.bandwidth_bytes_per_s, "must be > 0")
        check(self.latency_s >= 0, f"{self.name}.latency_s", self.latency_s, "must be >= 0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    """A homogeneous GPU cluster."""

    name: str = "custom"
    gpu: str = "unknown"
    """GPU model, e.g. ``A100-SXM4-80GB``."""
    gpus_per_node: int = 8
    peak_flops: dict[str, float] = field(default_factory=dict)
    """Dense peak FLOP/s of ONE GPU per dtype (``{"bf16": 312e12}``)."""
    memory_bytes: int = 80 * (1 << 30)
    """Memory of one GPU."""
    memory_bandwidth_bytes_per_s: float = 0.0
    """HBM bandwidth of one GPU (0: unknown)."""
    gpu_util: float = 0.4
    """Default achieved fraction u of peak FLOP/s (the seed talk uses 0.3 for RTX3090 and 0.4 for V100)."""
    intra_node: LinkTier
    inter_node: LinkTier
    nics_per_node: int = 8
    """Network interfaces per node, shared by its GPUs for inter-node traffic."""
    compute_efficiency: float = 1.0
    """This cluster's compute at that fraction of the modelled speed, measured against its own runs (``commscope
    validate RUNS.csv --fit`` writes it); 1: the kernel-level model alone. Multiplies a named stack's efficiency."""
    source: str = ""

    def __post_init__(self) -> None:
        check(isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1, "gpus_per_node", self.gpus_per_node,
              "must be a positive integer")
        check(self.nics_per_node >= 1, "nics_per_node", self.nics_per_node, "must be >= 1")
        check(0 < self.gpu_util <= 1, "gpu_util", self.gpu_util, "must be in (0, 1]")
        check(0.2 <= self.compute_efficiency <= 1.2, "compute_efficiency", self.compute_efficiency,
              "must be in [0.2, 1.2] (compute at that fraction of the modelled speed)")
        for dtype, flops in self.peak_flops.items():
            check(flops > 0, f"peak_flops.{dtype}", flops, "must be > 0")

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def peak_flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for ``dtype``; fp16 and bf16 stand in for each other when only one is given."""
        for key in (dtype, {"bf16": "fp16", "fp16": "bf16"}.get(dtype, dtype)):
            if key in self.peak_flops:
                return self.peak_flops[key]
        from commscope.errors import ConfigError

        raise ConfigError("dtype", dtype, f"cluster {self.name!r} has no peak FLOP/s for it; it has {sorted(self.peak_flops)}")
