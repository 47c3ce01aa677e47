"""Reading and writing spec files: TOML, JSON, YAML; errors that name the file, the key and what is valid."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import strategies
from commscope.errors import ConfigError
from commscope.presets import cluster_preset, model_preset, preset_names
from commscope.spec import ClusterSpec, LinkTier, ModelSpec, ParallelSpec, load_cluster, load_model, load_parallel
from commscope.spec.files import (
    cluster_from_mapping,
    cluster_to_mapping,
    dumps_toml,
    model_from_mapping,
    model_to_mapping,
    parallel_from_mapping,
    parallel_to_mapping,
    read_mapping,
    write_mapping,
)
from commscope.units import GB, GiB

SMALL_MODEL_TOML = """\
num_layers = 4
hidden_size = 64
num_heads = 4
vocab_size = 1000
seq_len = 128

[meta]
description = "a tiny test model"
source = "made up"
"""

CLUSTER_TOML = """\
gpu = "A100-SXM4-80GB"
gpus_per_node = 8
memory_GiB = 80
memory_bandwidth_GBps = 2039
gpu_util = 0.5
nics_per_node = 8

[peak_tflops]
bf16 = 312
fp32 = 19.5

[intra_node]
name = "NVLink3"
bandwidth_GBps = 230
latency_us = 2.5

[inter_node]
name = "HDR"
bandwidth_bytes_per_s = 24e9
latency_s = 5e-6

[meta]
source = "test"
"""


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def config_error(func, *args, **kwargs) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        func(*args, **kwargs)
    return info.value


# ----- reading the formats -----


def test_read_mapping_reads_toml_json_and_yaml_alike(tmp_path):
    expected = {"num_layers": 4, "hidden_size": 64, "bias": False, "name": "x"}
    toml = write(tmp_path / "m.toml", 'num_layers = 4\nhidden_size = 64\nbias = false\nname = "x"\n')
    js = write(tmp_path / "m.json", json.dumps(expected))
    yaml = write(tmp_path / "m.yaml", "num_layers: 4\nhidden_size: 64\nbias: false\nname: x\n")
    yml = write(tmp_path / "m.yml", "num_layers: 4\nhidden_size: 64\nbias: false\nname: x\n")
    for path in (toml, js, yaml, yml):
        assert read_mapping(path) == expected


def test_malformed_toml_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "broken.toml", "num_layers = 4\nhidden_size = \n")
    err = config_error(read_mapping, path)
    assert "broken.toml" in str(err) and "line 2" in str(err) and "TOML" in str(err)
    assert err.field == "path"


def test_malformed_json_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "broken.json", '{\n  "num_layers": 4,\n  "hidden_size": ,\n}\n')
    err = config_error(read_mapping, path)
    assert "broken.json" in str(err) and "line 3" in str(err) and "JSON" in str(err)


def test_malformed_yaml_names_the_file_and_line(tmp_path):
    path = write(tmp_path / "broken.yaml", "num_layers: 4\nhidden_size: [64\nbias: false\n")
    err = config_error(read_mapping, path)
    assert "broken.yaml" in str(err) and "line 3" in str(err) and "YAML" in str(err)


def test_a_gpu_number_no_device_has_is_refused_by_its_key(tmp_path):
    base = "gpu = 'x'\n[intra_node]\nname = 'a'\nbandwidth_GBps = 100\n[inter_node]\nname = 'b'\nbandwidth_GBps = 10\n"
    for extra, needle in (("memory_GiB = 1e9\n", "memory_GiB=1000000000.0: is outside any real GPU's range"),
                          ("[peak_tflops]\nbf16 = 0\n", "peak_tflops.bf16=0.0: is outside any real GPU's range"),
                          ("[peak_tflops]\nbf16 = 1e12\n", "peak_tflops.bf16=1000000000000.0")):
        path = write(tmp_path / "c.toml", extra + base if "[" not in extra else base + extra)
        assert needle in str(config_error(load_cluster, path))
    zero = write(tmp_path / "z.toml", base.replace("bandwidth_GBps = 100", "bandwidth_GBps = 0"))
    assert "intra_node.bandwidth_GBps=0: 0 GB/s is outside any real link's range" in str(config_error(load_cluster, zero))


def test_a_key_given_twice_is_refused_in_every_format(tmp_path):
    """JSON and YAML parsers keep the last of two equal keys; TOML refuses them. A spec says each value once."""
    js = write(tmp_path / "dup.json", '{"num_layers": 16, "hidden_size": 64, "num_layers": 4}')
    assert "key 'num_layers' is given twice (16 and 4)" in str(config_error(read_mapping, js))
    nested = write(tmp_path / "nested.json", '{"intra_node": {"bandwidth_GBps": 1, "bandwidth_GBps": 2}}')
    assert "key 'bandwidth_GBps' is given twice" in str(config_error(read_mapping, nested))
    toml = write(tmp_path / "dup.toml", "num_layers = 16\nnum_layers = 4\n")
    assert "dup.toml" in str(config_error(read_mapping, toml))
    pytest.importorskip("yaml")
    yml = write(tmp_path / "dup.yaml", "num_layers: 16\nhidden_size: 64\nnum_layers: 4\n")
    assert "key 'num_layers' is given twice (lines 1 and 3)" in str(config_error(read_mapping, yml))
    assert read_mapping(write(tmp_path / "ok.yaml", "a: {b: 1}\nc: {b: 2}\n")) == {"a": {"b": 1}, "c": {"b": 2}}


def test_yaml_without_pyyaml_says_what_to_install(tmp_path):
    path = write(tmp_path / "m.yaml", "num_layers: 4\n")
    # A real interpreter in which `import yaml` fails, as on an install without the extra.
    code = (
        "import sys; sys.modules['yaml'] = None\n"
        "from commscope.spec.files import read_mapping\n"
        "from commscope.errors import ConfigError\n"
        f"try:\n    read_mapping({str(path)!r})\nexcept ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "commscope[yaml]" in out and "m.yaml" in out


def test_missing_file_unknown_suffix_and_non_mapping_top_level(tmp_path):
    assert "no such file" in str(config_error(read_mapping, tmp_path / "nope.toml"))
    err = config_error(read_mapping, write(tmp_path / "m.ini", "a = 1"))
    assert ".ini" in str(err) and ".toml" in str(err)
    err = config_error(read_mapping, write(tmp_path / "list.json", "[1, 2]"))
    assert "list.json" in str(err) and "mapping" in str(err)


# ----- mapping -> spec errors -----


def test_model_file_with_meta_loads_and_takes_its_name_from_the_file(tmp_path):
    model = load_model(write(tmp_path / "tiny.toml", SMALL_MODEL_TOML))
    assert model == ModelSpec(name="tiny", num_layers=4, hidden_size=64, num_heads=4, vocab_size=1000, seq_len=128)


def test_unknown_key_lists_valid_keys_and_suggests_a_close_one(tmp_path):
    path = write(tmp_path / "typo.toml", SMALL_MODEL_TOML.replace("hidden_size", "hiden_size"))
    err = config_error(load_model, path)
    assert err.field == "hiden_size"
    assert "typo.toml" in str(err) and "unknown key" in str(err)
    assert "did you mean 'hidden_size'" in str(err) and "num_query_groups" in str(err)


def test_wrong_type_names_the_field_and_the_expected_type(tmp_path):
    path = write(tmp_path / "wrong.toml", SMALL_MODEL_TOML.replace("num_layers = 4", 'num_layers = "4"'))
    err = config_error(load_model, path)
    assert err.field == "num_layers" and "wrong.toml" in str(err)
    assert "expected an integer, got a string" in str(err)
    err = config_error(model_from_mapping, {"num_layers": True, "hidden_size": 64, "num_heads": 4})
    assert err.field == "num_layers" and "integer" in str(err)
    err = config_error(model_from_mapping, {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "bias": 1})
    assert err.field == "bias" and "true or false" in str(err)
    err = config_error(model_from_mapping, {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "normalization": "batchnorm"})
    assert err.field == "normalization" and "'rmsnorm'" in str(err)


def test_missing_required_key_is_named(tmp_path):
    path = write(tmp_path / "short.json", json.dumps({"hidden_size": 64, "num_heads": 4}))
    err = config_error(load_model, path)
    assert err.field == "num_layers" and "required" in str(err) and "short.json" in str(err)


def test_spec_validation_errors_carry_the_file_name(tmp_path):
    path = write(tmp_path / "heads.toml", SMALL_MODEL_TOML.replace("num_heads = 4", "num_heads = 5"))
    err = config_error(load_model, path)
    assert err.field == "num_heads" and "heads.toml" in str(err) and "hidden_size=64" in str(err)


def test_parallel_file_errors(tmp_path):
    spec = load_parallel(write(tmp_path / "p.toml", "tp = 2\npp = 2\ndp = 4\nglobal_batch_size = 64\npipeline_layers = [3, 5]\n"))
    assert spec == ParallelSpec(tp=2, pp=2, dp=4, global_batch_size=64, pipeline_layers=(3, 5))
    err = config_error(load_parallel, write(tmp_path / "bad.toml", "tp = 2\nzero = 1\n"))
    assert err.field == "zero" and "did you mean 'zero_stage'" in str(err) and "bad.toml" in str(err)
    err = config_error(parallel_from_mapping, {"pipeline_layers": [1, "2"]})
    assert err.field == "pipeline_layers" and "list of integers" in str(err)
    err = config_error(load_parallel, tmp_path / "missing.toml")
    assert err.field == "path" and "missing.toml" in str(err)


# ----- clusters -----


def test_cluster_file_converts_human_units_to_si(tmp_path):
    cluster = load_cluster(write(tmp_path / "mine.toml", CLUSTER_TOML))
    assert cluster.name == "mine" and cluster.source == "test"
    assert cluster.memory_bytes == 80 * GiB
    assert cluster.memory_bandwidth_bytes_per_s == 2039 * GB
    assert cluster.peak_flops == {"bf16": 312e12, "fp32": 19.5e12}
    assert cluster.intra_node == LinkTier(name="NVLink3", bandwidth_bytes_per_s=230e9, latency_s=2.5e-6)
    assert cluster.inter_node == LinkTier(name="HDR", bandwidth_bytes_per_s=24e9, latency_s=5e-6)


def test_cluster_file_errors_name_the_key(tmp_path):
    err = config_error(load_cluster, write(tmp_path / "a.toml", CLUSTER_TOML.replace("bandwidth_GBps = 230", "bandwith_GBps = 230")))
    assert err.field == "intra_node.bandwith_GBps" and "did you mean 'bandwidth_GBps'" in str(err) and "a.toml" in str(err)
    err = config_error(load_cluster, write(tmp_path / "b.toml", CLUSTER_TOML.replace("memory_GiB = 80", 'memory_GiB = "80"')))
    assert err.field == "memory_GiB" and "expected a number" in str(err)
    err = config_error(load_cluster, write(tmp_path / "c.toml", CLUSTER_TOML.replace("memory_GiB = 80", "memory_GiB = 80\nmemory_bytes = 1")))
    assert err.field == "memory_GiB" and "not both" in str(err)
    err = config_error(load_cluster, write(tmp_path / "d.toml", CLUSTER_TOML.replace("bf16 = 312", "bf17 = 312")))
    assert err.field == "peak_tflops.bf17" and "bf16" in str(err)
    err = config_error(cluster_from_mapping, {"gpu": "x", "intra_node": {"name": "n", "bandwidth_GBps": 1}}, source="e.json")
    assert err.field == "inter_node" and "e.json" in str(err)
    err = config_error(cluster_from_mapping, {"intra_node": {"name": "n"}, "inter_node": {"name": "m", "bandwidth_GBps": 1}})
    assert err.field == "intra_node.bandwidth_bytes_per_s" and "bandwidth_GBps" in str(err)
    err = config_error(cluster_from_mapping, {"gpu_util": 1.5, "intra_node": {"name": "n", "bandwidth_GBps": 1},
                                              "inter_node": {"name": "m", "bandwidth_GBps": 1}}, source="f.toml")
    assert err.field == "gpu_util" and "f.toml" in str(err)


# ----- load by name or path -----


def test_load_by_preset_name_and_path_like_values(tmp_path):
    assert load_model("gpt3-175b") == model_preset("gpt3-175b")
    assert load_model("LLAMA3-8B", seq_len=4096).seq_len == 4096
    assert load_cluster("dgx-a100") == cluster_preset("dgx-a100")
    err = config_error(load_model, "gpt3-176b")
    assert err.field == "model" and "did you mean 'gpt3-175b'" in str(err)
    err = config_error(load_cluster, "dgx-a10")
    assert err.field == "cluster" and "dgx-a100" in str(err)
    err = config_error(load_model, str(tmp_path / "absent.toml"))
    assert err.field == "path" and "no such file" in str(err)


def test_load_model_detects_hugging_face_config_json(tmp_path):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    config = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "n_positions": 1024, "vocab_size": 50257}
    model = load_model(write(folder / "config.json", json.dumps(config)))
    assert model.name == "gpt2" and model.num_parameters() == 124_439_808
    assert load_model(folder) == model


# ----- round trips -----


@pytest.mark.parametrize("suffix", [".toml", ".json", ".yaml"])
@pytest.mark.parametrize("name", preset_names("models"))
def test_model_presets_survive_a_file_round_trip(tmp_path, name, suffix):
    model = model_preset(name)
    path = write_mapping(tmp_path / f"{name}{suffix}", model_to_mapping(model))
    assert load_model(path) == model


@pytest.mark.parametrize("suffix", [".toml", ".json"])
@pytest.mark.parametrize("name", preset_names("clusters"))
def test_cluster_presets_survive_a_file_round_trip(tmp_path, name, suffix):
    cluster = cluster_preset(name)
    path = write_mapping(tmp_path / f"{name}{suffix}", cluster_to_mapping(cluster))
    assert load_cluster(path) == cluster
    if suffix == ".toml":
        text = path.read_text()
        assert "bandwidth_GBps" in text and "memory_GiB" in text and "[peak_tflops]" in text


@st.composite
def clusters(draw):
    """Clusters with awkward floats, so that some values cannot be written in human units exactly."""
    # within any real device's range: a cluster file outside it is refused (files.GPU_RANGES)
    flops = st.floats(min_value=1e9, max_value=1e17, allow_nan=False, allow_infinity=False)
    hbm = st.floats(min_value=1e9, max_value=1e15, allow_nan=False, allow_infinity=False)

    def tier(label):
        # within any real link's range: a cluster file outside it is refused (LINK_BANDWIDTH_RANGE_BYTES_PER_S)
        return LinkTier(name=draw(st.text(max_size=12)) or label,
                        bandwidth_bytes_per_s=draw(st.floats(min_value=1e7, max_value=1e13)),
                        latency_s=draw(st.floats(min_value=1e-7, max_value=1e-2)), source=draw(st.text(max_size=20)))

    return ClusterSpec(
        name=draw(st.text(max_size=12)),
        gpu=draw(st.text(max_size=12)),
        gpus_per_node=draw(st.integers(1, 16)),
        peak_flops=draw(st.dictionaries(st.sampled_from(["bf16", "fp16", "fp32", "tf32", "fp8"]), flops, max_size=3)),
        memory_bytes=draw(st.one_of(st.integers(2**26, 2**40), st.integers(1, 256).map(lambda g: g * GiB))),
        memory_bandwidth_bytes_per_s=draw(st.one_of(st.just(0.0), hbm)),
        gpu_util=draw(st.floats(min_value=1e-3, max_value=1.0)),
        intra_node=tier("intra"),
        inter_node=tier("inter"),
        nics_per_node=draw(st.integers(1, 8)),
        source=draw(st.text(max_size=20)),
    )


ROUND_TRIP = settings(max_examples=60, deadline=None)


@ROUND_TRIP
@given(job=strategies.jobs(moe=None), suffix=st.sampled_from([".toml", ".json"]), name=st.text(max_size=20))
def test_random_specs_survive_a_file_round_trip(tmp_path_factory, job, suffix, name):
    model, parallel = job
    model = ModelSpec(**{**model_to_mapping(model), "name": name})
    folder = tmp_path_factory.mktemp("rt")
    model_path = write_mapping(folder / f"model{suffix}", model_to_mapping(model))
    parallel_path = write_mapping(folder / f"parallel{suffix}", parallel_to_mapping(parallel))
    assert model_from_mapping(read_mapping(model_path)) == model
    assert load_parallel(parallel_path) == parallel


@ROUND_TRIP
@given(cluster=clusters(), suffix=st.sampled_from([".toml", ".json"]))
def test_random_clusters_survive_a_file_round_trip(tmp_path_factory, cluster, suffix):
    path = write_mapping(tmp_path_factory.mktemp("rt") / f"cluster{suffix}", cluster_to_mapping(cluster))
    assert cluster_from_mapping(read_mapping(path)) == cluster


@given(st.dictionaries(st.text(max_size=8), st.one_of(st.text(), st.integers(), st.booleans(),
                                                      st.floats(allow_nan=False), st.lists(st.integers(), max_size=3)),
                       max_size=5))
def test_dumps_toml_is_read_back_by_tomllib(d):
    assert tomllib.loads(dumps_toml(d)) == d
