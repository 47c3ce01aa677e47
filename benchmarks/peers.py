"""The analytic peers, timed on the jobs ``bench_scale.py`` times commscope on: llm-analysis and Calculon.

Run by ``bench_scale.py`` in the interpreter that has them installed (``--peer-python``: the peers need packages
commscope's environment does not hold, and Calculon is not on PyPI), so this file imports only the standard
library and the peers. It reads one JSON object from its argument and prints one JSON line:

    {"scalar": [tp, pp, dp], "sweep": [[tp, pp, dp, micro_batch, sp, recompute, distributed_optimizer], ...],
     "global_batch_size": 1536, "min_s": 2.0, "calculon_data": "/path/to/a/calculon/checkout"}

The job is GPT-3 175B (seq 2,048, bf16/fp16 weights) on A100 80 GB, as each peer ships it: llm-analysis's
``megatron-lm-175b`` model and ``a100-sxm-80gb`` GPU (flops efficiency 0.5, HBM efficiency 0.9); Calculon's
``models/gpt3-175B.json`` and ``systems/a100_80g.json`` from its repository (``calculon_data``: pip installs its
code without them). Each configuration maps onto the peer's knobs: sequence parallelism is llm-analysis's
``sp_size = tp`` (else 1) and Calculon's ``rs_ag`` TP communication (else ``ar``); selective recomputation is
Calculon's ``attn_only``; the distributed optimizer is llm-analysis's ZeRO-1 and Calculon's ``optimizer_sharding``.

Rates are per CPU second of this process (``time.process_time``), like commscope's:

- ``scalar_per_cpu_s``: one estimate of the scalar job, repeated for ``min_s`` seconds;
- ``sweep_per_cpu_s``: every configuration of the sweep once (a configuration a peer refuses counts: Calculon's
  own search counts its failed executions too; ``sweep_refused`` says how many of one pass), repeated for ``min_s``;
- ``cli_s``: median wall time of the peer's command line on the scalar job (5 runs, fresh processes).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable
from typing import Any

SEQ_LEN = 2048


def _rate(fn: Callable[[], int], min_s: float) -> float:
    """Calls per CPU second of ``fn`` (which returns how many it made), run for at least ``min_s`` CPU seconds."""
    fn()  # warm: first-call imports and caches are start-up, not the estimate
    n, c0 = 0, time.process_time()
    while time.process_time() - c0 < min_s:
        n += fn()
    return n / (time.process_time() - c0)


def _measure(one: Callable[..., bool], job: dict[str, Any]) -> dict[str, Any]:
    """Rates of a peer's ``one(tp, pp, dp, mb, sp, recompute, dist_opt)`` (False: it refused the configuration) on
    the scalar job and over the sweep, and how many of the sweep's configurations it refuses."""
    tp, pp, dp = job["scalar"]

    def sweep() -> int:
        for c in job["sweep"]:
            one(*c)
        return len(job["sweep"])

    return {"scalar_per_cpu_s": _rate(lambda: int(one(tp, pp, dp)) or 1, job["min_s"]),
            "sweep_per_cpu_s": _rate(sweep, job["min_s"]), "sweep_refused": sum(not one(*c) for c in job["sweep"])}


def cli_wall_s(cmd: list[str], runs: int = 5) -> float:
    """Median wall time of a command in fresh processes."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def llm_analysis(job: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.config import (
        ParallelismConfig,
        get_dtype_config_by_name,
        get_gpu_config_by_name,
        get_model_config_by_name,
    )

    logging.disable(logging.CRITICAL)
    cfg = (get_model_config_by_name("megatron-lm-175b"), get_gpu_config_by_name("a100-sxm-80gb"),
           get_dtype_config_by_name("w16a16e16"))
    gb = job["global_batch_size"]
    recompute = {"none": ActivationRecomputation.NONE, "selective": ActivationRecomputation.SELECTIVE,
                 "full": ActivationRecomputation.FULL}

    def one(tp: int, pp: int, dp: int, mb: int = 1, sp: bool = True, rc: str = "none", dist: bool = False) -> bool:
        a = LLMAnalysis(*cfg, ParallelismConfig(tp_size=tp, pp_size=pp, dp_size=dp, sp_size=tp if sp else 1),
                        flops_efficiency=0.5, hbm_memory_efficiency=0.9)
        try:
            a.training(global_batch_size=gb, seq_len=SEQ_LEN, batch_size_per_gpu=mb,
                       activation_recomputation=recompute[rc], ds_zero=DSZeRO.STAGE_1 if dist else DSZeRO.NONE)
        except (AssertionError, ValueError):  # a configuration it refuses (counted, as Calculon's failures are)
            return False
        return True

    tp, pp, dp = job["scalar"]
    out: dict[str, Any] = {"version": version("llm-analysis"), **_measure(one, job)}
    out["cli_s"] = cli_wall_s([sys.executable, "-m", "llm_analysis.analysis", "train", "--model_name", "megatron-lm-175b",
                           "--gpu_name", "a100-sxm-80gb", "--dtype_name", "w16a16e16", "--tp_size", str(tp), "--pp_size",
                           str(pp), "--dp_size", str(dp), "--global_batch_size", str(gb), "--seq_len", str(SEQ_LEN),
                           "--batch_size_per_gpu", "1", "--flops_efficiency", "0.5", "--log_level", "CRITICAL"])
    return out


def _calculon_execution(tp: int, pp: int, dp: int, mb: int = 1, sp: bool = True, rc: str = "none", dist: bool = False,
                        gb: int = 1536) -> dict[str, Any]:
    return {"num_procs": tp * pp * dp, "tensor_par": tp, "pipeline_par": pp, "data_par": dp, "tensor_par_net": 0,
            "pipeline_par_net": 1, "data_par_net": 1, "batch_size": gb, "microbatch_size": mb, "datatype": "float16",
            "fused_activation": True, "attention_type": "multihead",
            "activation_recompute": {"none": "none", "selective": "attn_only", "full": "full"}[rc],
            "pipeline_interleaving": 1, "optimizer_sharding": dist and dp > 1,
            "tensor_par_comm_type": "rs_ag" if sp and tp > 1 else "ar", "tensor_par_overlap": "none",
            "seq_par_ag_redo": False, "data_par_overlap": False, "weight_offload": False, "activations_offload": False,
            "optimizer_offload": False, "training": True}


def calculon(job: dict[str, Any]) -> dict[str, Any]:
    from importlib.metadata import version

    from calculon.llm import Llm
    from calculon.system import System

    data = Path(job.get("calculon_data") or "")
    app_file, sys_file = data / "models" / "gpt3-175B.json", data / "systems" / "a100_80g.json"
    if not app_file.is_file() or not sys_file.is_file():
        return {"skipped": f"no Calculon checkout with models/ and systems/ at {str(data)!r} (--calculon-data)"}
    app = Llm.Application(json.loads(app_file.read_text()))
    syst = System(json.loads(sys_file.read_text()))
    log = logging.getLogger("calculon")
    log.disabled = True
    gb = job["global_batch_size"]

    def one(*c: Any) -> bool:
        try:
            model = Llm(app, log)
            model.compile(syst, Llm.Execution.from_json(_calculon_execution(*c, gb=gb)))
            model.run(syst)
        except (Llm.Error, AssertionError):  # what Calculon's own search counts as a bad execution
            return False
        return True

    tp, pp, dp = job["scalar"]
    out: dict[str, Any] = {"version": version("calculon"), **_measure(one, job)}
    with tempfile.TemporaryDirectory() as d:
        exe = Path(d) / "exe.json"
        exe.write_text(json.dumps(_calculon_execution(tp, pp, dp, gb=gb)))
        script = Path(sys.executable).parent / "calculon"
        out["cli_s"] = cli_wall_s([sys.executable, str(script), "llm", str(app_file), str(exe), str(sys_file),
                               str(Path(d) / "stats.json")])
    return out


def main(argv: list[str]) -> int:
    job = json.loads(argv[1])
    out: dict[str, Any] = {}
    for name, fn in (("llm_analysis", llm_analysis), ("calculon", calculon)):
        try:
            out[name] = fn(job)
        except ImportError as exc:
            out[name] = {"skipped": f"not installed in {sys.executable} ({exc.name})"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv))
