"""The routing trace contract: round trips through its files, and every bad input a clear one-line error
that names the file, the iteration (and layer, rank, expert) and the field."""

import json
import re

import numpy as np
import pytest

from commscope.errors import ConfigError
from commscope.moe import RoutingTrace, contiguous_placement, generate, load_trace, save_trace, write_rank_trace


def small_trace(**kw) -> RoutingTrace:
    args = dict(iterations=4, ep=4, num_experts=8, top_k=2, tokens_per_rank=64, micro_batches=2, num_layers=3, seed=1,
                layer_ids=(1, 2, 3))
    args.update(kw)
    return generate("zipf:1.1", **args)


def test_default_placement_is_contiguous_blocks():
    assert contiguous_placement(8, 4).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert contiguous_placement(64, 8).tolist() == [x // 8 for x in range(64)]
    trace = small_trace()
    assert trace.placement.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert (trace.iterations, trace.micro_batches, trace.num_layers, trace.ep, trace.num_experts) == (4, 2, 3, 4, 8)
    assert trace.counts.dtype == np.int64


def test_save_load_round_trip(tmp_path):
    trace = small_trace(placement=np.array([3, 2, 1, 0, 3, 2, 1, 0]))
    path = save_trace(trace, tmp_path / "t")  # the suffix is added
    assert path.name == "t.npz"
    back = load_trace(path)
    assert np.array_equal(back.counts, trace.counts) and back.counts.dtype == np.int64
    assert np.array_equal(back.placement, trace.placement)
    assert (back.top_k, back.num_experts, back.layer_ids, back.tokens_per_rank) == (2, 8, (1, 2, 3), 64)
    assert back.source == str(path)
    # a directory holding one trace reads as that trace
    assert np.array_equal(load_trace(tmp_path).counts, trace.counts)


def test_rank_files_merge_along_ep(tmp_path):
    trace = small_trace()
    for rank in range(trace.ep):
        write_rank_trace(tmp_path, rank, trace.counts[:, :, :, rank], top_k=2, num_experts=8, layer_ids=(1, 2, 3),
                         ep=4, tokens_per_rank=64)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"routing-rank{r:05d}.npz" for r in range(4)]
    back = load_trace(tmp_path)
    assert np.array_equal(back.counts, trace.counts)
    assert back.layer_ids == (1, 2, 3) and back.tokens_per_rank == 64 and back.source == str(tmp_path)


def test_report_format_reads_as_one_expert_per_rank(tmp_path):
    routing = np.arange(2 * 3 * 3).reshape(2, 3, 3)
    np.savez(tmp_path / "old.npz", routing=routing)
    trace = load_trace(tmp_path / "old.npz")
    assert trace.counts.shape == (2, 1, 1, 3, 3) and trace.top_k == 1
    assert np.array_equal(trace.counts[:, 0, 0], routing) and trace.placement.tolist() == [0, 1, 2]


def test_take_iterations_keeps_the_iteration_numbers(tmp_path):
    trace = small_trace()
    one = trace.take_iterations(2)
    assert one.iterations == 1 and np.array_equal(one.counts[0], trace.counts[2]) and one.first_iteration == 2
    assert load_trace(save_trace(trace.take_iterations(1, 3), tmp_path / "cut.npz")).first_iteration == 1
    with pytest.raises(ConfigError, match=r"routing_iteration=7: must be within the trace's iterations 0..3"):
        trace.take_iterations(7)


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


def _meta(**kw):
    return np.array(json.dumps({"format": "commscope-routing", "top_k": 1, **kw}))


def _counts(**where):
    c = np.full((3, 1, 2, 2, 4), 5.0 if any(isinstance(v, float) for v in where.values()) else 5)
    for index, value in where.items():
        c[tuple(int(x) for x in index[1:].split("_"))] = value
    return c


@pytest.mark.parametrize("arrays,pattern", [
    (dict(counts=np.ones((3, 2, 4))), (r"bad\.npz: counts=\(3, 2, 4\): must have 5 dimensions "
                                      r"\(iterations, micro_batches, layers, ep, experts\)")),
    (dict(counts=_counts(i2_0_1_1_3=-4)), (r"bad\.npz, iteration 2, micro-batch 0, layer 1, rank 1, expert 3: counts=-4: "
                                          r"must be >= 0")),
    (dict(counts=_counts(i1_0_0_0_0=2.5)), (r"bad\.npz, iteration 1, micro-batch 0, layer 0, rank 0, expert 0: "
                                           r"counts=2\.5: must be a whole number")),
    (dict(counts=_counts(i0_0_1_0_2=np.nan)), (r"bad\.npz, iteration 0, .*layer 1, rank 0, expert 2: counts=nan: must be "
                                              r"a finite")),
    (dict(counts=np.full((3, 1, 2, 2, 4), "x")), r"bad\.npz: counts='<U1': must hold integer token counts"),
    (dict(counts=_counts(), placement=np.array([0, 1, 2, 1])), (r"bad\.npz: placement\[2\]=2: expert 2 must live on an "
                                                              r"EP rank in 0\.\.1")),
    (dict(counts=_counts(), placement=np.array([0, 1])), r"bad\.npz: placement=\(2,\): must have one EP rank per expert"),
    (dict(counts=_counts(), meta=_meta(num_experts=6)), r"bad\.npz: num_experts=6: counts has 4 experts"),
    (dict(counts=_counts(), meta=_meta(top_k=9)), r"bad\.npz: top_k=9: must be an integer in 1\.\.num_experts=4"),
    (dict(counts=_counts(), meta=np.array("{not json")), r"bad\.npz: meta='\{not json': must be a JSON object"),
    (dict(counts=_counts(), meta=_meta(tokens_per_rank=5)), (r"bad\.npz, iteration 0, micro-batch 0, layer 0, rank 0: "
                                                            r"counts=20: summed over experts must be tokens_per_rank x "
                                                            r"top_k = 5 x 1 = 5")),
    (dict(counts=_counts(i1_0_0_1_2=9), meta=_meta(tokens_per_rank=5)), (r"iteration 1, .*rank 1, expert 2: counts=9: "
                                                                        r"must be <= tokens_per_rank=5")),
    (dict(counts=_counts(), layer_ids=np.array([3, 3])), r"bad\.npz: layer_ids=\(3, 3\): must be distinct"),
    (dict(routing=np.ones((3, 4, 5))), r"bad\.npz: routing=\(3, 4, 5\): must have shape \(iterations, ep, ep\)"),
    (dict(routing=-np.ones((3, 4, 4))), r"bad\.npz, iteration 0, rank 0, to rank 0: routing=-1\.0: must be >= 0"),
    (dict(tokens=np.ones(3)), r"bad\.npz: counts=None: missing: the file holds tokens"),
])
def test_bad_trace_names_file_iteration_and_field(tmp_path, arrays, pattern):
    arrays.setdefault("meta", _meta()) if "counts" in arrays else None
    path = _write(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_trace(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_missing_top_k_is_named(tmp_path):
    path = _write(tmp_path / "bad.npz", counts=_counts())
    with pytest.raises(ConfigError, match=r"bad\.npz: top_k=None: missing from the file's meta"):
        load_trace(path)


@pytest.mark.parametrize("cut", [10, 200, -40])
def test_truncated_or_corrupt_file_is_a_config_error(tmp_path, cut):
    good = save_trace(small_trace(), tmp_path / "good.npz").read_bytes()
    bad = tmp_path / "cut.npz"
    bad.write_bytes(good[:cut])
    with pytest.raises(ConfigError, match=r"cut\.npz: file='cut\.npz': is not a readable \.npz archive"):
        load_trace(bad)


def test_not_an_npz(tmp_path):
    (tmp_path / "a.npz").write_text("hello")
    np.save(tmp_path / "b.npy", np.ones(3))
    for name, what in (("a.npz", "starts with b'hello', not a zip's b'PK'"), ("b.npy", "is a single .npy array")):
        with pytest.raises(ConfigError, match=re.escape(f"file='{name}': is not an .npz archive: it {what}")):
            load_trace(tmp_path / name)
    with pytest.raises(ConfigError, match="no such file or directory"):
        load_trace(tmp_path / "absent.npz")


def _rank_dir(tmp_path, ranks=range(4), ep=4, override=None):
    override = override or {}
    trace = small_trace()
    for rank in ranks:
        kw = dict(top_k=2, num_experts=8, layer_ids=(1, 2, 3), ep=ep)
        counts = trace.counts[:, :, :, rank % trace.ep]
        if rank in override:
            counts, extra = override[rank]
            kw.update(extra)
        write_rank_trace(tmp_path, rank, counts, **kw)
    return tmp_path


def test_missing_ranks_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"ranks=\[1, 3\]: missing: an EP group of 4 ranks needs one file per rank; "
                                          r".* lacks routing-rank00001\.npz, routing-rank00003\.npz"):
        load_trace(_rank_dir(tmp_path, ranks=(0, 2)))


def test_missing_last_rank_is_found_through_ep(tmp_path):
    with pytest.raises(ConfigError, match=r"ranks=\[3\]: missing"):
        load_trace(_rank_dir(tmp_path, ranks=(0, 1, 2)))


def test_ranks_with_different_expert_counts(tmp_path):
    other = np.ones((4, 2, 3, 6), dtype=np.int64)
    with pytest.raises(ConfigError, match=r"routing-rank00002\.npz: num_experts=6: differs from routing-rank00000\.npz, "
                                          r"which has 8 experts"):
        load_trace(_rank_dir(tmp_path, override={2: (other, {"num_experts": 6})}))


def test_ranks_with_different_iterations(tmp_path):
    other = small_trace(iterations=3).counts[:, :, :, 1]
    with pytest.raises(ConfigError, match=r"routing-rank00001\.npz: counts=\(3, 2, 3, 8\): has \(iterations, "
                                          r"micro_batches, layers\) = \(3, 2, 3\), routing-rank00000\.npz has \(4, 2, 3\)"):
        load_trace(_rank_dir(tmp_path, override={1: (other, {})}))


def test_ranks_with_different_top_k(tmp_path):
    counts = small_trace().counts[:, :, :, 3]
    with pytest.raises(ConfigError, match=r"routing-rank00003\.npz: top_k=1: differs from routing-rank00000\.npz"):
        load_trace(_rank_dir(tmp_path, override={3: (counts, {"top_k": 1})}))


def test_bad_value_in_a_rank_file_names_file_and_iteration(tmp_path):
    counts = small_trace().counts[:, :, :, 1].copy()
    counts[3, 1, 2, 5] = -1
    path = tmp_path / "routing-rank00001.npz"
    _rank_dir(tmp_path)
    np.savez(path, counts=counts, meta=np.array(json.dumps({"rank": 1, "top_k": 2, "num_experts": 8, "ep": 4})),
             layer_ids=np.array([1, 2, 3]))
    with pytest.raises(ConfigError, match=re.escape(f"{path}, iteration 3, micro-batch 1, layer 3, expert 5: counts=-1")):
        load_trace(tmp_path)


def test_a_single_rank_file_is_refused_with_advice(tmp_path):
    _rank_dir(tmp_path)
    with pytest.raises(ConfigError, match="holds one EP rank's routing: give the directory"):
        load_trace(tmp_path / "routing-rank00000.npz")


def test_write_rank_trace_checks_its_input(tmp_path):
    with pytest.raises(ConfigError, match=r"rank 0: counts=\(4, 8\): must have 4 dimensions"):
        write_rank_trace(tmp_path, 0, np.ones((4, 8), dtype=int), top_k=2, num_experts=8)
    with pytest.raises(ConfigError, match=r"rank 0: num_experts=6: counts has 8 experts"):
        write_rank_trace(tmp_path, 0, np.ones((1, 1, 1, 8), dtype=int), top_k=2, num_experts=6)
    with pytest.raises(ConfigError, match=r"rank=4: must be an EP rank >= 0 and < ep=4"):
        write_rank_trace(tmp_path, 4, np.ones((1, 1, 1, 8), dtype=int), top_k=2, num_experts=8, ep=4)
    assert not list(tmp_path.iterdir())


def test_directory_without_traces(tmp_path):
    with pytest.raises(ConfigError, match="has no routing-rank\\*.npz files; it holds no .npz files"):
        load_trace(tmp_path)


def test_counts_above_max_token_count_are_refused_before_the_int64_cast():
    from commscope.moe.trace import MAX_TOKEN_COUNT

    counts = np.zeros((1, 1, 1, 2, 2))
    counts[0, 0, 0, 1, 1] = MAX_TOKEN_COUNT
    assert RoutingTrace(counts=counts, top_k=1).counts[0, 0, 0, 1, 1] == MAX_TOKEN_COUNT
    for dtype, value in ((np.float64, 1e30), (np.float64, MAX_TOKEN_COUNT + 1), (np.uint64, 2**64 - 1)):
        counts = np.zeros((1, 1, 1, 2, 2), dtype=dtype)
        counts[0, 0, 0, 1, 1] = value
        with pytest.raises(ConfigError, match=re.escape(f"rank 1, expert 1: counts={counts.max().item()!r}: not a "
                                                        "token count")):
            RoutingTrace(counts=counts, top_k=1)
