"""``commscope workload gpt``: train the reference GPT with PyTorch's own parallelism, record it, compare."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from commscope.cli.common import add_cluster_args, add_model_args, add_parallel_args, out_path, write_job

#: Parallelism a workload runs when no flag says otherwise: 2 ranks of DDP, 2 sequences per micro-batch.
WORKLOAD_PARALLEL = {"tp": 1, "pp": 1, "dp": 2, "micro_batch_size": 2}


#: What --help says of the parallelism defaults of a workload (resolve_workload_job applies them).
_GPT_HELP_DEFAULTS = {"tp": "1", "pp": "1", "dp": "2", "micro_batch_size": "2",
                      "global_batch_size": "micro-batch size x dp x --micro-batches", "framework": "torch-ddp"}
_MOE_HELP_DEFAULTS = {"tp": "1", "pp": "1", "ep": "4", "dp": "ep", "micro_batch_size": "2",
                      "global_batch_size": "micro-batch size x dp x --micro-batches", "framework": "megatron"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("workload", help="run a reference training with PyTorch's parallelism (and record it)",
                       description="Real training of commscope's reference models on forked ranks (gloo on CPU, NCCL "
                                   "on GPUs) with PyTorch's own DDP/FSDP2, DTensor tensor/sequence parallelism and "
                                   "torch.distributed.pipelining. With --record, every communication op is logged and "
                                   "compared with commscope's prediction for the same job.")
    kinds = p.add_subparsers(dest="workload", metavar="MODEL")
    g = kinds.add_parser("gpt", help="the reference GPT (preset ref-gpt)",
                         description="Train the reference GPT (preset ref-gpt unless --model says otherwise) on "
                                     "tp x pp x dp forked ranks. --framework torch-ddp (default) or torch-fsdp2 picks "
                                     "the data-parallel wrapper; TP is DTensor (with --sequence-parallel: SP), PP is "
                                     "torch.distributed.pipelining (--schedule 1f1b or gpipe).")
    add_model_args(g, "ref-gpt")
    add_parallel_args(g, _GPT_HELP_DEFAULTS)
    add_cluster_args(g)
    _add_run_args(g)
    g.set_defaults(func=run_gpt)
    e = kinds.add_parser("moe", help="the reference MoE (preset ref-moe) with expert parallelism",
                         description="Train the reference MoE (preset ref-moe unless --model says otherwise) on dp "
                                     "forked ranks with --ep-way expert parallelism (Megatron's layout: ep divides dp; "
                                     "dp/ep expert-data-parallel replicas): per MoE layer and micro-batch an all-gather "
                                     "of token counts and all_to_all_single dispatch/combine with uneven splits. "
                                     "Each rank's routing is recorded; with --record, every step is compared with the "
                                     "prediction for that step's recorded routing.")
    add_model_args(e, "ref-moe")
    add_parallel_args(e, _MOE_HELP_DEFAULTS)
    add_cluster_args(e)
    _add_run_args(e)
    e.add_argument("--record-routing", type=out_path, default=None,
                   help="write the routing (routing-rank#####.npz per EP rank) here (default: RECORD/routing "
                        "when --record is given)")
    t = e.add_argument_group("training data and router (Megatron's flags)")
    t.add_argument("--data", default="random", metavar="{random,text,text:PATH}",
                   help="random tokens (default), text: the Python standard library's own sources tokenised byte by "
                        "byte, text:PATH: your text file or directory")
    t.add_argument("--moe-aux-loss-coeff", dest="aux_loss_coeff", type=float, default=0.0,
                   help="Switch/GShard load-balancing loss coefficient (default 0: none; Megatron uses e.g. 1e-2)")
    t.add_argument("--moe-z-loss-coeff", dest="z_loss_coeff", type=float, default=0.0,
                   help="router z-loss coefficient (default 0: none; ST-MoE uses 1e-3)")
    t.add_argument("--moe-expert-capacity-factor", "--capacity-factor", dest="model.capacity_factor", type=float,
                   default=None, help="each expert takes at most ceil(factor x T top_k / experts) of a rank's "
                                      "assignments, the most probable; the rest are dropped, not sent (default: none)")
    t.add_argument("--lr", type=float, default=None, help="Adam's learning rate (default 2e-3)")
    e.set_defaults(func=run_moe_cmd)
    p.set_defaults(func=lambda args: _missing_kind(p))


def _add_run_args(p: argparse.ArgumentParser) -> None:
    r = p.add_argument_group("run")
    r.add_argument("--steps", type=int, default=2, help="measured training steps (default 2)")
    r.add_argument("--warmup", type=int, default=1,
                   help="iterations before the measured steps; their ops are reported as setup (default 1)")
    r.add_argument("--micro-batches", type=int, default=None,
                   help="micro-batches per step (default 2 x pp); sets --global-batch-size when that is not given")
    r.add_argument("--record", type=out_path, default=None, help="write rank#####.jsonl logs here and compare them")
    r.add_argument("--force", action="store_true",
                   help="replace a recording of an earlier run in --record (default: refuse, naming its files)")
    r.add_argument("--seed", type=int, default=0, help="seed for weights and data (default 0)")
    r.add_argument("--backend", default=None, choices=("gloo", "nccl"),
                   help="torch.distributed backend (default: nccl when enough GPUs, else gloo)")
    r.add_argument("--oversubscribe", action="store_true",
                   help="start the ranks even beyond 4 per core (default: refuse more)")
    r.add_argument("--timeout", type=float, default=600.0, help="wall-clock limit for the whole run in seconds")
    r.add_argument("--json", action="store_true", help="print the result (and comparison) as JSON")


def _missing_kind(parser: argparse.ArgumentParser) -> int:
    parser.error("give the model to train: gpt or moe")


def resolve_workload_job(args: argparse.Namespace, *, moe: bool = False):
    """Model, parallelism and cluster of a workload run: ref-gpt with torch-ddp on 2 ranks (ref-moe with ep 4
    on 4 ranks) and small batches by default."""
    from commscope.cli.common import _given, parallel_file_values, resolve_cluster, resolve_model, resolve_parallel
    from commscope.errors import ConfigError
    from commscope.trainings.gpt import REFERENCE_MODEL
    from commscope.trainings.moe import REFERENCE_MOE

    args.model = args.model or (REFERENCE_MOE if moe else REFERENCE_MODEL)
    model = resolve_model(args)
    # a --parallel file's fields count as given, exactly like flags: one set of defaults for the same job
    given = {**(parallel_file_values(args.parallel) if args.parallel else {}), **_given(args, "parallel")}
    if moe:
        ep = given.get("ep", 4)
        defaults = dict(WORKLOAD_PARALLEL, framework="megatron", ep=ep, dp=max(ep, given.get("dp", ep)))
        dp = given.get("dp", defaults["dp"])
        if dp % ep:
            raise ConfigError("ep", ep, f"must divide dp={dp} (Megatron's layout: the {dp} data-parallel ranks hold "
                                        f"dp/ep replicas of each expert); for {ep * dp} ranks with {ep}-way expert "
                                        f"parallelism give --ep {ep} --dp {ep * dp}")
    else:
        defaults = dict(WORKLOAD_PARALLEL, framework="torch-ddp")
    if args.micro_batches is not None:
        if args.micro_batches < 1:
            raise ConfigError("micro-batches", args.micro_batches, "must be >= 1")
        if "global_batch_size" in given:
            raise ConfigError("micro-batches", args.micro_batches, "give either --micro-batches or --global-batch-size")
    if "global_batch_size" not in given:
        mbs = given.get("micro_batch_size", defaults["micro_batch_size"])
        micro_batches = args.micro_batches or 2 * given.get("pp", defaults.get("pp", 1))
        defaults["global_batch_size"] = mbs * given.get("dp", defaults["dp"]) * micro_batches
    parallel = resolve_parallel(args, defaults)
    return model, parallel, resolve_cluster(args)


def _refuse_unrunnable(model, parallel, args: argparse.Namespace, outputs: list[tuple[str, Path | None]]) -> str:
    """Refuse, before anything starts, a model too large to train here, more ranks than the machine runs, a
    backend this torch lacks, or an output directory (field, path) that cannot be made; returns the backend to run.
    (Whether another run writes the output, or an earlier one's files are there, :func:`_claim_outputs` says.)"""
    from commscope.cli.common import check_out_dir
    from commscope.errors import ConfigError
    from commscope.measure.launch import check_backend, check_nproc
    from commscope.trainings.gpt import MAX_PARAMS

    if model.num_parameters() > MAX_PARAMS:
        raise ConfigError("model", model.name, f"has {model.num_parameters():,} parameters; a reference run trains it "
                                               f"for real on this machine, so it must stay under {MAX_PARAMS:,}")
    check_nproc(parallel.world_size, oversubscribe=args.oversubscribe, field="world size (tp x pp x dp x cp)")
    backend = args.backend or _default_backend(parallel.world_size)
    check_backend(backend, parallel.world_size)
    for field, path in outputs:
        check_out_dir(path, field)
    return str(backend)


def _say_world(args: argparse.Namespace, parallel) -> None:
    """Say on stderr how many ranks the run starts when a size that sets it was not given (``workload gpt --tp 2
    --pp 2`` took dp 2 by default and started 8 ranks without a word)."""
    from commscope.cli.common import _given, parallel_file_values

    given = {**(parallel_file_values(args.parallel) if args.parallel else {}), **_given(args, "parallel")}
    sizes = [(axis, getattr(parallel, axis)) for axis in ("tp", "pp", "dp", "cp") if getattr(parallel, axis) > 1]
    chosen = [f"{axis} {getattr(parallel, axis)}" for axis in ("tp", "pp", "dp", "cp", "ep")
              if axis not in given and getattr(parallel, axis) > 1]
    if chosen:
        product = " x ".join(f"{axis} {size}" for axis, size in sizes) or "1"
        flags = ", ".join(f"--{c.split()[0]}" for c in chosen)
        print(f"commscope workload: starting {parallel.world_size} ranks ({product}; {', '.join(chosen)} by default: "
              f"{flags} to choose)", file=sys.stderr)


def _claim_outputs(args: argparse.Namespace, stack, outputs: list[tuple[str, Path | None, tuple[str, ...]]]) -> None:
    """Claim each output folder (field, path, the names of its files) for this run, into the ExitStack ``stack``,
    before any rank starts: another run writing one is refused, and so is an earlier recording there unless --force
    (then it is removed first: the ranks' logs are written file by file, never beside an earlier run's)."""
    from commscope.cli.outputs import claim_dir

    for field, path, patterns in outputs:
        if path is not None:
            stack.enter_context(claim_dir(args, path, patterns, field=field, what="a recording"))


def run_gpt(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from commscope.measure.capture.recorder import RECORDING_FILES
    from commscope.trainings.gpt import RunConfig, check_config

    model, parallel, cluster = resolve_workload_job(args)
    cfg = RunConfig(model=model, parallel=parallel, steps=args.steps, warmup=args.warmup, seed=args.seed,
                    record=None if args.record is None else str(args.record))
    check_config(cfg)
    backend = _refuse_unrunnable(model, parallel, args, [("record", args.record)])
    with ExitStack() as stack:
        _claim_outputs(args, stack, [("record", args.record, RECORDING_FILES)])
        _say_world(args, parallel)  # once nothing refuses the run: the line before its ranks start
        return _run_gpt(args, cfg, model, parallel, cluster, backend)


def _run_gpt(args: argparse.Namespace, cfg, model, parallel, cluster, backend: str) -> int:
    from commscope.cli.terminal import Progress
    from commscope.trainings.gpt import run

    if args.record is not None:  # the job beside its logs from the start: a crashed run is still described
        write_job(args.record, model, parallel)
    with Progress("training", quiet=args.json) as progress:
        results = run(cfg, timeout_s=args.timeout, backend=backend, progress=progress, oversubscribe=args.oversubscribe)
    _refuse_incomplete(results)
    comparison = None
    if args.record is not None:
        comparison = _record_and_compare(args.record, model, parallel, cluster)
    out = _summary(results, model, parallel, backend)
    if args.json:
        json.dump({**out, "comparison": comparison}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{model.name} on {parallel.world_size} ranks ({backend}): tp {parallel.tp} pp {parallel.pp} dp {parallel.dp}"
          f"{' SP' if parallel.sequence_parallel and parallel.tp > 1 else ''}, {parallel.framework}, "
          f"{parallel.num_micro_batches} micro-batches of {parallel.micro_batch_size}, {args.steps} step(s)")
    print(f"loss per step: {', '.join(f'{x:.4f}' for x in out['loss'])}")
    print(f"step time: median {out['step_s_median'] * 1e3:.1f} ms (slowest rank per step)")
    if comparison is not None:
        _print_comparison(args.record, comparison)
    return 0


def _refuse_incomplete(results: list[dict]) -> None:
    """One line for a recording the ranks could not finish writing (a full disk): nothing is compared with it."""
    stopped = [r["log_stopped"] for r in results if r.get("log_stopped")]
    if stopped:
        from commscope.errors import ConfigError

        raise ConfigError("record", stopped[0].rsplit(": ", 1)[-1], f"the recording stopped: {stopped[0].rsplit(': ', 1)[0]}"
                          f" ({len(stopped)} of {len(results)} rank logs are incomplete; the training ran on, "
                          "nothing was compared)")


def _default_backend(world: int) -> str:
    try:
        import torch
    except ImportError:
        return "gloo"
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"


def _summary(results: list[dict], model, parallel, backend: str) -> dict:
    import statistics

    last_stage = [r for r in results if r["stage"] == parallel.pp - 1]
    steps = len(results[0]["step_s"])
    # mean over the data-parallel replicas of the last stage (TP ranks hold the same loss)
    loss = [statistics.fmean(r["losses"][i] for r in last_stage) for i in range(steps)]
    slowest = [max(r["step_s"][i] for r in results) for i in range(steps)]
    return {"model": model.name, "world_size": parallel.world_size, "backend": backend, "framework": parallel.framework,
            "loss": loss, "step_s": slowest, "step_s_median": statistics.median(slowest),
            "ops_recorded": [r["ops"] for r in results]}


def _record_and_compare(logdir: Path, model, parallel, cluster) -> dict:
    from commscope.api import predict
    from commscope.measure.capture.analysis import compare, read_run

    return compare(predict(model, parallel, cluster), read_run(logdir))


def _print_comparison(logdir: Path, result: dict) -> None:
    from commscope.cli.compare_cmd import print_comparison

    if not result["by_op"] and not result["setup"]:  # a world of one: its log holds its header and step lines
        print(f"\nrecorded in {logdir}/: no communication, as predicted (one rank talks to no one)")
        return
    print(f"\nrecorded in {logdir}/: measured vs predicted per step ({result['num_steps']} step(s); "
          f"setup includes the {'warm-up iteration' if result['steps'] else 'whole run'})")
    print_comparison(result)
    print(f"repeat with: commscope compare {logdir} (the job is saved beside the logs)")


def run_moe_cmd(args: argparse.Namespace) -> int:
    from contextlib import ExitStack

    from commscope.measure.capture.recorder import RECORDING_FILES
    from commscope.trainings.moe import MoeRunConfig, check_moe_config

    model, parallel, _cluster = resolve_workload_job(args, moe=True)
    routing_dir = args.record_routing or (args.record / "routing" if args.record is not None else None)
    cfg = MoeRunConfig(model=model, parallel=parallel, steps=args.steps, warmup=args.warmup, seed=args.seed,
                       record=None if args.record is None else str(args.record),
                       record_routing=None if routing_dir is None else str(routing_dir), data=args.data,
                       aux_loss_coeff=args.aux_loss_coeff, z_loss_coeff=args.z_loss_coeff,
                       **({} if args.lr is None else {"lr": args.lr}))
    check_moe_config(cfg)
    backend = _refuse_unrunnable(model, parallel, args, [("record", args.record), ("record-routing", routing_dir)])
    with ExitStack() as stack:
        outputs: list[tuple[str, Path | None, tuple[str, ...]]] = [("record", args.record, RECORDING_FILES)]
        if args.record_routing is not None:  # else inside --record, claimed with it
            outputs.append(("record-routing", routing_dir, ("routing-rank*.npz", "group*/routing-rank*.npz")))
        _claim_outputs(args, stack, outputs)
        _say_world(args, parallel)
        return _run_moe(args, cfg, model, parallel, backend, routing_dir)


def _run_moe(args: argparse.Namespace, cfg, model, parallel, backend: str, routing_dir: Path | None) -> int:
    from commscope.cli.terminal import Progress
    from commscope.trainings.moe import compare_run, load_group_traces, run_moe

    if args.record is not None:  # the job beside its logs from the start: a crashed run is still described
        write_job(args.record, model, parallel)
    t0 = time.perf_counter()
    with Progress("training", quiet=args.json) as progress:
        results = run_moe(cfg, timeout_s=args.timeout, backend=backend, progress=progress,
                          oversubscribe=args.oversubscribe)
    _refuse_incomplete(results)
    wall_s = time.perf_counter() - t0
    out = {**_summary([dict(r, stage=0) for r in results], model, parallel, backend), "routing_dir": str(routing_dir),
           "data": args.data, "aux_loss_coeff": args.aux_loss_coeff, "z_loss_coeff": args.z_loss_coeff,
           "capacity_factor": model.capacity_factor, "wall_s": wall_s,
           "router_aux_loss": [statistics.fmean(r["aux_losses"][i] for r in results)
                               for i in range(len(results[0]["aux_losses"]))]}
    comparison = metrics = None
    if routing_dir is not None:
        from commscope.moe.metrics import routing_metrics

        metrics = [routing_metrics(t, capacity_factor=model.capacity_factor).summary()
                   for t in load_group_traces(routing_dir, parallel)]
    if args.record is not None:
        assert routing_dir is not None  # set from args.record above
        comparison = compare_run(model, parallel, args.record, routing_dir)
    if args.json:
        json.dump({**out, "routing_metrics": metrics, "comparison": comparison}, sys.stdout, indent=2,
                  default=lambda value: value.item())  # numpy scalars: an int stays an int (float() wrote 4.0)
        sys.stdout.write("\n")
        return 0
    print(f"{model.name} on {parallel.world_size} ranks ({backend}): ep {parallel.ep} x expert-dp "
          f"{parallel.dp // parallel.ep}, {model.num_experts} experts top-{model.top_k}, "
          f"{parallel.num_micro_batches} micro-batches of {parallel.micro_batch_size}, {args.steps} step(s), "
          f"data {args.data}, aux loss {args.aux_loss_coeff:g}"
          + (f", z-loss {args.z_loss_coeff:g}" if args.z_loss_coeff else "")
          + (f", capacity factor {model.capacity_factor:g}" if model.capacity_factor is not None else ""))
    print(f"loss per step: {loss_curve(out['loss'])}")
    if args.aux_loss_coeff or args.z_loss_coeff:
        print(f"router loss (aux + z) per step: {loss_curve(out['router_aux_loss'])}")
    print(f"step time: median {out['step_s_median'] * 1e3:.1f} ms (slowest rank per step); {wall_s:.1f} s in all")
    if metrics:
        m0 = metrics[0]
        print(f"routing (EP group 0, {m0['iterations']} steps): expert entropy {m0['expert_entropy_first']:.3f} -> "
              f"{m0['expert_entropy_last']:.3f}, written to {routing_dir}/ (analyse: commscope moe analyze "
              f"{routing_dir}{'/group000' if len(metrics) > 1 else ''} --out moe/)")
    if comparison is not None and not comparison["by_op"] and not comparison["setup"]:  # a world of one
        print(f"\nrecorded in {args.record}/: no communication, as predicted (one rank talks to no one)")
    elif comparison is not None:
        print(f"\nrecorded in {args.record}/: measured vs predicted, each step with its own recorded routing, "
              f"summed over {comparison['num_steps']} step(s)")
        from commscope.cli.compare_cmd import print_comparison

        print_comparison(comparison)
    return 0


def loss_curve(values: list[float], points: int = 11) -> str:
    """``step: loss`` at up to ``points`` evenly spread steps (every step when there are few)."""
    if len(values) <= points:
        return ", ".join(f"{x:.4f}" for x in values)
    picks = sorted({round(i * (len(values) - 1) / (points - 1)) for i in range(points)})
    return ", ".join(f"{i}: {values[i]:.4f}" for i in picks)

