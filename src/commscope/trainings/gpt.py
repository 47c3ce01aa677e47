"""Reference training: a small GPT trained with PyTorch's own parallelism (CPU/gloo here, NCCL on GPUs).

The model follows a :class:`~commscope.spec.model.ModelSpec` (LLaMA-style blocks: no biases, RMSNorm or
LayerNorm without bias, RoPE or no position embedding, plain or gated MLP, untied output layer) so that
commscope's prediction for the same spec and framework can be checked against what PyTorch really sends:

- data parallelism: ``torch-ddp`` wraps each stage in DistributedDataParallel, ``torch-fsdp2`` applies
  ``fully_shard`` to every block and to the stage (FSDP2);
- tensor parallelism: DTensor ``parallelize_module`` with torchtitan's plan (column-parallel q/k/v and up
  projections behind one PrepareModuleInput per attention/MLP, row-parallel output projections,
  row-parallel embedding, column-parallel output layer with replicated logits), with and without
  sequence parallelism;
- pipeline parallelism: ``torch.distributed.pipelining`` (GPipe or 1F1B) over stages cut as
  :func:`commscope.pattern.workload.stages.stage_layers` cuts them.

The device mesh is (pp, dp, tp), tp fastest: Megatron's default rank order, so a recorded log is
attributed to axes by the same :class:`~commscope.pattern.layout.Layout` the prediction uses.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from commscope.errors import check
from commscope.spec.model import ModelSpec
from commscope.spec.parallel import ParallelSpec

#: Data-parallel implementations the reference workload runs (and the prediction models, by the same name).
FRAMEWORKS = ("torch-ddp", "torch-fsdp2")


#: Largest model `commscope workload` trains (every rank holds a real copy of its stage on this machine).
MAX_PARAMS = 200_000_000

#: The model preset the reference workload trains by default (presets/models/ref-gpt.toml).
REFERENCE_MODEL = "ref-gpt"


def preset_model(name: str, **overrides: Any) -> ModelSpec:
    """Model preset ``name`` with fields replaced by ``overrides``."""
    from dataclasses import replace

    from commscope.spec.files import load_model

    return replace(load_model(name), **overrides)


def reference_model(**overrides: Any) -> ModelSpec:
    """The built-in small GPT (preset ``ref-gpt``: 4 layers, hidden 64, 4 heads, vocab 512, sequence 32, fp32)."""
    return preset_model(REFERENCE_MODEL, **overrides)


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One reference training run."""

    model: ModelSpec
    parallel: ParallelSpec
    steps: int = 2
    warmup: int = 1
    """Iterations run before the measured steps; their ops count as setup (PyTorch pipelining's one-time stage
    vote, DDP's bucket rebuild)."""
    record: str | None = None
    """Directory for rank#####.jsonl logs; None: do not record."""
    seed: int = 0
    lr: float = 0.01


def check_config(cfg: RunConfig) -> None:
    """Refuse what the reference workload cannot run, naming the field."""
    from commscope.pattern.workload.dense import check_job
    from commscope.pattern.workload.pytorch import check_torch_job

    check(cfg.parallel.framework in FRAMEWORKS, "framework", cfg.parallel.framework,
          f"valid for a PyTorch reference run: {', '.join(FRAMEWORKS)}")
    check(cfg.steps >= 1, "steps", cfg.steps, "must be >= 1")
    check(cfg.warmup >= 0, "warmup", cfg.warmup, "must be >= 0")
    check(cfg.model.dtype in ("fp32", "bf16", "fp16"), "model.dtype", cfg.model.dtype, "valid: fp32, bf16, fp16")
    check_job(cfg.model, cfg.parallel)
    check_torch_job(cfg.model, cfg.parallel)


# --------------------------------------------------------------------------------------------- the model

def _build_modules():
    """Module classes, defined on first use so that importing this file does not import torch."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self, m: ModelSpec, tp: int, dtype) -> None:
            super().__init__()
            h, hd = m.hidden_size, m.head_size
            self.heads, self.kv_heads, self.head_dim, self.tp = m.num_heads, m.kv_heads, hd, tp
            self.wq = nn.Linear(h, m.num_heads * hd, bias=False, dtype=dtype)
            self.wk = nn.Linear(h, m.kv_heads * hd, bias=False, dtype=dtype)
            self.wv = nn.Linear(h, m.kv_heads * hd, bias=False, dtype=dtype)
            self.wo = nn.Linear(m.num_heads * hd, h, bias=False, dtype=dtype)
            self.rope = m.position_embedding == "rope"

        def forward(self, x, freqs):
            b, s = x.shape[0], x.shape[1]
            q = self.wq(x).view(b, s, -1, self.head_dim)
            k = self.wk(x).view(b, s, -1, self.head_dim)
            v = self.wv(x).view(b, s, -1, self.head_dim)
            if self.rope:
                q, k = _rope(q, freqs), _rope(k, freqs)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if k.shape[1] != q.shape[1]:
                rep = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    class MLP(nn.Module):
        def __init__(self, m: ModelSpec, dtype) -> None:
            super().__init__()
            self.gated = m.gated_mlp
            self.w1 = nn.Linear(m.hidden_size, m.ffn, bias=False, dtype=dtype)
            if self.gated:
                self.w3 = nn.Linear(m.hidden_size, m.ffn, bias=False, dtype=dtype)
            self.w2 = nn.Linear(m.ffn, m.hidden_size, bias=False, dtype=dtype)

        def forward(self, x):
            up = F.silu(self.w1(x)) * self.w3(x) if self.gated else F.gelu(self.w1(x))
            return self.w2(up)

    def norm(m: ModelSpec, dtype):
        if m.normalization == "rmsnorm":
            return nn.RMSNorm(m.hidden_size, dtype=dtype)
        return nn.LayerNorm(m.hidden_size, bias=False, dtype=dtype)

    class Block(nn.Module):
        def __init__(self, m: ModelSpec, tp: int, dtype, feed_forward=None) -> None:
            super().__init__()
            self.attention_norm = norm(m, dtype)
            self.attention = Attention(m, tp, dtype)
            self.ffn_norm = norm(m, dtype)
            self.feed_forward = MLP(m, dtype) if feed_forward is None else feed_forward

        def forward(self, x, freqs):
            x = x + self.attention(self.attention_norm(x), freqs)
            return x + self.feed_forward(self.ffn_norm(x))

    class GPT(nn.Module):
        """The layers ``layer_ids`` of the model; the embedding on the first stage, norm and output on the last."""

        def __init__(self, m: ModelSpec, *, layer_ids, first: bool, last: bool, tp: int, make_ffn=None) -> None:
            super().__init__()
            dtype = torch_dtype(m.dtype)
            vocab = m.padded_vocab_size(tp)
            self.tok_embeddings = nn.Embedding(vocab, m.hidden_size, dtype=dtype) if first else None
            # string keys keep checkpoint names stable however the layers are cut into stages;
            # make_ffn(layer) may supply a layer's feed-forward module (an MoE layer), None keeps the MLP
            self.layers = nn.ModuleDict({str(i): Block(m, tp, dtype, make_ffn(i) if make_ffn else None)
                                         for i in layer_ids})
            self.norm = norm(m, dtype) if last else None
            self.output = nn.Linear(m.hidden_size, vocab, bias=False, dtype=dtype) if last else None
            # a plain attribute, not a buffer: DDP would broadcast buffers before every forward
            self.freqs = _rope_freqs(m.head_size, m.seq_len)

        def forward(self, x):
            if self.tok_embeddings is not None:
                x = self.tok_embeddings(x)
            for block in self.layers.values():
                x = block(x, self.freqs.to(x.device))
            if self.output is not None:
                x = self.output(self.norm(x))
            # a view as a stage's output loses FSDP2's pre-backward hook under in-place use: hand out a tensor
            return x.clone() if x._base is not None else x

    def _rope_freqs(dim: int, seq: int):
        inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
        return torch.polar(torch.ones_like(angles), angles)

    def _rope(x, freqs):
        # x: (b, s, heads, hd); sequence parallelism never reaches here sharded: attention sees the full sequence
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        out = torch.view_as_real(xc * freqs[: x.shape[1]].view(1, x.shape[1], 1, -1)).flatten(3)
        return out.type_as(x)

    return SimpleNamespace(GPT=GPT, MLP=MLP)


_MODULES = None


def modules() -> SimpleNamespace:
    """The torch module classes (``GPT``, ``MLP``), built on first use."""
    global _MODULES
    if _MODULES is None:
        _MODULES = _build_modules()
    return _MODULES


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def build_stage_model(m: ModelSpec, p: ParallelSpec, stage: int):
    """The torch module of pipeline ``stage`` (all layers when pp = 1), not yet parallelised."""
    if p.pp == 1:
        layer_ids = range(m.num_layers)
    else:
        from commscope.pattern.workload.stages import stage_layers

        layer_ids = stage_layers(m, p, stage)[0]
    return modules().GPT(m, layer_ids=layer_ids, first=(stage == 0), last=(stage == p.pp - 1), tp=p.tp)


def apply_tensor_parallel(model, tp_mesh, *, sequence_parallel: bool) -> None:
    """torchtitan's plan: DTensor column/row parallel linears, optional sequence parallelism."""
    try:
        from torch.distributed.tensor import Replicate, Shard
    except ImportError:  # torch < 2.5: DTensor's placements before they were public
        from torch.distributed._tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    seq = Shard(1) if sequence_parallel else Replicate()
    top: dict[str, Any] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.output is not None:
        if sequence_parallel:
            top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        plan: dict[str, Any] = {
            "attention": PrepareModuleInput(input_layouts=(seq, None), desired_input_layouts=(Replicate(), None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=seq),
            "feed_forward": PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=seq),
        }
        if block.feed_forward.gated:
            plan["feed_forward.w3"] = ColwiseParallel()
        if sequence_parallel:
            plan["attention_norm"] = SequenceParallel()
            plan["ffn_norm"] = SequenceParallel()
        parallelize_module(block, tp_mesh, plan)


# --------------------------------------------------------------------------------------------- one rank

def rank_setup(rank: int, cfg: RunConfig, backend: str):
    """(log or None, device) of one rank: its recording sink, and ``cuda:rank`` when the real backend is NCCL
    (the launcher only pins a device when it starts NCCL itself, not the recording backend that wraps it)."""
    import torch

    log = None
    if cfg.record is not None:
        from commscope.measure.capture import pg as cpg
        from commscope.measure.capture.recorder import RankLog

        log = RankLog(Path(cfg.record), rank=rank, say_stop=False)  # the launcher says it, once for all ranks
        cpg.set_sink(log)
    if backend != "nccl":
        return log, torch.device("cpu")
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return log, device


def launch(fn, cfg: RunConfig, *, timeout_s: float, backend: str,
           progress: Callable[[int, int], None] | None = None, oversubscribe: bool = False) -> list[dict]:
    """Run ``fn(rank, world, cfg, backend, progress)`` on the job's ranks, forked; through the recording backend that
    wraps ``backend`` when ``cfg.record`` is set. Rank 0 reports ``progress(iterations done, iterations)``. When a
    rank fails, the recording gets a marker naming it (:func:`commscope.measure.capture.recorder.write_failure`) before
    LaunchError goes on."""
    from commscope.measure.launch import LaunchError, check_backend, check_nproc, spawn

    check_nproc(cfg.parallel.world_size, oversubscribe=oversubscribe, field="world size (tp x pp x dp x cp)")
    check_backend(backend, cfg.parallel.world_size)

    env, launch_backend = {}, backend
    if cfg.record is not None:
        from commscope.measure.capture import pg as cpg

        cpg.register()
        env[cpg.INNER_BACKEND_ENV] = backend
        launch_backend = cpg.BACKEND_NAME
        Path(cfg.record).mkdir(parents=True, exist_ok=True)
    try:
        return spawn(fn, cfg.parallel.world_size, args=(cfg, backend, progress), backend=launch_backend, env=env,
                     timeout_s=timeout_s, oversubscribe=oversubscribe)
    except LaunchError as exc:
        if cfg.record is not None:
            from commscope.measure.capture.recorder import write_failure

            write_failure(Path(cfg.record), exc, world_size=cfg.parallel.world_size)
        raise


def train_rank(rank: int, world: int, cfg: RunConfig, backend: str = "gloo",
               progress: Callable[[int, int], None] | None = None) -> dict:
    """Body of one rank (forked by :func:`commscope.measure.launch.spawn`): build, parallelise, train ``cfg.steps`` steps."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    m, p = cfg.model, cfg.parallel
    log, device = rank_setup(rank, cfg, backend)
    mesh = init_device_mesh(device.type, (p.pp, p.dp, p.tp), mesh_dim_names=("pp", "dp", "tp"))
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp"].get_local_rank()
    torch.manual_seed(cfg.seed + pp_rank)  # same weights on every tp and dp rank of a stage before sharding
    model = build_stage_model(m, p, pp_rank).to(device)
    if p.tp > 1:
        apply_tensor_parallel(model, mesh["tp"], sequence_parallel=p.sequence_parallel)
    if cfg.parallel.framework == "torch-fsdp2":
        try:
            from torch.distributed.fsdp import fully_shard
        except ImportError:  # torch < 2.6: FSDP2 before it was public
            from torch.distributed._composable.fsdp import fully_shard

        for block in model.layers.values():
            fully_shard(block, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    elif p.dp > 1:
        if p.tp > 1:
            # PyTorch's 2-D DDP + TP recipe: DDP sees the local shards, DTensor wraps them again in forward
            from torch.distributed.tensor.parallel.ddp import _pre_dp_module_transform

            _pre_dp_module_transform(model)
        model = torch.nn.parallel.DistributedDataParallel(model, process_group=mesh["dp"].get_group(),
                                                          bucket_cap_mb=_bucket_cap_mb(m, p))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    mb, mbs = p.micro_batch_size, p.num_micro_batches
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + dp_rank)
    vocab = m.vocab_size

    def loss_fn(logits, target):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())

    schedule = None
    if p.pp > 1:
        from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

        # example shapes let the stage skip its runtime shape inference (send_object_list of metadata)
        first, last = pp_rank == 0, pp_rank == p.pp - 1
        act = (mb, m.seq_len // p.tp if p.sequence_parallel else m.seq_len, m.hidden_size)
        dtype = next(model.parameters()).dtype
        x_in = torch.empty(mb, m.seq_len, dtype=torch.long, device="meta") if first else \
            torch.empty(*act, dtype=dtype, device="meta")
        x_out = torch.empty(mb, m.seq_len, m.padded_vocab_size(p.tp), dtype=dtype, device="meta") if last else \
            torch.empty(*act, dtype=dtype, device="meta")
        stage = pipeline_stage(model, pp_rank, p.pp, device, input_args=x_in, output_args=x_out,
                               input_grads=None if first else x_in, output_grads=None if last else x_out,
                               group=mesh["pp"].get_group())
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[p.schedule]
        schedule = cls(stage, n_microbatches=mbs, loss_fn=loss_fn)
    losses, times = [], []
    for it in range(cfg.warmup + cfg.steps):
        step = it - cfg.warmup
        tokens = torch.randint(0, vocab, (mb * mbs, m.seq_len + 1), generator=gen).to(device)
        inputs, target = tokens[:, :-1], tokens[:, 1:]
        if log is not None:
            log.step = step if step >= 0 else None
        t0 = time.perf_counter()
        opt.zero_grad()
        if schedule is not None:
            step_losses: list = []
            if pp_rank == 0:
                schedule.step(inputs)
            elif pp_rank == p.pp - 1:
                schedule.step(target=target, losses=step_losses)
            else:
                schedule.step()
            loss = torch.stack(step_losses).mean().item() if step_losses else math.nan
        else:
            loss = 0.0
            for i in range(mbs):
                sl = slice(i * mb, (i + 1) * mb)
                last = i == mbs - 1
                _set_sync(model, cfg.parallel.framework, last)
                out = model(inputs[sl])
                micro_loss = loss_fn(out, target[sl]) / mbs
                micro_loss.backward()
                loss += micro_loss.item()
        opt.step()
        if log is not None and step >= 0:
            log.end_step()  # the step line: its interval on this rank, for exposed communication and step time
        if step >= 0:
            times.append(time.perf_counter() - t0)
            losses.append(loss)
        if progress is not None and rank == 0:
            progress(it + 1, cfg.warmup + cfg.steps)
        if it == 0 and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            # DDP rebuilds its buckets in gradient-ready order once, at the next forward, broadcasting the new
            # bucket layout from rank 0: do it now, outside any step, so that it counts as setup
            if log is not None:
                log.step = None
            model.reducer._rebuild_buckets()
    if log is not None:
        log.close()
    return {"rank": rank, "stage": pp_rank, "losses": losses, "step_s": times,
            "ops": None if log is None else log.num_records, "log_stopped": None if log is None else log.stopped}


def pipeline_stage(model, stage_index: int, num_stages: int, device, *, input_args, output_args, input_grads, output_grads,
                   group, stage_class=None):
    """``torch.distributed.pipelining.PipelineStage`` as the installed torch takes it (``stage_class``: that class,
    or one of the same signature). The example gradients (``input_grads``, ``output_grads``: the shapes of what the
    stage receives from and sends to its neighbours backward) are arguments of torch 2.12 and later; torch 2.4-2.11
    have neither (a ``PipelineStage(..., input_grads=...)`` there was a TypeError on every rank of every ``pp > 1``
    run) and take the gradients' shapes from the activations', which these are. Whatever the signature names is
    passed, nothing it does not."""
    import inspect

    if stage_class is None:
        from torch.distributed.pipelining import PipelineStage as stage_class
    kwargs = {"input_args": input_args, "output_args": output_args, "input_grads": input_grads,
              "output_grads": output_grads, "group": group}
    accepted = inspect.signature(stage_class).parameters
    return stage_class(model, stage_index, num_stages, device, **{k: v for k, v in kwargs.items() if k in accepted})


def _bucket_cap_mb(m: ModelSpec, p: ParallelSpec) -> float | None:
    """DDP's bucket_cap_mb from ParallelSpec.grad_bucket_size (elements); None keeps DDP's defaults."""
    return None if p.grad_bucket_size is None else p.grad_bucket_size * m.dtype_bytes / 2**20


def _set_sync(model, framework: str, sync: bool) -> None:
    """Gradient synchronisation only on the last micro-batch (DDP no_sync, FSDP2 requires_gradient_sync)."""
    if framework == "torch-fsdp2":
        model.set_requires_gradient_sync(sync)
    elif hasattr(model, "require_backward_grad_sync"):
        model.require_backward_grad_sync = sync


# --------------------------------------------------------------------------------------------- launch

def run(cfg: RunConfig, *, timeout_s: float = 300.0, backend: str = "gloo",
        progress: Callable[[int, int], None] | None = None, oversubscribe: bool = False) -> list[dict]:
    """Run the reference training on ``world`` forked ranks; returns each rank's result dict (``progress``: see
    :func:`launch`)."""
    check_config(cfg)
    return launch(train_rank, cfg, timeout_s=timeout_s, backend=backend, progress=progress, oversubscribe=oversubscribe)
