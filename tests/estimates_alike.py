"""What the estimate tests compare with: a toy cluster, and two estimates equal up to the order of their sums (shared
by tests/estimate/test_estimate_many.py and the tests of other layers that hold a path to the op-by-op estimate)."""

import math

from commscope.spec.cluster import ClusterSpec, LinkTier

CLUSTER = ClusterSpec(name="test", gpu="X", gpus_per_node=4, peak_flops={"bf16": 100e12, "fp16": 100e12, "fp32": 20e12},
                      gpu_util=0.5, intra_node=LinkTier(name="nv", bandwidth_bytes_per_s=100e9, latency_s=3e-6),
                      inter_node=LinkTier(name="ib", bandwidth_bytes_per_s=10e9, latency_s=8e-6))


#: Below any time or size that means something (a femtosecond, a femtobyte): at toy shapes the two paths' sums,
#: taken in different orders, cancel to ~1e-18 s differently (2,500 random draws found hidden DP time 2e-18 s apart).
ABS_TOL = 1e-15


def assert_same(scalar, batch, path="estimate"):
    """Equal up to the order of floating-point sums (relative 1e-12, or absolute ABS_TOL)."""
    if isinstance(scalar, dict):
        assert set(scalar) == set(batch), (path, scalar, batch)
        for key in scalar:
            assert_same(scalar[key], batch[key], f"{path}.{key}")
    elif isinstance(scalar, (list, tuple)):
        assert len(scalar) == len(batch), (path, scalar, batch)
        for i, (a, b) in enumerate(zip(scalar, batch)):
            assert_same(a, b, f"{path}[{i}]")
    elif isinstance(scalar, float):
        assert math.isclose(scalar, batch, rel_tol=1e-12, abs_tol=ABS_TOL), (path, scalar, batch)
    else:
        assert scalar == batch, (path, scalar, batch)
