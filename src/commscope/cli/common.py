"""Flags shared by the commands that describe a job (Megatron-LM's spellings), and their resolution.

Precedence: a flag given on the command line > the ``--model``/``--cluster``/``--parallel`` preset or file >
the built-in defaults below.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import fields, replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

from commscope.commop import MAX_RANKS
from commscope.errors import ConfigError
from commscope.spec.cluster import ClusterSpec
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

#: The job `commscope traffic` describes when given no flags: the seed talk's 1.5B GPT on a DGX-1. One sequence per
#: micro-batch, as Megatron-LM's own pretraining scripts run (examples/gpt3/train_gpt3_175b_distributed.sh,
#: examples/llama; Megatron requires --micro-batch-size and has no default of its own): larger micro-batches fill
#: the pipeline with fewer of them and hold more activations (a Llama 3 405B job on pp 16 at 4: 79% bubble).
DEFAULT_MODEL = "gpt-1.5b"
DEFAULT_CLUSTER = "dgx1-v100"
DEFAULT_PARALLEL = {"tp": 2, "pp": 4, "dp": 4, "global_batch_size": 512, "micro_batch_size": 1}

def warn(args: argparse.Namespace | None, message: str) -> None:
    """One warning line on stderr: ``commscope estimate: warning: ...``."""
    command = getattr(args, "command", None)
    print(f"commscope{' ' + command if command else ''}: warning: {message}", file=sys.stderr)


def check_out_dir(path: Path | None, field: str = "out", shown: Path | None = None) -> None:
    """Refuse an output directory that cannot be made before any work starts: a file (or a file among its
    parents), or an existing parent the user cannot write into. ``shown``: the value the user gave, when ``path``
    is the folder of the file they named. Permissions can say yes where the filesystem says no (/proc, a
    read-only mount): the nearest existing folder is tried with a real file or folder."""
    if path is None:
        return
    import tempfile

    given = str(shown if shown is not None else path)
    for p in (path, *path.parents):
        if not p.exists():
            continue
        if not p.is_dir():
            raise ConfigError(field, given, f"{p} is a file, not a directory; give a directory")
        if not os.access(p, os.W_OK | os.X_OK):
            raise ConfigError(field, given, "is not writable; choose a writable directory" if p == path else
                              f"cannot create it: {p} is not writable")
        try:
            if p == path:
                fd, probe = tempfile.mkstemp(prefix=".commscope-check-", dir=p)
                os.close(fd)
                os.unlink(probe)
            else:
                os.rmdir(tempfile.mkdtemp(prefix=".commscope-check-", dir=p))
        except OSError as exc:
            where = f"create it in {p}" if p != path else f"write into {p}" if shown is not None else "write into it"
            raise ConfigError(field, given, f"cannot {where}: {exc.strerror or exc}") from None
        return


def out_path(text: str) -> Path:
    """argparse type of an output path: an empty one (``--out ""``) would mean the current folder, silently."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def check_out_file(path: Path | None, field: str = "out") -> None:
    """Refuse an output file that is a directory or whose directory cannot be written, before any work."""
    if path is None:
        return
    if path.is_dir():
        raise ConfigError(field, str(path), "is a directory; give a file name")
    if path.exists() and not path.is_file():  # a device, a pipe: outputs are written beside and renamed over
        raise ConfigError(field, str(path), "is not a regular file (a device, a pipe or a socket); give a file name")
    check_out_dir(path.parent if str(path.parent) else Path("."), field, shown=path)


# (flags, dest, type, help) — dest is the spec field
_MODEL_FLAGS: list[tuple[tuple[str, ...], str, Any, str]] = [
    (("--num-layers",), "num_layers", int, "transformer layers"),
    (("--hidden-size",), "hidden_size", int, "model width h"),
    (("--num-attention-heads", "--num-heads"), "num_heads", int, "attention heads"),
    (("--num-query-groups",), "num_query_groups", int, "key/value heads (GQA)"),
    (("--ffn-hidden-size",), "ffn_hidden_size", int, "MLP width (default 4h)"),
    (("--kv-channels", "--head-dim"), "head_dim", int, "width of one head"),
    (("--vocab-size",), "vocab_size", int, "vocabulary before padding"),
    (("--seq-length", "--seq-len"), "seq_len", int, "sequence length s"),
    (("--make-vocab-size-divisible-by",), "make_vocab_size_divisible_by", int, "vocabulary padding multiple (x tp)"),
    (("--num-experts",), "num_experts", int, "routed experts per MoE layer (0: dense)"),
    (("--moe-router-topk", "--top-k"), "top_k", int, "experts per token"),
    (("--moe-layer-freq",), "moe_layer_freq", int, "every k-th layer is MoE"),
    (("--moe-ffn-hidden-size",), "moe_ffn_hidden_size", int, "width of one expert"),
    (("--dtype",), "dtype", str, "parameter/activation dtype: bf16, fp16, fp32 (also tf32, fp8, fp64)"),
]
_PARALLEL_FLAGS: list[tuple[tuple[str, ...], str, Any, str]] = [
    (("--tp", "--tensor-model-parallel-size"), "tp", int, f"tensor-parallel size (default {DEFAULT_PARALLEL['tp']})"),
    (("--pp", "--pipeline-model-parallel-size"), "pp", int, f"pipeline-parallel size (default {DEFAULT_PARALLEL['pp']})"),
    (("--dp", "--data-parallel-size"), "dp", int, f"data-parallel size (default {DEFAULT_PARALLEL['dp']}, or --gpus / (tp pp cp))"),
    (("--cp", "--context-parallel-size"), "cp", int, "context-parallel size (default 1)"),
    (("--ep", "--expert-model-parallel-size"), "ep", int, "expert-parallel size, inside dp x cp (default 1)"),
    (("--zero-stage",), "zero_stage", int, "ZeRO stage 0-3 (default 0)"),
    (("--recompute", "--recompute-granularity"), "recompute", str, "activation recomputation: none, selective, full"),
    (("--virtual-pipeline-size", "--num-virtual-stages-per-pipeline-rank"), "virtual_pipeline_size", int,
     "model chunks per pipeline rank (interleaved schedule when > 1)"),
    (("--schedule",), "schedule", str, "pipeline schedule: 1f1b or gpipe"),
    (("--global-batch-size",), "global_batch_size", int, f"sequences per iteration (default {DEFAULT_PARALLEL['global_batch_size']})"),
    (("--micro-batch-size",), "micro_batch_size", int, f"sequences per micro-batch (default {DEFAULT_PARALLEL['micro_batch_size']})"),
    (("--order",), "order", str, "rank order, innermost first (default tp-cp-ep-dp-pp)"),
    (("--grad-reduce-dtype",), "grad_reduce_dtype", str, "gradient-reduction dtype (default fp32 for bf16 models)"),
    (("--grad-bucket-size",), "grad_bucket_size", int, "elements per DP gradient bucket (default: one bucket)"),
    (("--framework",), "framework", str, ("whose implementation communicates: megatron (the default of traffic, estimate, plan), "
                                         "torch-ddp (the default of `workload gpt`), torch-fsdp2 (PyTorch's DDP/FSDP2 + "
                                         "DTensor TP + pipelining, as `commscope workload gpt` runs)")),
]


def int_list(text: str) -> tuple[int, ...]:
    """argparse type: comma-separated integers (``7,8,8,7``)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, e.g. 1,2,4; got {text!r}") from None


def attention_backend(text: str) -> str:
    """argparse type: Megatron-core's --attention-backend spellings to commscope's two attention kinds."""
    from commscope.spec.parallel import ATTENTION_BACKENDS as kinds

    if text not in kinds:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(kinds)}; got {text!r}")
    return kinds[text]


def add_jobs_arg(p: argparse.ArgumentParser) -> None:
    """``--jobs``: how many rank files a command reads at once."""
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="read N rank files at once, in worker processes (default 1; at most the machine's cores). "
                        "Logs are read one rank file at a time and folded into totals either way: memory follows "
                        "the distinct ops of the run, not its records")


def add_job_args(parser: argparse.ArgumentParser) -> None:
    """Add model, parallelism and cluster flags."""
    add_model_args(parser)
    add_parallel_args(parser)
    add_cluster_args(parser)


def _with_default(text: str, default: str | None) -> str:
    """A flag's help with its "(default ...)" replaced by a command's own default."""
    if default is None:
        return text
    if "(default" in text:
        return re.sub(r"\(default [^,)]*", f"(default {default}", text, count=1)
    return f"{text} (default {default})"


def add_model_args(parser: argparse.ArgumentParser, default_model: str | None = None) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", default=None, help=f"preset name (see `commscope presets`), a TOML/JSON/YAML spec, or a Hugging Face config.json (default {default_model or DEFAULT_MODEL})")
    for flags, dest, typ, text in _MODEL_FLAGS:
        g.add_argument(*flags, dest=f"model.{dest}", type=typ, default=None, help=text)
    g.add_argument("--tied-embeddings", dest="model.tied_embeddings", action=argparse.BooleanOptionalAction, default=None,
                   help="input embedding and output layer share weights")
    g.add_argument("--untie-embeddings-and-output-weights", dest="model.tied_embeddings", action="store_const", const=False,
                   help="Megatron's spelling of --no-tied-embeddings")
    g.add_argument("--bf16", dest="model.dtype", action="store_const", const="bf16", help="same as --dtype bf16")
    g.add_argument("--fp16", dest="model.dtype", action="store_const", const="fp16", help="same as --dtype fp16")


def add_parallel_args(parser: argparse.ArgumentParser, defaults: dict[str, str] | None = None) -> None:
    """The parallelism flags; ``defaults``: a command's own defaults, as its help shows them (field -> text)."""
    g = parser.add_argument_group("parallelism")
    g.add_argument("--parallel", default=None, help="a TOML/JSON/YAML file with ParallelSpec fields (flags override it)")
    for flags, dest, typ, text in _PARALLEL_FLAGS:
        g.add_argument(*flags, dest=f"parallel.{dest}", type=typ, default=None,
                       help=_with_default(text, (defaults or {}).get(dest)))
    g.add_argument("--sequence-parallel", dest="parallel.sequence_parallel", action=argparse.BooleanOptionalAction,
                   default=None, help="Megatron sequence parallelism")
    g.add_argument("--use-distributed-optimizer", "--distributed-optimizer", dest="parallel.distributed_optimizer",
                   action=argparse.BooleanOptionalAction, default=None, help="Megatron's distributed optimizer")
    g.add_argument("--pipeline-layers", dest="parallel.pipeline_layers", type=int_list, default=None,
                   help="explicit layers per pipeline stage (and virtual chunk), e.g. 7,8,8,7 (default: even; when pp "
                        "does not divide the layers, stages one layer apart at most, the first and last among the lighter)")
    g.add_argument("--decoder-first-pipeline-num-layers", dest="parallel.decoder_first_pipeline_num_layers", type=int,
                   default=None, help="layers of the first pipeline stage (Megatron); the other stages split the rest")
    g.add_argument("--decoder-last-pipeline-num-layers", dest="parallel.decoder_last_pipeline_num_layers", type=int,
                   default=None, help="layers of the last pipeline stage (Megatron); the other stages split the rest")
    g.add_argument("--scatter-gather-tensors-in-pipeline", dest="parallel.scatter_gather_tensors_in_pipeline",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="Megatron-LM (before megatron-core) sends 1/t of each pipeline message per TP rank and "
                        "all-gathers it on arrival, when sequence parallelism is off")
    o = parser.add_argument_group("overlap and precision (Megatron's flags)")
    o.add_argument("--overlap-grad-reduce", dest="parallel.overlap_grad_reduce", action=argparse.BooleanOptionalAction,
                   default=None, help="DP gradient buckets reduce during the last backward pass (buckets of max(40M, 1M x dp) "
                                      "elements unless --grad-bucket-size)")
    o.add_argument("--overlap-param-gather", dest="parallel.overlap_param_gather", action=argparse.BooleanOptionalAction,
                   default=None, help="the distributed optimizer's parameter all-gather runs under the next forward pass")
    o.add_argument("--overlap-p2p-communication", dest="parallel.overlap_p2p_comm",
                   action=argparse.BooleanOptionalAction, default=None,
                   help="interleaved schedule (--virtual-pipeline-size > 1): pipeline sends/receives run under the "
                        "other chunks' compute (Megatron's default; --no-overlap-p2p-communication turns it off)")
    o.add_argument("--tp-comm-overlap", dest="parallel.tp_comm_overlap", action=argparse.BooleanOptionalAction,
                   default=None, help="TP all-gather/reduce-scatter overlapped with the GEMMs (needs --sequence-parallel)")
    o.add_argument("--gradient-accumulation-fusion", dest="parallel.gradient_accumulation_fusion",
                   action=argparse.BooleanOptionalAction, default=None, help=GRADIENT_ACCUMULATION_FUSION_HELP)
    o.add_argument("--attention-backend", dest="parallel.attention", type=attention_backend, default=None,
                   metavar=ATTENTION_BACKEND_METAVAR, help=ATTENTION_BACKEND_HELP)
    o.add_argument("--use-flash-attn", dest="parallel.attention", action="store_const", const="flash",
                   help="same as --attention-backend flash (Megatron-LM's older spelling)")
    o.add_argument("--fp8-format", dest="parallel.fp8_format", choices=("hybrid", "e4m3"), default=None,
                   help=FP8_FORMAT_HELP)
    o.add_argument("--stack", dest="parallel.stack", default=None, metavar="NAME", help=STACK_HELP)
    g.add_argument("--gpus", "--num-gpus", dest="gpus", type=int, default=None,
                   help="total GPUs: checked against tp x pp x dp x cp, or used to derive dp when --dp is not given")


def add_cluster_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("cluster")
    g.add_argument("--cluster", default=None, help=f"preset name or TOML/JSON/YAML file (default {DEFAULT_CLUSTER})")
    g.add_argument("--gpus-per-node", dest="cluster.gpus_per_node", type=int, default=None, help="GPUs per node")


def add_routing_args(parser: argparse.ArgumentParser, *, iteration: bool = True, default: str | None = None) -> None:
    """MoE routing flags: --routing (a generator spec or a trace), --routing-seed, --routing-iteration (when
    ``iteration``) and Megatron's --moe-expert-capacity-factor (sets the model's capacity_factor)."""
    from commscope.moe.generators import FITTED, GENERATORS

    g = parser.add_argument_group("MoE routing")
    g.add_argument("--routing", default=default, metavar="SPEC",
                   help=f"expert routing: {', '.join(GENERATORS.values())}, {FITTED} (fitted to a recorded trace, for any "
                        "EP size), or a routing trace (.npz or a directory "
                        f"of routing-rank*.npz) (default {default or 'balanced, the classic assumption'})")
    g.add_argument("--routing-seed", type=int, default=0, help="seed of the synthetic routing (default 0)")
    if iteration:
        g.add_argument("--routing-iteration", type=int, default=0,
                       help="which training iteration of the routing sizes the EP all-to-alls (default 0)")
    g.add_argument("--moe-expert-capacity-factor", "--capacity-factor", dest="model.capacity_factor", type=float,
                   default=None, help="expert capacity factor: tokens beyond ceil(factor x T top_k / experts) per "
                                      "expert and source rank are dropped, not sent (default: no dropping)")


def _given(args: argparse.Namespace, prefix: str) -> dict[str, Any]:
    return {k.split(".", 1)[1]: v for k, v in vars(args).items() if k.startswith(prefix + ".") and v is not None}


def _replace(spec: Any, overrides: dict[str, Any]) -> Any:
    valid = {f.name for f in fields(spec)}
    unknown = set(overrides) - valid
    if unknown:
        raise ConfigError(min(unknown), overrides[min(unknown)], f"not a field of {type(spec).__name__}")
    return replace(spec, **overrides) if overrides else spec


def resolve_model(args: argparse.Namespace) -> ModelSpec:
    from commscope.spec.files import load_model

    model = load_model(args.model or DEFAULT_MODEL)
    given = _given(args, "model")
    if args.model:
        from commscope.spec.files import hf_config_notes

        for note in hf_config_notes(args.model, seq_len_given="seq_len" in given, dtype_given="dtype" in given,
                                    dtype=model.dtype):
            warn(args, note)
    given = follow_shape(model, given, lambda note: warn(args, note))
    return _replace(model, given)


#: Fields that change a model's architecture (its parameters or its layers' shapes), not only how it is run.
ARCHITECTURE_FIELDS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "num_query_groups", "head_dim",
                       "vocab_size", "num_experts", "top_k", "moe_layer_freq", "moe_ffn_hidden_size",
                       "num_shared_experts", "first_k_dense_layers", "gated_mlp")


def follow_shape(model: ModelSpec, given: dict[str, Any], note: Callable[[str], None]) -> dict[str, Any]:
    """Overrides of a preset ``model`` with the widths it derives following them, as Megatron derives them when they
    are not given: ``--hidden-size 12288`` on a preset whose ffn_hidden_size is 4 h gives 4 x 12288, not the preset's
    width; the same for head_dim = h / heads. A width the preset sets otherwise (a SwiGLU model's) is kept, with a
    ``note``. A changed architecture is named in the model's label, so that no report calls it the preset."""
    out = dict(given)
    if "hidden_size" in given and "ffn_hidden_size" not in given and model.ffn_hidden_size is not None:
        if model.ffn_hidden_size == 4 * model.hidden_size:
            out["ffn_hidden_size"] = None  # 4 h of the new width
        else:
            note(f"hidden_size {given['hidden_size']}: {model.name}'s ffn_hidden_size {model.ffn_hidden_size} is kept "
                 "(give --ffn-hidden-size to change it)")
    if ({"hidden_size", "num_heads"} & set(given)) and "head_dim" not in given and model.head_dim is not None:
        if model.head_dim == model.hidden_size // model.num_heads:
            out["head_dim"] = None  # h / heads of the new shape
        else:
            note(f"{model.name}'s head_dim {model.head_dim} is kept (give --head-dim to change it)")
    changed = [f"{k}={v}" for k, v in given.items() if k in ARCHITECTURE_FIELDS and v != getattr(model, k)]
    if changed and "name" not in given:
        out["name"] = f"{model.name} ({', '.join(changed)})"
    return out


def resolve_cluster(args: argparse.Namespace) -> ClusterSpec:
    from commscope.spec.files import load_cluster

    cluster = _replace(load_cluster(args.cluster or DEFAULT_CLUSTER), _given(args, "cluster"))
    if cluster.gpus_per_node > LARGEST_NVLINK_DOMAIN:
        warn(args, f"gpus_per_node={cluster.gpus_per_node}: more GPUs than any NVLink domain built "
                   f"({LARGEST_NVLINK_DOMAIN}, GB200 NVL72) share the intra-node bandwidth "
                   f"{cluster.intra_node.bandwidth_bytes_per_s / 1e9:g} GB/s in this estimate")
    return cluster


#: GPUs of the largest NVLink domain shipped (GB200 NVL72); a "node" larger than it is most likely a typo.
LARGEST_NVLINK_DOMAIN = 72


def resolve_parallel(args: argparse.Namespace, defaults: dict[str, Any] | None = None) -> ParallelSpec:
    """ParallelSpec from --parallel file and flags over ``defaults`` (DEFAULT_PARALLEL when None)."""
    values: dict[str, Any] = dict(DEFAULT_PARALLEL if defaults is None else defaults)
    file_values = parallel_file_values(args.parallel) if args.parallel else {}
    values.update(file_values)  # one set of defaults: a file sets what it names, as flags do
    given = _given(args, "parallel")
    values.update(given)
    gpus = getattr(args, "gpus", None)
    if gpus is not None:
        if gpus < 1:
            raise ConfigError("gpus", gpus, "must be a positive integer")
        for axis in ("tp", "pp", "cp", "dp"):  # before they divide --gpus: the bad size is named, not --gpus
            size = values.get(axis, 1)
            if not isinstance(size, int) or size < 1:
                raise ConfigError(axis, size, "must be a positive integer")
        per_replica = values.get("tp", 1) * values.get("pp", 1) * values.get("cp", 1)
        if "dp" not in given and "dp" not in file_values:
            if gpus % per_replica:
                raise ConfigError("gpus", gpus, f"must be a multiple of tp x pp x cp = {per_replica}")
            values["dp"] = gpus // per_replica
        world = per_replica * values.get("dp", 1)
        if world != gpus:
            raise ConfigError("gpus", gpus, f"does not match tp x pp x dp x cp = {values.get('tp', 1)} x {values.get('pp', 1)} x "
                              f"{values.get('dp', 1)} x {values.get('cp', 1)} = {world}")
    return ParallelSpec(**values)


def parallel_file_values(path: str) -> dict[str, Any]:
    """The ParallelSpec fields a ``--parallel`` file names (checked and converted), and only those: fields it
    leaves out keep the command's defaults, exactly as when the same values are given as flags."""
    from commscope.spec.files import parallel_fields

    values = parallel_fields(path)
    if not values:
        raise ConfigError("parallel", path, "is empty; give ParallelSpec fields, e.g. tp = 2 and pp = 4")
    return values


def resolve_job(args: argparse.Namespace) -> tuple[ModelSpec, ParallelSpec, ClusterSpec]:
    """Model, parallelism and cluster from flags, files and presets; raises ConfigError on bad input."""
    from commscope.pattern.workload.dense import check_job

    model = resolve_model(args)
    parallel = resolve_parallel(args)
    cluster = resolve_cluster(args)
    check_job(model, parallel)
    check_nodes(args, parallel.world_size, cluster)
    check_tp_nodes(args, parallel, cluster)
    return model, parallel, cluster


def v_label(v: int) -> str:
    """`` (v=2)`` after pp when the pipeline is interleaved (v chunks per stage), else nothing."""
    return f" (v={v})" if v > 1 else ""


#: Above this many GPUs a job is most likely a typo (:data:`commscope.commop.MAX_RANKS`).
MAX_PLAUSIBLE_GPUS = MAX_RANKS


def check_nodes(args: argparse.Namespace | None, world: int, cluster: ClusterSpec) -> None:
    """Warn, in one line, when ``world`` GPUs leave the last node partly empty (most often a mistyped
    --gpus-per-node): ranks fill nodes in order, so the last node holds fewer GPUs and its groups' traffic and
    link classes follow from that."""
    gpn = cluster.gpus_per_node
    if world > MAX_PLAUSIBLE_GPUS:
        warn(args, f"{world:,} GPUs: more than any cluster built or planned (the largest training clusters hold "
                   f"~10^5; commscope is tested to {MAX_PLAUSIBLE_GPUS:,}): check --gpus")
    if world > gpn and world % gpn:
        warn(args, f"{world} GPUs do not fill whole nodes of gpus_per_node={gpn}: the last of {-(-world // gpn)} nodes "
                   f"holds {world % gpn}; ranks are placed node by node (check --gpus-per-node)")


def check_tp_nodes(args: argparse.Namespace | None, parallel: ParallelSpec, cluster: ClusterSpec) -> None:
    """Warn, in one line, when tensor-parallel groups (consecutive ranks, the default order) straddle nodes: tp neither
    divides nor is a multiple of the GPUs per node, so some groups' all-reduces cross the inter-node links."""
    gpn, t = cluster.gpus_per_node, parallel.tp
    if t > 1 and parallel.order.startswith("tp") and gpn % t and t % gpn and parallel.world_size > gpn:
        warn(args, f"tp={t} does not divide gpus_per_node={gpn}: some tensor-parallel groups span two nodes and "
                   f"all-reduce over the inter-node links (the estimate times TP by the slowest group; Megatron jobs "
                   f"keep tp a divisor of the GPUs per node)")


def check_gpu_dtype(model: ModelSpec, cluster: ClusterSpec, args: argparse.Namespace | None = None) -> None:
    """Warn, in one line, when the model's dtype is one the cluster's GPU cannot compute in (bf16 on a V100:
    timed at the fp16 peak, as the presets of bf16 models on the default V100 cluster always were)."""
    from commscope.estimate.gpus import gpu_for_cluster

    try:
        gpu = gpu_for_cluster(cluster, getattr(args, "gpu", None))
    except ConfigError:  # a cluster of a GPU commscope has no model of: the estimate says how it copes
        return
    problem = gpu.dtype_problem(model.dtype)
    if problem is not None:
        warn(args, problem)


#: Below this fraction of peak no training run computes: published ones reach 0.3-0.6 (MFU), small models on few
#: GPUs rarely under 0.1. A --gpu-util under it is most likely a percentage written as a fraction of a fraction.
IMPLAUSIBLE_GPU_UTIL = 0.05


def check_gpu_util(args: argparse.Namespace) -> None:
    """Warn, in one line, about a --gpu-util no training run has (it is a fraction of peak: 0.45, not 45 or 0.0045)."""
    u = getattr(args, "gpu_util", None)
    if u is not None and 0 < u < IMPLAUSIBLE_GPU_UTIL:
        warn(args, f"gpu_util={u:g}: below {IMPLAUSIBLE_GPU_UTIL:g} of peak, under what any training run reaches "
                   "(0.3-0.6 is typical); it is a fraction of the peak FLOP/s (leave it out for the GPU's compute model)")


#: Fields only the GPU's compute model reads (the attention backend also sizes the memory).
_COMPUTE_MODEL_FLAGS = ("gradient_accumulation_fusion",)

#: ``--attention-backend`` and ``--fp8-format``, as the job's options and plan take them.
ATTENTION_BACKEND_METAVAR = "{auto,flash,fused,unfused,local}"
ATTENTION_BACKEND_HELP = "attention kernels: flash/fused/auto = one fused kernel (default), unfused/local = GEMMs + softmax"
FP8_FORMAT_HELP = "linear-layer GEMMs in FP8 (Transformer Engine): hybrid (E4M3 forward, E5M2 backward) or e4m3"
STACK_HELP = ("the software stack whose measured efficiency scales compute (megatron-core-2024, megatron-deepspeed; "
              "`commscope presets` lists them with their sources); default: none, the kernel-level model alone")

#: ``--[no-]gradient-accumulation-fusion``, as estimate, plan and validate take it.
GRADIENT_ACCUMULATION_FUSION_HELP = ("weight-gradient GEMMs add into the accumulated gradients (Megatron's default); "
                                     "--no-gradient-accumulation-fusion: a separate add per micro-batch (Megatron-LM "
                                     "before 2022, fp16 gradients in 2022, Megatron-DeepSpeed)")

#: Flags whose spelling is not the field's name (see :func:`spelled_flag`).
_SPELLINGS = {"attention": "--attention-backend", "position_embedding": "--position-embedding-type",
              "seq_len": "--seq-length", "distributed_optimizer": "--use-distributed-optimizer"}
_BOOL_SPELLINGS = {("tied_embeddings", False): "--untie-embeddings-and-output-weights", ("gated_mlp", True): "--swiglu"}


def spelled_flag(dest: str, value: Any) -> str:
    """The flag that sets the field ``dest`` to ``value``, as a user writes it: ``--no-gradient-accumulation-fusion``,
    ``--attention-backend unfused``, ``--inter-node-GBps 12.5``."""
    flag = _SPELLINGS.get(dest, "--" + dest.replace("_", "-"))
    if isinstance(value, bool):
        return _BOOL_SPELLINGS.get((dest, value), flag if value else f"--no-{flag[2:]}")
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def warn_compute_model_flags(args: argparse.Namespace, given: dict[str, Any], cluster: ClusterSpec, *,
                             method: str = "refined") -> None:
    """One warning line for each flag the user gave (``given``: dest -> value) that only the GPU's compute model
    reads, where FLOP / (u x peak) replaces that model: --gpu-util, the seed method, or a GPU commscope has no
    model of."""
    asked = [dest for dest in _COMPUTE_MODEL_FLAGS if dest in given]
    if not asked:
        return
    from commscope.estimate.iteration import compute_gpu

    if getattr(args, "gpu_util", None) is not None:
        replaced = "--gpu-util replaces the GPU's compute model by FLOP / (u x peak)"
    elif method == "seed":
        replaced = "the seed method times compute as FLOP / (u x peak)"
    elif compute_gpu(cluster, None, getattr(args, "gpu", None))[0] is None:
        replaced = f"commscope has no compute model of the cluster's GPU ({cluster.gpu}): compute is FLOP / (u x peak)"
    else:
        return
    for dest in asked:
        warn(args, f"{spelled_flag(dest, given[dest])} changes nothing here: {replaced}, which it does not enter")


def estimate_job(prediction, args: argparse.Namespace):
    """``estimate`` of a prediction with the command's --method, --gpu-util and --bandwidth (a measured table
    or fit; ops it lacks fall back to the cluster preset's alpha-beta model, with a note)."""
    from commscope.estimate.bandwidth import AlphaBeta
    from commscope.estimate.iteration import estimate
    check_gpu_dtype(prediction.model, prediction.cluster, args)
    check_gpu_util(args)
    parallel = prediction.parallel
    if "overlap_p2p_comm" in _given(args, "parallel") and parallel.virtual_pipeline_size == 1:
        flag = "--overlap-p2p-communication" if parallel.overlap_p2p_comm else "--no-overlap-p2p-communication"
        warn(args, f"{flag} changes nothing here: Megatron overlaps pipeline sends/receives with compute only in the "
                   f"interleaved schedule (--virtual-pipeline-size > 1; it is {parallel.virtual_pipeline_size})")
    warn_compute_model_flags(args, _given(args, "parallel"), prediction.cluster, method=args.method)
    bw = None
    if args.bandwidth is not None:
        from commscope.io.bandwidth_file import read_bandwidth

        bw = read_bandwidth(args.bandwidth, fallback=AlphaBeta(prediction.cluster), warn=lambda m: warn(args, m))
    return estimate(prediction, method=args.method, gpu_util=args.gpu_util, bandwidth=bw, gpu=getattr(args, "gpu", None))


#: The job description a recorded run keeps beside its logs (``commscope workload ... --record DIR`` writes the
#: first two; ``commscope record --model/--tp/...`` writes them when told): flag name -> file name.
JOB_FILES: dict[str, str] = {"model": "model.toml", "parallel": "parallel.toml", "cluster": "cluster.toml"}


def job_from_logdir(args: argparse.Namespace, logdir: Any, kinds: tuple[str, ...] = ("model", "parallel", "cluster")) -> list[str]:
    """Point ``--model``/``--parallel``/``--cluster`` at the job description saved beside the logs in ``logdir``,
    each only where the flag is not given (so flags still override it, and single fields on top of it);
    returns the files used."""
    from pathlib import Path

    folder = Path(logdir)
    used = []
    for kind in kinds:
        path = folder / JOB_FILES[kind]
        if getattr(args, kind, None) is None and folder.is_dir() and path.is_file():
            setattr(args, kind, str(path))
            used.append(str(path))
    return used


def write_job(logdir: Any, model: ModelSpec | None, parallel: ParallelSpec | None) -> None:
    """The job next to its logs (:data:`JOB_FILES`), so that `commscope compare logdir` finds it."""
    from pathlib import Path

    from commscope.io.atomic import write_text
    from commscope.spec.files import dumps_toml, model_to_mapping, parallel_to_mapping

    folder = Path(logdir)
    folder.mkdir(parents=True, exist_ok=True)
    if model is not None:
        write_text(folder / JOB_FILES["model"], dumps_toml(model_to_mapping(model)))
    if parallel is not None:
        write_text(folder / JOB_FILES["parallel"], dumps_toml(parallel_to_mapping(parallel)))
