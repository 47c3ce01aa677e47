"""Reference MoE training: the reference GPT with routed-expert layers, expert parallelism on real ranks.

Every MoE layer routes each token to its top-k experts by a softmax router trained the way MoE models are
[megatron-core]: the Switch/GShard load-balancing loss [switch-2021] [gshard-2020]

    L_aux = coeff x E / (k T^2) x sum_x (sum_t p_t,x) x n_x      (= coeff when routing is balanced)

over the T tokens of the rank's micro-batch (p the router's softmax over all E experts, n_x the assignments
expert x got before dropping; Megatron-core's ``switch_load_balancing_loss_func``, ``--moe-aux-loss-coeff``),
and optionally the router z-loss ``coeff_z x mean_t logsumexp(logits_t)^2`` [st-moe-2022] (``--moe-z-loss-coeff``).
With a capacity factor (``--moe-expert-capacity-factor``) each expert takes at most
``ceil(factor x T k / E)`` of the rank's assignments, the most probable ones (Megatron-core's ``probs`` drop
policy); dropped assignments are not sent and add nothing to the token's output (the residual carries it).
Experts are placed in contiguous blocks over the EP group; each layer and micro-batch

1. all-gathers the per-expert token counts it will send over the EP group (int64, like Megatron-core's
   dispatcher),
2. dispatches the kept token copies with ``all_to_all_single`` and uneven splits, runs its local experts,
3. combines the outputs with the reverse ``all_to_all_single``; autograd runs both again backward.

The recorded routing is the counts after top-k and before dropping (the trace's contract); the prediction
applies the same capacity, so the recorded all-to-all sizes and the predicted ones agree to the byte.
The data is random tokens or real text (:mod:`commscope.trainings.data`); the optimizer is Adam.

After the micro-batches, dense gradients are all-reduced over the data-parallel group in one bucket and
expert gradients over the expert-data-parallel group (Megatron's DP without bucketing), so that the
prediction for ``framework = megatron`` with the recorded routing trace describes the run op for op.
Each rank writes its own routing (``routing-rank#####.npz``, see :mod:`commscope.moe.trace`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from commscope.errors import check
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec
from commscope.trainings.gpt import RunConfig, launch, preset_model, rank_setup

REFERENCE_MOE = "ref-moe"


def reference_moe_model(**overrides: Any) -> ModelSpec:
    """The built-in small MoE (preset ``ref-moe``: 2 layers, 8 experts, top-2, hidden 64, fp32)."""
    return preset_model(REFERENCE_MOE, **overrides)


@dataclass(frozen=True, kw_only=True)
class MoeRunConfig(RunConfig):
    """One reference MoE run: a :class:`RunConfig` that also writes each rank's routing."""

    warmup: int = 0
    lr: float = 2e-3
    """Adam's learning rate."""
    record_routing: str | None = None
    """Directory for routing-rank#####.npz (group###/ per EP group when there are several); None: not written."""
    data: str = "random"
    """Training data: ``random``, ``text`` or ``text:PATH`` (:func:`commscope.trainings.data.parse_data`)."""
    aux_loss_coeff: float = 0.0
    """Load-balancing loss coefficient (Megatron's ``--moe-aux-loss-coeff``; 0: none, routing may collapse)."""
    z_loss_coeff: float = 0.0
    """Router z-loss coefficient (Megatron's ``--moe-z-loss-coeff``; 0: none)."""


def check_moe_config(cfg: MoeRunConfig) -> None:
    """Refuse what the reference MoE workload cannot run, naming the field."""
    m, p = cfg.model, cfg.parallel
    check(m.is_moe, "model", m.name, "is dense; `commscope workload moe` needs num_experts > 0")
    check(cfg.steps >= 1, "steps", cfg.steps, "must be >= 1")
    check(cfg.warmup >= 0, "warmup", cfg.warmup, "must be >= 0")
    check(p.framework == "megatron", "framework", p.framework,
          "the MoE workload communicates like Megatron (framework megatron)")
    for name in ("tp", "pp", "cp"):
        check(getattr(p, name) == 1, name, getattr(p, name), "the MoE workload runs expert and data parallelism only (1)")
    check(p.zero_stage == 0 and not p.distributed_optimizer, "zero_stage", p.zero_stage, "the MoE workload uses 0")
    check(p.recompute == "none", "recompute", p.recompute, "the MoE workload does not recompute (none)")
    check(p.grad_bucket_size is None, "grad_bucket_size", p.grad_bucket_size, "one bucket (unset)")
    check(m.num_experts % p.ep == 0, "ep", p.ep, f"must divide num_experts={m.num_experts}")
    # (fp32 Adam: a rate beyond fp32's range overflows in the first step, on every rank; beyond 10 no run learns)
    check(math.isfinite(cfg.lr) and 0 < cfg.lr <= 10, "lr", cfg.lr, "must be a number > 0 and <= 10 (default 2e-3)")
    for name in ("aux_loss_coeff", "z_loss_coeff"):
        value = getattr(cfg, name)
        check(math.isfinite(value) and value >= 0, name, value, "must be a finite number >= 0")
    from commscope.trainings.data import check_data, parse_data

    check_data(parse_data(cfg.data), vocab_size=m.vocab_size, seq_len=m.seq_len)
    check(m.num_shared_experts == 0, "model.num_shared_experts", m.num_shared_experts, "not in the reference MoE (0)")
    from commscope.pattern.workload.pytorch import check_torch_job

    # the same block structure as the reference GPT (no biases, untied, rope/none)
    check_torch_job(replace(m, num_experts=0, capacity_factor=None), replace(p, ep=1))


def _build_moe_layer():
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor

    def all_to_all_single(inp, output_split_sizes, input_split_sizes, group):
        """Differentiable all-to-all with uneven splits (its backward is the reverse all-to-all)."""
        return wait_tensor(all_to_all_single_autograd(inp, output_split_sizes, input_split_sizes, group))

    from commscope.trainings.gpt import torch_dtype

    class Expert(nn.Module):
        def __init__(self, h: int, f: int, gated: bool, dtype) -> None:
            super().__init__()
            self.gated = gated
            self.w1 = nn.Linear(h, f, bias=False, dtype=dtype)
            if gated:
                self.w3 = nn.Linear(h, f, bias=False, dtype=dtype)
            self.w2 = nn.Linear(f, h, bias=False, dtype=dtype)

        def forward(self, x):
            return self.w2(F.silu(self.w1(x)) * self.w3(x) if self.gated else F.gelu(self.w1(x)))

    class MoELayer(nn.Module):
        """Top-k routing over ``num_experts``; this rank holds experts [ep_rank E/ep, (ep_rank + 1) E/ep)."""

        def __init__(self, m: ModelSpec, layer: int, *, ep: int, ep_rank: int, group, seed: int, log,
                     aux_loss_coeff: float, z_loss_coeff: float) -> None:
            super().__init__()
            dtype = torch_dtype(m.dtype)
            self.layer, self.ep, self.ep_rank, self.group, self.log = layer, ep, ep_rank, group, log
            self.E, self.k, self.local = m.num_experts, m.top_k, m.num_experts // ep
            self.capacity_factor = m.capacity_factor
            self.aux_loss_coeff, self.z_loss_coeff = aux_loss_coeff, z_loss_coeff
            self.aux_loss = None  # the router losses of the last forward (a scalar tensor), for the training loop
            self.router = nn.Linear(m.hidden_size, m.num_experts, bias=False, dtype=dtype)
            experts = []
            for e in range(ep_rank * self.local, (ep_rank + 1) * self.local):
                # the same expert has the same weights on every expert-data-parallel replica
                with torch.random.fork_rng():
                    torch.manual_seed(seed * 100_003 + layer * 1_009 + e)
                    experts.append(Expert(m.hidden_size, m.moe_ffn, m.gated_mlp, dtype))
            self.experts = nn.ModuleList(experts)

        def route(self, tokens):
            """(assignments kept, grouped by expert; kept counts per expert; top-k weights (T, k)); logs the
            counts before dropping and sets ``aux_loss``."""
            logits = self.router(tokens).float()  # (T, E)
            probs = torch.softmax(logits, dim=-1)
            weights, idx = probs.topk(self.k, dim=-1)  # (T, k)
            flat = idx.reshape(-1)  # (T k,) assignments, token-major
            counts = torch.bincount(flat, minlength=self.E)
            self.log(self.layer, counts)
            num_tokens = tokens.shape[0]
            aux = logits.new_zeros(())
            if self.aux_loss_coeff:
                # Megatron-core switch_load_balancing_loss_func: coeff E / (k T^2) sum_x (sum_t p_tx) n_x
                aux = aux + (probs.sum(dim=0) * counts.to(probs.dtype)).sum() * (
                    self.E * self.aux_loss_coeff / (self.k * num_tokens * num_tokens))
            if self.z_loss_coeff:
                aux = aux + torch.logsumexp(logits, dim=-1).square().mean() * self.z_loss_coeff
            self.aux_loss = aux
            if self.capacity_factor is None:
                return torch.argsort(flat, stable=True), counts, weights
            # each expert keeps its ceil(factor T k / E) most probable assignments (commscope.moe.routing)
            capacity = math.ceil(num_tokens * self.k / self.E * self.capacity_factor)
            by_prob = torch.argsort(-weights.detach().reshape(-1), stable=True)
            grouped = by_prob[torch.argsort(flat[by_prob], stable=True)]  # by expert, most probable first
            starts = torch.cumsum(counts, 0) - counts
            position = torch.arange(flat.numel(), device=flat.device) - starts[flat[grouped]]
            return grouped[position < capacity], counts.clamp(max=capacity), weights

        def forward(self, x):
            shape = x.shape
            tokens = x.reshape(-1, shape[-1])
            order, counts, weights = self.route(tokens)
            every = torch.empty(self.ep * self.E, dtype=torch.int64, device=x.device)
            # an EP group of one moves nothing: Megatron-core's collectives hand a group of one its input back
            # (tensor_parallel.mappings: `if world_size == 1: return input_`), and the prediction has no op there
            if self.ep > 1:
                dist.all_gather_single(every, counts, group=self.group)
            else:
                every.copy_(counts)
            every = every.view(self.ep, self.ep, self.local)  # [source rank, destination rank, local expert]
            send = counts.view(self.ep, self.local).sum(dim=1).tolist()
            mine = every[:, self.ep_rank, :]  # [source rank, my expert]: tokens I receive
            recv = mine.sum(dim=1).tolist()
            received = tokens[order // self.k]
            if self.ep > 1:
                received = all_to_all_single(received, recv, send, self.group)
            # received rows are ordered by source rank, then expert: run each local expert on its rows
            chunks = list(received.split(mine.reshape(-1).tolist()))
            outs = [None] * len(chunks)
            for e, expert in enumerate(self.experts):
                rows = [chunks[s * self.local + e] for s in range(self.ep)]
                y = expert(torch.cat(rows)) if sum(r.shape[0] for r in rows) else rows[0][:0]
                for s, part in enumerate(y.split([r.shape[0] for r in rows])):
                    outs[s * self.local + e] = part
            back = torch.cat(outs)
            if self.ep > 1:
                back = all_to_all_single(back, send, recv, self.group)
            # dropped assignments stay zero: the token keeps only its residual for that expert
            combined = back.new_zeros(tokens.shape[0] * self.k, shape[-1]).index_copy(0, order, back)
            out = (combined.view(-1, self.k, shape[-1]) * weights.unsqueeze(-1).to(back.dtype)).sum(dim=1)
            return out.view(shape)

    return MoELayer


def train_moe_rank(rank: int, world: int, cfg: MoeRunConfig, backend: str = "gloo",
                   progress: Callable[[int, int], None] | None = None) -> dict:
    """One rank of the reference MoE training (forked by :func:`commscope.measure.launch.spawn`)."""
    import torch
    import torch.distributed as dist

    from commscope.pattern.layout import Layout
    from commscope.trainings.gpt import modules

    m, p = cfg.model, cfg.parallel
    log, device = rank_setup(rank, cfg, backend)
    layout = Layout(p)
    groups: dict[str, Any] = {}
    for kind in ("ep", "expert-dp"):  # every rank creates every group, in the same order
        for index, row in enumerate(layout.groups(kind)):
            g = dist.new_group([int(r) for r in row])
            if rank in row:
                groups[kind] = (g, [int(r) for r in row])
                groups[f"{kind}_index"] = index
    ep_group, ep_ranks = groups["ep"]
    ep_rank = ep_ranks.index(rank)
    moe_layers = [i for i in range(m.num_layers) if m.is_moe_layer(i)]
    mbs, mb = p.num_micro_batches, p.micro_batch_size
    total_iters = cfg.warmup + cfg.steps
    routing = np.zeros((cfg.steps, mbs, len(moe_layers), m.num_experts), dtype=np.int64)
    state = {"it": -1, "mb": 0}

    def log_counts(layer: int, counts) -> None:
        step = state["it"] - cfg.warmup
        if step >= 0:
            routing[step, state["mb"], moe_layers.index(layer)] = counts.cpu().numpy()

    MoELayer = _build_moe_layer()
    torch.manual_seed(cfg.seed)  # dense weights equal on every rank
    moe_modules = []

    def make_ffn(i: int):
        if not m.is_moe_layer(i):
            return None
        moe_modules.append(MoELayer(m, i, ep=p.ep, ep_rank=ep_rank, group=ep_group, seed=cfg.seed, log=log_counts,
                                    aux_loss_coeff=cfg.aux_loss_coeff, z_loss_coeff=cfg.z_loss_coeff))
        return moe_modules[-1]

    model = modules().GPT(m, layer_ids=range(m.num_layers), first=True, last=True, tp=1, make_ffn=make_ffn).to(device)
    expert_params = [q for name, q in model.named_parameters() if ".experts." in name]
    ids = {id(q) for q in expert_params}
    dense_params = [q for q in model.parameters() if id(q) not in ids]
    edp_group, edp_ranks = groups["expert-dp"]
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    from commscope.trainings.data import check_data, parse_data, sample_windows

    corpus = check_data(parse_data(cfg.data), vocab_size=m.vocab_size, seq_len=m.seq_len)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    rng = np.random.default_rng([cfg.seed, rank])  # this rank's stream of text windows
    losses, aux_losses, times = [], [], []
    for it in range(total_iters):
        state["it"] = it
        step = it - cfg.warmup
        if log is not None:
            log.step = step if step >= 0 else None
        if corpus is None:
            tokens = torch.randint(0, m.vocab_size, (mb * mbs, m.seq_len + 1), generator=gen).to(device)
        else:
            tokens = torch.from_numpy(sample_windows(corpus, rng, mb * mbs, m.seq_len + 1)).to(device)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_sum = aux_sum = 0.0
        for i in range(mbs):
            state["mb"] = i
            x, y = tokens[i * mb:(i + 1) * mb, :-1], tokens[i * mb:(i + 1) * mb, 1:]
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1).float(), y.flatten()) / mbs
            aux = sum((layer.aux_loss for layer in moe_modules), loss.new_zeros(())) / mbs
            (loss + aux).backward()
            loss_sum += loss.item()
            aux_sum += float(aux.item())
        # Megatron's data parallelism without bucketing: one all-reduce of the dense gradients over dp,
        # one of the expert gradients over expert-dp
        if world > 1:
            _all_reduce_grads(dense_params, None, world)
        if len(edp_ranks) > 1:
            _all_reduce_grads(expert_params, edp_group, len(edp_ranks))
        opt.step()
        if step >= 0:
            times.append(time.perf_counter() - t0)
            losses.append(loss_sum)
            aux_losses.append(aux_sum)
        if progress is not None and rank == 0:
            progress(it + 1, total_iters)
    if log is not None:
        log.close()
    if cfg.record_routing is not None:
        from commscope.moe.trace import write_rank_trace

        # one trace per EP group: a directory of its EP ranks' routing (in group<g>/ when there are several)
        out = Path(cfg.record_routing)
        if len(edp_ranks) > 1:
            out = out / f"group{groups['ep_index']:03d}"
        write_rank_trace(out, ep_rank, routing, top_k=m.top_k, num_experts=m.num_experts,
                         layer_ids=tuple(moe_layers), ep=p.ep, tokens_per_rank=mb * m.seq_len)
    return {"rank": rank, "ep_rank": ep_rank, "losses": losses, "aux_losses": aux_losses, "step_s": times,
            "routing": routing,
            "ops": None if log is None else log.num_records, "log_stopped": None if log is None else log.stopped}


def _all_reduce_grads(params, group, size: int) -> None:
    import torch
    import torch.distributed as dist

    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat /= size
    for q, part in zip(params, flat.split([g.numel() for g in grads])):
        q.grad = part.view_as(q)


def run_moe(cfg: MoeRunConfig, *, timeout_s: float = 300.0, backend: str = "gloo",
            progress: Callable[[int, int], None] | None = None, oversubscribe: bool = False) -> list[dict]:
    """Run the reference MoE training on ``dp`` forked ranks; returns each rank's result dict."""
    check_moe_config(cfg)
    return launch(train_moe_rank, cfg, timeout_s=timeout_s, backend=backend, progress=progress,
                  oversubscribe=oversubscribe)


def load_group_traces(routing_dir: str | Path, parallel: ParallelSpec) -> list:
    """The routing trace of every EP group a run wrote (``group###/`` subdirectories when several)."""
    from commscope.moe.trace import load_trace

    routing_dir = Path(routing_dir)
    from commscope.pattern.layout import Layout

    groups = len(Layout(parallel).groups("ep"))
    if groups == 1:
        return [load_trace(routing_dir)]
    return [load_trace(routing_dir / f"group{g:03d}") for g in range(groups)]


def predicted_step(model: ModelSpec, parallel: ParallelSpec, traces: list, step: int):
    """The predicted workload of training step ``step``: dense ops, and each EP group's all-to-alls sized by
    that group's own recorded routing."""
    from commscope.pattern.workload.dense import build_workload

    base = build_workload(model, parallel, routing=traces[0], routing_iteration=step)
    if len(traces) == 1:
        return base
    opsets = [s for s in base.opsets if s.axis != "ep"]
    for g, trace in enumerate(traces):
        wl = build_workload(model, parallel, routing=trace, routing_iteration=step)
        for s in wl.opsets:
            if s.axis != "ep":
                continue
            own = replace(s, groups=s.groups[g:g + 1])
            if s.splits is not None and s.splits.ndim == 3:
                own = replace(own, splits=s.splits[g:g + 1])
            opsets.append(own)
    return replace(base, opsets=tuple(opsets))


def compare_run(model: ModelSpec, parallel: ParallelSpec, logdir: str | Path, routing_dir: str | Path) -> dict:
    """Recorded vs predicted, step by step (each step's all-to-alls follow that step's routing); rows summed
    over the steps, ``max_rel_error`` the largest over steps."""
    from types import SimpleNamespace

    from commscope.measure.capture.analysis import compare, op_step, read_run

    run = read_run(logdir)
    traces = load_group_traces(routing_dir, parallel)
    steps = sorted({s for ops in run.ops_by_rank.values() for s in (op_step(o) for o in ops) if s is not None})
    total: dict[tuple[str, str], dict] = {}
    worst, setup, per_step = 0.0, [], []
    for k in steps:
        sub = replace(run, ops_by_rank={r: [o for o in ops if op_step(o) in (k, None)]
                                        for r, ops in run.ops_by_rank.items()})
        result = compare(SimpleNamespace(workload=predicted_step(model, parallel, traces, k)), sub)
        worst = max(worst, result["max_rel_error"])
        setup = result["setup"]
        per_step.append({"step": k, "max_rel_error": result["max_rel_error"]})
        for r in result["by_op"]:
            row = total.setdefault((r["axis"], r["op"]), {"axis": r["axis"], "op": r["op"], "predicted_count": 0,
                                                          "measured_count": 0, "predicted_bytes": 0,
                                                          "measured_bytes": 0, "diff_bytes": 0})
            for key in ("predicted_count", "measured_count", "predicted_bytes", "measured_bytes", "diff_bytes"):
                row[key] += r[key]
    return {"steps": steps, "num_steps": len(steps), "by_op": [total[k] for k in sorted(total)], "setup": setup,
            "per_step": per_step, "max_rel_error": worst, "totals_over_steps": True}
