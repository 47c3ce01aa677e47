"""Every preset loads; model sizes match the published ones; cluster numbers match their cited sources."""

from __future__ import annotations

import csv
import re
import tomllib
from pathlib import Path

import pytest
from conftest import SHARED, requires_shared

import commscope.presets
from commscope.errors import ConfigError
from commscope.presets import cluster_preset, list_presets, model_preset, preset_names, preset_path
from commscope.spec import ClusterSpec, ModelSpec
from commscope.units import GB, TFLOP

#: Published total parameter counts: (value, relative tolerance, source).
PUBLISHED_PARAMETERS = {
    "gpt3-125m": (125e6, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-350m": (350e6, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-760m": (760e6, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-1.3b": (1.3e9, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-2.7b": (2.7e9, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-6.7b": (6.7e9, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-13b": (13.0e9, 0.03, "Brown et al. 2020, Table 2.1"),
    "gpt3-175b": (175.0e9, 0.01, "Brown et al. 2020, Table 2.1"),
    "megatron21-18b": (18.4e9, 0.01, "Narayanan et al. 2021 (SC'21), Table 1: 18.4B"),
    "nemotron4-340b": (340e9, 0.01, "Nemotron-4 340B Technical Report, arXiv:2406.11704: 340B"),
    "llama2-7b": (6.74e9, 0.005, "Llama 2 model card (6,738,415,616 in the HF checkpoint)"),
    "llama2-70b": (69.0e9, 0.005, "HF checkpoint of Llama-2-70b (68,976,648,192)"),
    "llama3-8b": (8.03e9, 0.005, "Llama 3 model card, 8.03B"),
    "llama3-70b": (70.6e9, 0.005, "Llama 3 model card, 70.6B"),
    "llama3-405b": (405.9e9, 0.005, "Llama 3.1 model card, 405.9B (arXiv:2407.21783 Table 3: 405B)"),
    "mixtral-8x7b": (46.7e9, 0.005, "Jiang et al. 2024 (Mixtral), 47B total; HF checkpoint 46.7B"),
    "deepseek-moe-16b": (16.4e9, 0.01, "Dai et al. 2024 (DeepSeekMoE), 16.4B total"),
    "gpt-1.5b": (1.5e9, 0.12, "seed talk, 1.5B; shape assumed, so only the order of magnitude is checked"),
    "gpt-3b": (3.0e9, 0.06, "seed talk, 3B; shape assumed, so only the order of magnitude is checked"),
    "ref-gpt": (262_720, 0.0, "commscope workload gpt: the torch module counts 262,720 (tests/workloads)"),
    "ref-moe": (361_792, 0.0, "commscope workload moe: the torch modules of all EP ranks count 361,792 (tests/workloads)"),
}

MODEL_PRESETS = preset_names("models")
CLUSTER_PRESETS = preset_names("clusters")

BUSBW_CSV = SHARED / "data" / "published_busbw.csv"

PRESET_FILES = sorted(Path(commscope.presets.__file__).parent.rglob("*.toml"))
#: A path of some machine: /work/..., /home/..., ~/..., C:\... (not "GB/s", "fp16/bf16" or a URL's "//host/").
MACHINE_PATH = re.compile(r"(?<![\w.:/)\]])(?:/[A-Za-z_][\w.-]*/|~/|[A-Za-z]:\\)")


def test_all_named_presets_exist():
    assert set(MODEL_PRESETS) == set(PUBLISHED_PARAMETERS)
    assert set(CLUSTER_PRESETS) == {"rtx3090-pcie", "dgx1-v100", "dgx-a100", "dgx-h100", "dgx-h200"}


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_model_preset_loads_with_meta(name):
    model = model_preset(name)
    assert isinstance(model, ModelSpec) and model.name == name
    meta = tomllib.loads(preset_path("models", name).read_text(encoding="utf-8"))["meta"]
    assert meta["description"] and meta["source"]


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_model_parameters_match_published(name):
    published, rel, _source = PUBLISHED_PARAMETERS[name]
    assert model_preset(name).num_parameters() == pytest.approx(published, rel=rel)


def test_known_exact_parameter_counts():
    # Hugging Face checkpoints' exact sizes.
    assert model_preset("llama2-7b").num_parameters() == 6_738_415_616
    assert model_preset("llama3-8b").num_parameters() == 8_030_261_248
    assert model_preset("mixtral-8x7b").num_parameters() == 46_702_792_704


def test_moe_presets_have_their_routing():
    mixtral = model_preset("mixtral-8x7b")
    assert (mixtral.num_experts, mixtral.top_k, mixtral.num_moe_layers, mixtral.kv_heads) == (8, 2, 32, 8)
    deepseek = model_preset("deepseek-moe-16b")
    assert (deepseek.num_experts, deepseek.top_k, deepseek.num_shared_experts, deepseek.num_moe_layers) == (64, 6, 2, 27)


@pytest.mark.parametrize("name", CLUSTER_PRESETS)
def test_cluster_preset_loads_with_sources(name):
    cluster = cluster_preset(name)
    assert isinstance(cluster, ClusterSpec) and cluster.name == name and cluster.gpus_per_node == 8
    assert cluster.intra_node.source and cluster.inter_node.source and cluster.source
    assert cluster.intra_node.bandwidth_bytes_per_s > cluster.inter_node.bandwidth_bytes_per_s
    assert cluster.peak_flops_for("bf16") > 0 and cluster.memory_bandwidth_bytes_per_s > 0


def test_cluster_datasheet_numbers():
    # Vendor datasheets, dense tensor-core peaks; the seed talk's u for RTX3090 and V100.
    expected = {"rtx3090-pcie": (71, 0.3), "dgx1-v100": (125, 0.4), "dgx-a100": (312, 0.5), "dgx-h100": (989, 0.45)}
    for name, (tflops, util) in expected.items():
        cluster = cluster_preset(name)
        assert cluster.peak_flops_for("fp16") == tflops * TFLOP and cluster.gpu_util == util


@requires_shared("data", "published_busbw.csv")
def test_cluster_bandwidths_match_published_busbw():
    with BUSBW_CSV.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))

    def plateau(hardware: str, interconnect: str) -> float:
        values = [float(r["busbw_GBps"]) for r in rows
                  if r["source"] == "NVIDIA GTC24 S62129" and r["hardware"] == hardware and r["interconnect"] == interconnect]
        assert values, (hardware, interconnect)
        return values[0]

    def close(name: str, tier: str, published: float, rel: float) -> None:
        value = getattr(cluster_preset(name), tier).bandwidth_bytes_per_s / GB
        assert value == pytest.approx(published, rel=rel), (name, tier)

    close("dgx-a100", "intra_node", plateau("A100 (DGX A100)", "NVLink3"), 0.02)
    close("dgx-h100", "intra_node", plateau("H100 (DGX H100)", "NVLink4"), 0.02)
    close("dgx1-v100", "intra_node", plateau("V100", "NVLink2"), 0.08)
    close("rtx3090-pcie", "intra_node", plateau("PCIe Gen4 GPUs", "PCIe Gen4"), 0.02)
    close("dgx-a100", "inter_node", plateau("multi-node", "200Gb RDMA (IB/RoCE)"), 0.02)
    close("dgx-h100", "inter_node", plateau("multi-node", "400Gb RDMA (IB/RoCE)"), 0.02)
    # One 100GbE NIC per node shared by 8 GPUs.
    close("rtx3090-pcie", "inter_node", plateau("multi-node", "100GbE TCP/IP sockets") / 8, 0.02)


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_presets_cite_data_by_name_never_by_a_machine_path(path):
    # Data is cited by file and row name (e.g. shared/data/published_busbw.csv, row '...'), which any reader can
    # find, never by where it lay on the machine the preset was written on.
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        assert not MACHINE_PATH.search(line), f"{path.name}:{number} names a machine path: {line.strip()[:200]}"


def test_machine_path_pattern():
    for text in ("from /work/shared/data/x.csv", "'/home/me/x'", "~/data/x.csv", r"C:\data\x.csv"):
        assert MACHINE_PATH.search(text), text
    for text in ("989 TFLOP/s bf16/fp16", "8x 200 Gb/s (IB/RoCE)", "config https://huggingface.co/org/model/blob/x",
                 "the commscope project's shared/data/published_busbw.csv, rows as cited"):
        assert not MACHINE_PATH.search(text), text
    assert len(PRESET_FILES) >= 20  # the presets were found at all


def test_unknown_preset_names_the_field_lists_names_and_suggests():
    with pytest.raises(ConfigError) as info:
        model_preset("llama-3-8b")
    err = info.value
    assert err.field == "model" and err.value == "llama-3-8b"
    assert "gpt3-175b" in str(err) and "did you mean 'llama3-8b'" in str(err)
    with pytest.raises(ConfigError) as info:
        cluster_preset("dgx-b200")
    assert info.value.field == "cluster" and "dgx-h100" in str(info.value)
    with pytest.raises(ConfigError) as info:
        preset_path("gpus", "a100")
    assert info.value.field == "kind" and "models" in str(info.value)


def test_preset_names_are_case_insensitive():
    assert model_preset("GPT3-175B") == model_preset("gpt3-175b")


def test_list_presets_rows():
    listing = list_presets()
    assert [r["name"] for r in listing["models"]] == MODEL_PRESETS
    assert [r["name"] for r in listing["clusters"]] == CLUSTER_PRESETS
    row = next(r for r in listing["models"] if r["name"] == "llama3-70b")
    assert row["num_parameters"] == model_preset("llama3-70b").num_parameters() and row["source"] and row["description"]
    row = next(r for r in listing["clusters"] if r["name"] == "dgx-a100")
    assert (row["intra_node_GBps"], row["inter_node_GBps"], row["peak_bf16_tflops"]) == (230, 24, 312)
