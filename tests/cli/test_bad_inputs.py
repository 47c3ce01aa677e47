"""Every mistake a user can make at the command line: exit status 2 and one line on stderr that names the field or
path, never a traceback, a usage dump, a fork bomb or a silent result.

``BAD_INPUTS`` is the table: a command line (``{tmp}`` is a folder of fixtures written below) and a fragment the
one line must contain. Each runs in-process through :func:`commscope.cli.main.main`: none of them may fork a
rank, so the table costs about a second. ``count_by_command()`` gives the count per command for reports.
"""

from __future__ import annotations

import importlib.util

import json
import shlex
from collections import Counter
from pathlib import Path

import pytest

from commscope.cli.main import main

# (command line, fragment of the one error line)
BAD_INPUTS: list[tuple[str, str]] = [
    # --- argparse: one line with a pointer to --help, never a usage dump
    ("--bogus", "unrecognized arguments: --bogus (see `commscope --help`)"),
    ("nosuchcommand", "invalid choice: 'nosuchcommand'"),
    ("", "give a command"),
    ("traffic --tp abc", "invalid int value: 'abc': expected a whole number, e.g. 8 (see `commscope traffic --help`)"),
    ("estimate --gpu-util half", "invalid float value: 'half': expected a number"),
    ("traffic --pipeline-layers 1,2,x", "expected comma-separated integers"),
    ("traffic --attention-backend magic", "expected one of auto, flash"),
    ("traffic --fp8-format e5m2", "invalid choice: 'e5m2'"),
    ("estimate --method nope", "(see `commscope estimate --help`)"),
    ("plan", "required: --gpus"),
    ("workload moe --moe-expert-capacity-factor inf", "capacity_factor=inf: must be a finite number > 0"),
    ("workload moe --lr 1e300", "lr=1e+300: must be a number > 0 and <= 10"),  # once: 4 ranks, then an overflow
    ("workload", "give the model to train: gpt or moe"),
    ("workload bert", "invalid choice: 'bert'"),
    ("workload gpt --backend mpi", "invalid choice: 'mpi'"),
    ("record -- true", "required: --out"),
    ("moe", "required: ACTION"),
    ("moe generate", "invalid choice: 'generate'"),
    # --- job description: values Megatron would refuse
    ("traffic --tp 0", "tp=0"),
    ("traffic --tp -2", "tp=-2"),
    ("traffic --dp 0", "dp=0"),
    ("traffic --cp 3", "cp=3: must divide seq_length"),
    ("traffic --global-batch-size 7", "global_batch_size=7"),
    ("traffic --micro-batch-size 0", "micro_batch_size=0"),
    ("traffic --gpus 7", "gpus=7"),
    ("traffic --gpus 0", "gpus=0"),
    ("estimate --tp 0 --gpus 8", "tp=0: must be a positive integer"),  # once a ZeroDivisionError traceback
    ("traffic --pp 0 --gpus 8", "pp=0: must be a positive integer"),
    ("traffic --cp 0 --gpus 8", "cp=0: must be a positive integer"),
    ("traffic --tp 8 --pp 1 --dp 0 --gpus 8", "dp=0: must be a positive integer"),  # not gpus=8
    ("plan --gpus 8 --global-batch-size 0", "global_batch_size=0"),  # once silently 512
    ("plan --gpus 8 --refine 0", "refine=0: must be >= 1"),
    # once 165 s of silence: refused before any work (issue 36)
    ("plan --gpus 8388608 --global-batch-size 67108864", "gpus=8388608: more GPUs than any cluster built or planned"),
    ("plan --gpus 8 --micro-batch-sizes 1,x", "expected comma-separated integers, e.g. 1,2,4; got '1,x'"),
    ("traffic --out /proc/nope/run", "out='/proc/nope/run': cannot create it in /proc"),
    ("traffic --out /proc", "out='/proc': cannot write into it"),  # root may write there, says access(); it may not
    ("report --out /proc/x.html", "out='/proc/x.html': cannot write into /proc"),  # once the bare OS error, no field
    ("report --out {tmp}/r.html --png /proc/x", "png='/proc/x': cannot create it in /proc"),  # once after r.html
    ("plan --gpus 8 --refine -1", "refine=-1: must be >= 1"),
    ("traffic --dtype fp7", "dtype='fp7'"),
    ("traffic --grad-reduce-dtype int8", "grad_reduce_dtype='int8': valid: fp32, bf16"),  # once: DP bytes quartered
    ("traffic --capacity-factor 1", "capacity_factor=1.0: applies to MoE models only"),  # once: silently ignored
    ("traffic --out ''", "argument --out: expected a path, got an empty string"),  # once: the current folder
    ("report --out '' --no-predicted --moe x", "argument --out: expected a path, got an empty string"),
    # --- sizes no model has (once: an OverflowError traceback, 4.4 million TiB computed, or memory exhausted)
    ("traffic --hidden-size 960000000 --num-attention-heads 24", "hidden_size=960000000: is beyond any real model"),
    ("estimate --seq-length 10000000000", "seq_len=10000000000: is beyond any real model: at most 134,217,728"),
    ("traffic --num-layers 100000000", "num_layers=100000000: is beyond any real model: at most 10,000"),
    ("traffic --seq-length 134217728 --micro-batch-size 4", "activations are 2.2 TiB per GPU: beyond any GPU"),
    ("traffic --hidden-size 1048576 --num-attention-heads 16 --num-layers 10000", "1.32e+17 parameters: beyond any real"),
    ("report --measured {tmp}/run --out {tmp}/r.html", "holds the logs of 1 ranks, but the job to compare them with has 32"),
    ("estimate --dtype int8", "dtype='int8': valid training dtypes: bf16, fp16"),  # once: a peak-FLOP/s error later
    ("traffic --recompute sometimes", "recompute='sometimes'"),
    ("traffic --schedule zigzag", "schedule='zigzag'"),
    ("traffic --order tp-dp", "order='tp-dp'"),
    ("traffic --seq-length 0", "seq_len=0"),
    ("traffic --zero-stage 5", "zero_stage=5"),
    ("traffic --ep 2", "ep=2: needs an MoE model"),
    ("traffic --framework jax", "framework='jax'"),
    ("traffic --routing nosuch", "routing='nosuch'"),
    ("traffic --model nosuchmodel", "model='nosuchmodel'"),
    ("traffic --cluster nosuch", "cluster='nosuch'"),
    # --- files given as inputs
    ("traffic --model {tmp}/dir", "is a directory without a config.json"),
    ("traffic --model {tmp}/file.txt", "unknown file type '.txt'"),
    ("traffic --parallel {tmp}/nope.toml", "no such file"),
    ("traffic --parallel {tmp}/dir", "is a directory"),
    ("traffic --parallel {tmp}/empty.toml", "is empty"),
    ("traffic --parallel {tmp}/meta-only.toml", "is empty"),
    ("traffic --parallel {tmp}/badtype.toml", "tp='two'"),
    ("traffic --parallel {tmp}/unknown.toml", "tq=2: unknown key"),
    ("estimate --bandwidth {tmp}/nope.log", "no such file"),
    ("estimate --bandwidth {tmp}/dir", "bandwidth='{tmp}/dir': is a directory"),
    ("estimate --bandwidth {tmp}/file.txt", "no nccl-tests data rows"),
    ("fit {tmp}/nope.json", "no such file"),
    ("fit {tmp}/dir", "input='{tmp}/dir': is a directory"),
    ("fit {tmp}/file.txt", "no nccl-tests data rows"),
    ("fit {tmp}/bench.json --tolerance 0", "tolerance=0.0"),
    ("fit {tmp}/bench.json --max-pieces 0", "max_pieces=0"),
    ("fit {tmp}/bench.json --group-size 1", "group_size=1"),
    # nccl-tests -r -1: every size once per root; one root per fitted curve or table (once root 0's rows, silently)
    ("fit {tmp}/bcast-all-roots.txt", ("input='bcast-all-roots.txt': times broadcast over 4 ranks from 4 roots "
                                       "(0, 1, 2, 3), as nccl-tests -r -1 does; one fitted curve holds one of each: pick "
                                       "with --root 0 (or another of those)")),
    ("fit {tmp}/bcast-all-roots.txt --root 4", ("root=4: bcast-all-roots.txt has no rows of that root; its rows are 0, "
                                                "1, 2, 3")),
    ("fit {tmp}/bcast-all-roots.txt --root -1", "root=-1: bcast-all-roots.txt has no rows of that root"),
    ("fit {tmp}/bcast-all-roots.txt --root all", "invalid int value: 'all'"),
    ("fit {tmp}/bench.json --root 0", "root=0: bench.json names no root of its rows; leave --root out"),
    ("estimate --bandwidth {tmp}/bcast-all-roots.txt", ("bandwidth='bcast-all-roots.txt': times broadcast over 4 ranks "
                                                        "from 4 roots (0, 1, 2, 3) (nccl-tests -r -1), which one table "
                                                        "cannot hold apart; fit one: commscope fit bcast-all-roots.txt "
                                                        "--root 0 --out model.toml")),
    ("summarize {tmp}/nope", "logdir='{tmp}/nope'"),
    ("summarize {tmp}/file.txt", "logdir='{tmp}/file.txt'"),
    ("summarize {tmp}/dir", "no rank*.jsonl logs"),
    ("compare {tmp}/dir", "no rank*.jsonl logs"),
    ("validate {tmp}/nope.csv", "no such file"),
    ("moe analyze {tmp}/nope", "routing trace='{tmp}/nope'"),
    ("shapes --gpu nosuch", "gpu='nosuch'"),
    ("shapes --refine 0", "refine=0: must be >= 1"),  # once '0 estimated ... no nearby shape is faster'
    ("shapes --sweep hidden=3008,3072 --png /proc/x.png", "png='/proc/x.png': cannot write into /proc"),
    ("shapes --sweep layers=1,2 --sweep heads=16,32", "sweep='heads=16,32': one --sweep per run"),
    # --- output paths: files in the way, missing or unwritable places, a full disk
    ("traffic --out {tmp}/file.txt", "is a file, not a directory"),
    ("traffic --out {tmp}/file.txt/sub", "{tmp}/file.txt is a file, not a directory"),
    ("traffic --out /proc/commscope-nope", "/proc/commscope-nope"),
    ("summarize {tmp}/run --out {tmp}/file.txt", "is a file, not a directory"),
    ("moe simulate --model mixtral-8x7b --ep 8 --out /proc/commscope-nope", "out='/proc/commscope-nope': cannot create"),
    ("export chakra --out {tmp}/file.txt", "out='{tmp}/file.txt': {tmp}/file.txt is a file, not a directory"),
    ("export chakra --out /proc/commscope-nope/et", "out='/proc/commscope-nope/et': cannot create it in /proc"),
    ("export parquet --run {tmp}/run --out {tmp}/file.txt", "out='{tmp}/file.txt': {tmp}/file.txt is a file"),
    ("export chakra --out {tmp}/et --prefix ../escaped", "prefix='../escaped': must be a plain file name stem"),
    ("export chakra --out {tmp}/et --prefix ''", "prefix='': must be a plain file name stem: not empty"),
    ("export chakra --out {tmp}/et --prefix .hidden", "prefix='.hidden': must be a plain file name stem"),
    ("export chakra --out {tmp}/et --prefix a/b", "prefix='a/b'"),
    # sizes that do not match the ranks are named, not a global batch the user never gave (the saved one, 8)
    ("summarize {tmp}/saved --tp 8 --pp 8 --dp 64", "tp x pp x dp x cp=4096: must equal the 1 ranks in the logs"),
    ("summarize {tmp}/saved2", "tp x pp x dp x cp=4: must equal the 1 ranks in the logs (read from {tmp}/saved2/parallel.toml)"),
    ("summarize {tmp}/saved-empty", "parallel='{tmp}/saved-empty/parallel.toml': is empty"),  # once: read as 1 rank
    ("summarize {tmp}/run --gpus-per-node 0", "gpus_per_node=0: must be a positive integer"),
    ("fit {tmp}/bench.json --out /dev/full", "out='/dev/full': is not a regular file (a device"),  # renamed over
    ("fit {tmp}/bench.json --out {tmp}/file.txt/fit.toml", "out='{tmp}/file.txt/fit.toml': {tmp}/file.txt is a file"),
    ("fit {tmp}/bench.json --out /proc/x.toml", "out='/proc/x.toml': cannot write into /proc"),  # once after the fit
    ("fit {tmp}/nope.json --out /proc/x.toml", "out='/proc/x.toml'"),  # the output first: checked before any work
    ("bench --nproc 2 --out {tmp}/dir", "out='{tmp}/dir': is a directory"),
    ("bench --nproc 2 --out {tmp}/file.txt/x.json", "is a file, not a directory"),
    ("bench --nproc 2 --out {tmp}/bench.png", "out='{tmp}/bench.png': is the JSON of the measured rows"),  # once: the plot overwrote it
    ("bench --nproc 2 --out {tmp}/b.SVG --no-plot", "give a .json name such as {tmp}/b.json"),
    ("bench --nproc 2 --out {tmp}/dir/x.json", "out='{tmp}/dir/x.json': the busbw plot beside it"),  # dir/x.png below
    ("tune --nproc 2 -b 1K -e 4K -n 1 -w 0 --out /proc/x.json", "out='/proc/x.json': cannot write into /proc"),  # once after the sweep, unnamed
    ("tune --nproc 2 -b 1K -e 4K -n 1 -w 0 --out {tmp}/dir", "out='{tmp}/dir': is a directory"),  # once after the sweep: "Is a directory: run"
    ("tune --show {tmp}/nope.json", "show='{tmp}/nope.json': no such file"),
    ("tune --show {tmp}/dir", "show='{tmp}/dir': is a directory"),
    ("calibrate --out /proc/x.toml", "out='/proc/x.toml': cannot write into /proc"),  # once after the calibration
    ("calibrate --out {tmp}/dir.toml", "out='{tmp}/dir.toml': is a directory"),
    ("calibrate --out {tmp}/c.toml --name ''", "name='': must not be empty; leave --name out"),  # once: named 'c'
    ("calibrate --out {tmp}/c.toml -e 100", "maxbytes='100': -e must be at least 1M"),  # once: sizes='-b 1024 -e 100'
    ("calibrate --out {tmp}/c.toml -e 4K --time-budget 0.005", "maxbytes='4K': -e must be at least 1M"),  # 0.009 GB/s
    ("calibrate --out {tmp}/c.toml -e 4Q", "maxbytes='4Q': -e expected a number with an optional K, M, G or T suffix"),
    ("calibrate --out {tmp}/c.toml --time-budget nan", "time-budget=nan: must be > 0"),
    ("calibrate --out {tmp}/c.toml -e 1000T", "maxbytes=1099511627776000"),
    # --- calibrate --kernels DIR / --model: a GPU file
    ("calibrate --kernels {tmp}/nope --gpu h200 --out {tmp}/g.toml", "kernels='{tmp}/nope': is not a directory of kernel CSVs"),
    ("calibrate --kernels {tmp}/dir --gpu h200 --out {tmp}/g.toml", "holds no usable kernel measurement"),
    ("calibrate --kernels {tmp}/kernels-bad-header --gpu h200 --out {tmp}/g.toml",
     "kernels='h200_gemms.csv line 1': header lacks measured_s"),
    ("calibrate --kernels {tmp}/kernels-layers-only --gpu h200 --out {tmp}/g.toml", "nothing written"),
    ("calibrate --kernels {tmp}/kernels-ok --out {tmp}/g.toml", "--kernels needs --gpu BASE"),
    ("calibrate --kernels {tmp}/kernels-ok --gpu h900 --out {tmp}/g.toml", "gpu='h900': not a GPU preset"),
    ("calibrate --kernels {tmp}/kernels-ok --gpu {tmp}/nope.toml --out {tmp}/g.toml", "gpu='{tmp}/nope.toml': no such file"),
    ("calibrate --kernels {tmp}/kernels-ok --gpu h200 --out /proc/g.toml", "out='/proc/g.toml': cannot write into /proc"),
    ("calibrate --kernels {tmp}/kernels-ok --gpu h200 --out {tmp}/dir.toml", "out='{tmp}/dir.toml': is a directory"),
    ("calibrate --kernels {tmp}/kernels-ok --gpu h200 --out {tmp}/g.json", "out='{tmp}/g.json': must be a .toml file"),
    ("calibrate --kernels {tmp}/kernels-ok --model llama3-8b --out {tmp}/g.toml", "give one of them"),
    ("calibrate --kernels {tmp}/kernels-ok --gpu h200 --nproc 4 --out {tmp}/g.toml",
     "nproc=4: --nproc belongs to the cluster calibration"),
    ("calibrate --tp 8 --out {tmp}/c.toml", "tp=8: --tp describes the job whose kernels --model measures"),
    ("calibrate --model llama3-8b --tp 3 --out {tmp}/g.toml", "tp=3: must divide num_heads=32"),
    ("calibrate --model llama3-8b --micro-batch-size 0 --out {tmp}/g.toml", "micro-batch-size=0: must be a positive"),
    ("calibrate --model llama3-8b --dtype fp32 --out {tmp}/g.toml", "dtype='fp32': the kernel calibration times bf16"),
    ("calibrate --model llama3-8b --sustained-s -1 --out {tmp}/g.toml", "sustained-s=-1.0: must be 0 (none) to 600"),
    ("calibrate --model nosuch --out {tmp}/g.toml", "nosuch"),
    ("calibrate --model llama3-8b --kernels-out {tmp}/file.txt --out {tmp}/g.toml", "is a file, not a directory"),
    ("shapes --kernels-out {tmp}/k", "kernels-out='{tmp}/k': writes what --measure measured: add --measure"),
    ("estimate --gpu {tmp}/nope.toml", "gpu='{tmp}/nope.toml': no such file"),
    ("estimate --gpu h900", "gpu='h900': not a GPU preset"),
    ("report", "give --out FILE.html"),
    # --- recordings are never appended to
    ("record --out {tmp}/run -- true", "already holds a recording"),
    ("record --out {tmp}/file.txt -- true", "is a file, not a directory"),
    ("record --out {tmp}/new-run", "give the job to run after --"),
    ("record --out {tmp}/new-run-2 -- /nonexistent/cmd", "not found on PATH"),
    ("workload gpt --record {tmp}/run", "already holds a recording of an earlier run (rank00000.jsonl"),
    ("workload gpt --record {tmp}/file.txt", "is a file, not a directory"),
    # --- more ranks than the machine, backends this torch lacks: refused before anything forks
    ("bench --nproc 100000", "pass --oversubscribe"),
    ("bench --nproc 1", "nproc=1"),
    ("bench --nproc 2 --backend mpi", "backend='mpi'"),
    ("bench --nproc 2 --backend carrier-pigeon", "not a torch.distributed backend"),
    ("bench --nproc 2 -b 1G -e 1K", "minbytes"),
    ("bench --nproc 2 --ops all_reduce -n 1 -w 0 -b 3 -e 3", "sizes='-b 3 -e 3': all_reduce of float over 2 ranks needs"),  # once 0 rows, exit 0
    ("bench --nproc 2 --ops all_gather -n 1 -w 0 -d double -b 8 -e 15", "at least 16 B (one 8-byte element per rank)"),
    ("tune --nproc 2 --ops all_to_all -n 1 -w 0 -b 1 -e 7", "all_to_all of float over 2 ranks needs messages of at least 8 B"),
    ("bench --nproc 2 --ops nope", "ops='nope'"),
    ("bench --nproc 2 --noisy-cv -1", "noisy_cv=-1.0: --noisy-cv must be > 0"),  # once: "1 of 1 rows are noisy (cv > -1.0)"
    ("bench --nproc 2 --noisy-cv nan", "noisy_cv=nan: --noisy-cv must be > 0"),
    ("bench --nproc 2 -n 100000000000", "iters=100000000000: -n must be 1-100,000"),  # once: ran for ever
    ("bench --nproc 2 -w 100000000000", "warmup_iters=100000000000: -w must be 0-100,000"),
    ("bench --nproc 2 --time-budget nan", "time_budget_s=nan: must be > 0"),
    ("bench --nproc 2 -n 1 -w 0 --ops all_reduce,all_to_all -b 1K -e 1000T", "maxbytes=1099511627776000: the sweep's largest size, 512.00 TiB: all_to_all over 2 ranks needs 1"),  # once SIGKILL
    ("tune --nproc 2 --noisy-cv 0", "noisy_cv=0.0: --noisy-cv must be > 0"),
    ("tune --nproc 2 -n 1 -w 0 -b 1K -e 1000T", "maxbytes=1099511627776000"),
    ("bench", "give --nproc N"),
    ("tune --nproc 100000", "pass --oversubscribe"),
    ("tune", "give --nproc N"),
    ("workload gpt --dp 4096", "pass --oversubscribe"),
    ("workload gpt --tp 64 --dp 64", "tp=64"),
    ("workload gpt --steps 0", "steps=0"),
    ("workload gpt --micro-batches 0", "micro-batches=0"),
    ("workload moe --ep 3 --dp 4", "ep=3: must divide dp=4"),
    # --- configurations with no valid plan
    ("plan --gpus 0", "gpus=0"),
    ("plan --gpus -8", "gpus=-8"),
    ("plan --gpus 8 --top 0", "top=0"),
    ("plan --gpus 8 --micro-batch-sizes 0", "micro-batch-sizes='0'"),
    ("plan --gpus 8 --cp-sizes 0,2", "cp-sizes='0,2'"),
    ("plan --gpus 8 --max-tp 0", "max-tp=0"),
    ("plan --gpus 1 --model llama3-405b --cluster dgx-a100", "none of the"),
    ("plan --gpus 32 --micro-batch-sizes 3", "micro-batch-sizes='3': no candidate"),  # once numpy's zero-size error
    ("plan --gpus 32 --ep-sizes 2", "ep-sizes='2': gpt-1.5b is dense (no experts)"),
    ("plan --model mixtral-8x7b --gpus 64 --cluster dgx-h100 --ep-sizes 3", "ep-sizes='3': ep must divide num_experts=8"),
    ("plan --gpus 100000000", "gpus=100000000: more GPUs than any cluster built or planned"),  # the warning on the GPU count is not shown
    # --- values with no physical meaning
    ("estimate --seq-length 1002 --cp 2 --tp 1 --pp 1 --dp 4", "divisible by 2 x cp = 4"),
    ("estimate --fp8-format hybrid --cluster dgx-a100", "fp8_format='hybrid'"),
    ("estimate --gpu-util 0", "gpu_util=0.0"),
    ("estimate --gpu-util 1.5", "gpu_util=1.5"),
    ("moe simulate --model mixtral-8x7b --ep 8 --capacity-factor inf", "capacity_factor=inf: must be a finite number"),
    ("moe analyze {tmp}/nope --capacity-factor nan", "capacity_factor=nan: must be a finite number > 0"),
    ("traffic --cluster {tmp}/fast-cluster.toml", "outside any real link's range"),
    ("traffic --cluster {tmp}/zero-latency-cluster.toml", "latency range"),
    ("estimate --bandwidth {tmp}/fast-table.csv", "outside any real link's range"),
    ("estimate --bandwidth {tmp}/nan-table.csv", "must be a finite number"),
    ("report --out {tmp}/dir", "out='{tmp}/dir': is a directory; give a file name"),
    ("report --out {tmp}/r.html --moe {tmp}/nan-table.csv", "is not a readable .npz archive of routing counts"),
    # a table that is no table is refused (a damaged number in a row is skipped with a warning: see below)
    ("estimate --bandwidth {tmp}/table-intra_node-maybe.csv", "row 2.intra_node='maybe': valid: true or false"),
    ("estimate --bandwidth {tmp}/table-extra-cell.csv", "row 2="),
    ("estimate --bandwidth {tmp}/table-short-row.csv", "row 2=",),
    ("estimate --bandwidth {tmp}/flat-fit.toml", "every fitted curve is unreliable"),
]

# A damaged row of a measured table: skipped with a warning naming the file and line, as `fit` skips it (issue 36:
# the same rules, the same outcome in fit and --bandwidth); each file: one row of two changed.
DAMAGED_TABLE_ROWS = [
    ("busbw_GBps", "-220", "busbw_GBps='-220': not a bandwidth (must be a finite number > 0)"),
    ("busbw_GBps", "0", "busbw_GBps='0': not a bandwidth"),
    ("busbw_GBps", "abc", "busbw_GBps='abc': not a bandwidth"),
    ("size_bytes", "-268435456", "size_bytes='-268435456': must be >= 1"),
    ("size_bytes", "4e29", "size_bytes='4e29': larger than any real message (> 1 TiB)"),
    ("group_size", "0", "group_size='0': must be >= 2 (one rank moves nothing)"),
    ("group_size", "-8", "group_size='-8': must be >= 2"),
    ("group_size", "2.5", "group_size='2.5': not a whole finite number"),
    ("op", "allredux", "op='allredux': not a collective a bandwidth table holds (all_reduce"),
]


@pytest.mark.parametrize(("field", "value", "fragment"), DAMAGED_TABLE_ROWS, ids=[f"{f}={v}" for f, v, _ in DAMAGED_TABLE_ROWS])
def test_a_damaged_table_row_is_skipped_and_named(capsys: pytest.CaptureFixture[str], fixtures: Path, field: str,
                                                  value: str, fragment: str) -> None:
    table = fixtures / f"table-{field}-{value}.csv"
    assert main(["estimate", "--bandwidth", str(table)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"commscope estimate: warning: {table.name} line 3.{fragment}")
    assert err[0].endswith(": row skipped")
    alone = fixtures / f"alone-{field}-{value}.csv"  # the damaged row alone: no usable row, the file refused
    alone.write_text("\n".join(table.read_text().splitlines()[::2]) + "\n")
    assert main(["estimate", "--bandwidth", str(alone)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"bandwidth='{alone.name}': has no usable row: {alone.name} line 2.{fragment}" in err[0]


_PARALLEL_FILES = {"empty.toml": "", "meta-only.toml": "[meta]\nnote = 'nothing else'\n", "badtype.toml": 'tp = "two"\n',
                   "unknown.toml": "tq = 2\n"}


#: Kernel directories for `calibrate --kernels`: name -> the one CSV in it.
KERNEL_DIRS = {
    "kernels-ok": "model,tp,micro_batch,gemm,pass,m,n,k,measured_s\nx,1,1,qkv,fwd,2048,4608,12288,0.000338\n",
    "kernels-bad-header": "model,tp,micro_batch,gemm,pass,m,n,k,seconds\nx,1,1,qkv,fwd,2048,4608,12288,0.000338\n",
    "kernels-layers-only": ("model,tp,micro_batch,mode,fwd_s_per_layer,bwd_s_per_layer\n"
                            "gpt3-175b,8,1,eager,0.00142201602,0.00348713982\n"),
}


def _cluster(intra_gbps: float, latency_us: float) -> str:
    return (f'name = "x"\ngpu = "A100"\ngpus_per_node = 8\nmemory_GiB = 80\n[peak_tflops]\nbf16 = 312\n'
            f'[intra_node]\nname = "nvlink"\nbandwidth_GBps = {intra_gbps}\nlatency_us = {latency_us}\n'
            f'[inter_node]\nname = "ib"\nbandwidth_GBps = 25\n')


def bench_json(times_s: list[float], *, op: str = "all_reduce", noisy: bool = False) -> str:
    """A `commscope bench --out` file of one op over 2 ranks, sizes 1 KiB x 4^i."""
    rows = [{"op": op, "group_size": 2, "size_bytes": 1024 * 4**i, "time_s": t, "wrong": 0, "noisy": noisy}
            for i, t in enumerate(times_s)]
    return json.dumps({"meta": {"backend": "gloo"}, "rows": rows})


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad-inputs")
    (tmp / "dir").mkdir()
    (tmp / "dir.toml").mkdir()
    (tmp / "dir" / "x.png").mkdir()
    (tmp / "file.txt").write_text("not a log\n")
    for name, text in KERNEL_DIRS.items():
        (tmp / name).mkdir()
        (tmp / name / ("h200_layers.csv" if "layers" in name else "h200_gemms.csv")).write_text(text)
    for name, text in _PARALLEL_FILES.items():
        (tmp / name).write_text(text)
    (tmp / "fast-cluster.toml").write_text(_cluster(1e9, 3))
    (tmp / "zero-latency-cluster.toml").write_text(_cluster(300, 0))
    (tmp / "fast-table.csv").write_text("op,group_size,size_bytes,busbw_GBps\nall_reduce,8,1048576,1e9\n"
                                        "all_reduce,8,2097152,100\n")
    (tmp / "nan-table.csv").write_text("op,group_size,size_bytes,busbw_GBps\nall_reduce,8,1048576,nan\n")
    good = {"op": "all_reduce", "group_size": "8", "size_bytes": "268435456", "busbw_GBps": "220", "intra_node": "true"}
    for field, value in [(f, v) for f, v, _ in DAMAGED_TABLE_ROWS] + [("intra_node", "maybe")]:
        (tmp / f"table-{field}-{value}.csv").write_text(
            ",".join(good) + "\nall_reduce,8,1048576,20,true\n" + ",".join({**good, field: value}.values()) + "\n")
    (tmp / "table-extra-cell.csv").write_text(",".join(good) + "\nall_reduce,8,1048576,20,true\n"
                                              + ",".join(good.values()) + ",7\n")
    (tmp / "table-short-row.csv").write_text(",".join(good) + "\nall_reduce,8,1048576,20,true\nall_reduce,8,268435456\n")
    (tmp / "bench.json").write_text(bench_json([1e-4 + 4**i * 1e-7 for i in range(6)]))
    (tmp / "bcast-all-roots.txt").write_text(
        (Path(__file__).parents[1] / "io" / "data" / "nccl-tests_broadcast_4gpu_all-roots_constructed.txt").read_text())
    (tmp / "flat-fit.toml").write_text(
        '[model]\nkind = "commscope-fitted-bandwidth"\nversion = 1\n[[curves]]\nop = "all_reduce"\ngroup_size = 2\n'
        'unreliable = "infinite bus bandwidth"\nsegments = [{ size_min_bytes = 8, size_max_bytes = 1024, '
        'alpha_us = 5.0, busbw_GBps = inf }]\n')
    run = tmp / "run"
    run.mkdir()
    (run / "rank00000.jsonl").write_text('{"op":"all_reduce","axis":"other","group":[0],"size_bytes":4,'
                                         '"dtype":"fp32","rank":0}\n')
    saved = tmp / "saved"  # a recording with its job saved beside it, as workload --record leaves it
    saved.mkdir()
    (saved / "rank00000.jsonl").write_text((run / "rank00000.jsonl").read_text())
    (saved / "parallel.toml").write_text("tp = 1\npp = 1\ndp = 1\nmicro_batch_size = 8\nglobal_batch_size = 8\n")
    for name, parallel in (("saved2", "dp = 4\n"), ("saved-empty", "")):  # a job saved with the wrong size; none
        folder = tmp / name
        folder.mkdir()
        (folder / "rank00000.jsonl").write_text((run / "rank00000.jsonl").read_text())
        (folder / "parallel.toml").write_text(parallel)
    return tmp


def count_by_command() -> dict[str, int]:
    """How many bad inputs the table tries, per command (the first word; "(none)" for the bare program)."""
    return dict(Counter((line.split() or ["(none)"])[0].lstrip("-") or "(none)" for line, _ in BAD_INPUTS))


@pytest.mark.parametrize(("line", "fragment"), BAD_INPUTS, ids=[line or "(empty)" for line, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], fixtures: Path, line: str,
                                          fragment: str) -> None:
    argv = shlex.split(line.replace("{tmp}", str(fixtures)))
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exit, through Parser.error
        code = exc.code
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1, err
    assert lines[0].startswith("commscope") and ": error: " in lines[0], lines[0]
    assert "Traceback" not in err + out and "usage:" not in err
    if importlib.util.find_spec("torch") is None and "this command needs PyTorch" in lines[0]:
        return  # a command that starts ranks, where torch is not installed: that is its one line (test_missing_extras)
    assert fragment.replace("{tmp}", str(fixtures)) in lines[0]
    assert not (fixtures / "new-run" / "rank00000.jsonl").exists()


def test_the_table_covers_every_command() -> None:
    counts = count_by_command()
    for command in ("traffic", "estimate", "plan", "record", "summarize", "compare", "bench", "fit", "report",
                    "shapes", "workload", "moe", "tune", "validate"):
        assert counts.get(command, 0) >= 1, command
    assert sum(counts.values()) == len(BAD_INPUTS) >= 100


# --- values that are computed, but never silently: one warning line each ------------------------------------------

def _run(capsys: pytest.CaptureFixture[str], line: str) -> tuple[int, str, str]:
    code = main(shlex.split(line))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_hugging_face_config_says_what_it_assumed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                                  "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 131072}))
    job = "--tp 1 --pp 1 --dp 1 --global-batch-size 1 --micro-batch-size 1 --cluster dgx-a100 --json"
    code, _, err = _run(capsys, f"traffic --model {config} {job}")
    assert code == 0
    warnings = err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("commscope traffic: warning: ") for w in warnings)
    assert "no model_type; read as 'llama', guessed from its keys" in warnings[0]
    assert "seq_length=131072 taken from max_position_embeddings" in warnings[1] and "--seq-length" in warnings[1]
    code, _, err = _run(capsys, f"traffic --model {config} --seq-length 2048 {job}")
    assert code == 0 and "max_position_embeddings" not in err  # the user chose: nothing to say
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_type": "llama"}))
    code, _, err = _run(capsys, f"traffic --model {config} --seq-length 2048 {job}")
    assert code == 0 and err == ""
    # a checkpoint stored in fp32 is still trained in bf16 unless --dtype says otherwise: said, once
    config.write_text(json.dumps({**json.loads(config.read_text()), "torch_dtype": "float32"}))
    code, _, err = _run(capsys, f"traffic --model {config} --seq-length 2048 {job}")
    assert code == 0 and "trained in bf16, not in its torch_dtype 'float32'" in err
    code, _, err = _run(capsys, f"traffic --model {config} --seq-length 2048 --dtype fp32 {job}")
    assert code == 0 and err == ""


def test_an_estimate_that_does_not_fit_in_memory_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    job = "estimate --model gpt-1.5b --tp 1 --pp 1 --dp 1 --global-batch-size 512 --micro-batch-size 64"
    code, out, err = _run(capsys, job)
    assert code == 0 and "iteration" in out
    assert err.startswith("commscope estimate: warning: this configuration does not fit in memory") and "GiB" in err
    code, out, err = _run(capsys, job + " --json")
    assert code == 0 and json.loads(out)["memory"]["fits"] is False
    assert err.startswith("commscope estimate: warning: this configuration does not fit in memory")
    code, out, err = _run(capsys, "estimate --json")  # the defaults fit
    assert code == 0 and json.loads(out)["memory"]["fits"] is True and err == ""


def test_bf16_on_a_gpu_without_it_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "estimate --dtype bf16 --cluster dgx1-v100 --json")
    assert code == 0 and json.loads(out)["iteration_time_s"] > 0
    assert err.strip().splitlines() == [err.strip()] and "has no bf16 arithmetic" in err and "--dtype fp16" in err
    code, out, err = _run(capsys, "estimate --dtype fp16 --cluster dgx1-v100 --json")
    assert code == 0 and err == ""
    code, out, err = _run(capsys, "estimate --dtype bf16 --cluster dgx-a100 --json")
    assert code == 0 and err == ""


def test_a_parallel_file_and_the_same_flags_give_the_same_job(capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    """One set of defaults: fields a --parallel file leaves out take the command's defaults, as flags do."""
    parallel = tmp_path / "parallel.toml"
    for text, flags in (("tp = 2\n", "--tp 2"), ("pp = 2\nsequence_parallel = true\n", "--pp 2 --sequence-parallel"),
                        ("dp = 8\n", "--dp 8")):
        parallel.write_text(text)
        code, from_file, err = _run(capsys, f"traffic --parallel {parallel} --json")
        assert code == 0, err
        code, from_flags, err = _run(capsys, f"traffic {flags} --json")
        assert code == 0, err
        assert json.loads(from_file) == json.loads(from_flags), text


def test_a_meaningless_fit_is_flagged_and_kept_out_of_the_estimate(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    bench = tmp_path / "bench.json"
    fitted = tmp_path / "fit.toml"
    # all_reduce: time grows with size (a real link); sendrecv: flat, i.e. infinite bus bandwidth
    rows = json.loads(bench_json([1e-4 + 4**i * 1e-7 for i in range(6)]))["rows"]
    rows += json.loads(bench_json([5e-5] * 6, op="sendrecv", noisy=True))["rows"]
    bench.write_text(json.dumps({"meta": {"backend": "gloo"}, "rows": rows}))
    code, out, err = _run(capsys, f"fit {bench} --out {fitted}")
    assert code == 0
    warning = [line for line in err.splitlines() if "warning" in line]
    assert len(warning) == 1 and "sendrecv over 2 ranks: unreliable fit" in warning[0]
    assert "infinite" in warning[0] or "outside any real link's range" in warning[0]
    assert "unreliable: sendrecv" in out and "fitted to 6 of 6 rows flagged noisy" in out
    code, out, err = _run(capsys, f"estimate --tp 1 --pp 2 --dp 2 --global-batch-size 8 --bandwidth {fitted} --json")
    assert code == 0, err
    notes = json.loads(out)["notes"]
    assert any("sendrecv over 2 ranks left out: unreliable fit" in n for n in notes)
    assert any("no sendrecv fit" in n and "cluster preset" in n for n in notes)  # PP fell back, and says so


def test_count_of_bad_inputs_by_command() -> None:
    """The numbers the issue asks for (printed with -s)."""
    counts = count_by_command()
    print("bad inputs by command:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), f"(total {len(BAD_INPUTS)})")
    assert counts["traffic"] >= 20 and counts["bench"] >= 8 and counts["workload"] >= 8


def test_a_pipeline_with_fewer_micro_batches_than_stages_says_what_it_costs(capsys: pytest.CaptureFixture[str]) -> None:
    job = "estimate --model gpt-1.5b --tp 1 --pp 8 --dp 2 --global-batch-size 16 --micro-batch-size 4 --gpus-per-node 8"
    code, out, err = _run(capsys, job)
    assert code == 0
    line = next(x for x in err.splitlines() if "micro-batches for pp=8" in x)
    assert line.startswith("commscope estimate: warning: 2 micro-batches for pp=8: the pipeline idles")
    assert "--micro-batch-size 1 gives 8" in line
    bubble = float(line.split("idles ")[1].split("%")[0])
    code, out, err = _run(capsys, job + " --json")
    assert code == 0 and round(100 * json.loads(out)["bubble_ratio"]) == bubble
    assert "micro-batches for pp=8" in err
    code, out, err = _run(capsys, job.replace("--micro-batch-size 4", "--micro-batch-size 1"))
    assert code == 0 and "micro-batches for pp" not in out + err


PIPE_READERS = {"fit": ["fit"], "summarize": ["summarize"], "tune --show": ["tune", "--show"],
                "estimate --bandwidth": ["estimate", "--model", "gpt3-125m", "--cluster", "dgx-a100", "--dp", "2",
                                         "--bandwidth"],
                "report --bench": ["report", "--no-predicted", "--out", "r.html", "--bench"]}


@pytest.mark.parametrize("command", list(PIPE_READERS))
def test_a_pipe_is_named_as_such_not_as_a_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                       command: str) -> None:
    """`commscope fit <(zcat log.gz)` said 'no such file' of a file that exists (a pipe, which the readers would
    read twice: format detection consumed it); tune --show, estimate --bandwidth and report --bench said so still."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # never opened: the check looks at the file's type only
    argv = [str(tmp_path / a) if a == "r.html" else a for a in PIPE_READERS[command]]
    assert main([*argv, str(fifo)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not a regular file (a pipe or a device?)" in err and str(fifo) in err


@pytest.mark.parametrize("command", list(PIPE_READERS))
def test_an_unreadable_file_is_said_to_be_unreadable(tmp_path: Path, command: str) -> None:
    """A file the user may not read was met by tune --show, estimate --bandwidth and report --bench as 'Permission
    denied (choose a writable place)': a hint for a write, on a read. As a user without the right to read it (root
    with its right to read anything dropped, where the tests run as root)."""
    import os
    import shutil
    import subprocess
    import sys

    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: every file is readable")
        prefix = [setpriv, "--inh-caps=-dac_override,-dac_read_search",
                  "--bounding-set=-dac_override,-dac_read_search", "--"]
    secret = tmp_path / "secret.json"
    secret.write_text('{"rows": []}')
    secret.chmod(0)
    argv = [str(tmp_path / a) if a == "r.html" else a for a in PIPE_READERS[command]]
    proc = subprocess.run([*prefix, sys.executable, "-m", "commscope.cli.main", *argv, str(secret)],
                          capture_output=True, text=True, check=False, timeout=120, cwd=tmp_path)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "Permission denied" in err[-1] and "secret.json" in err[-1] and "writable" not in err[-1], err


def test_an_option_given_twice_with_two_values_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    # the last one is kept (a wrapper's defaults, then the user's own), but never silently
    job = "--model gpt3-1.3b --cluster dgx-a100 --pp 1 --dp 1 --global-batch-size 8 --micro-batch-size 1 --json"
    code, out, err = _run(capsys, f"estimate {job} --tp 2 --tp 4")
    assert code == 0 and json.loads(out)["parallel"]["tp"] == 4
    assert err.strip().splitlines() == [
        "commscope estimate: warning: --tp given twice (--tp 2, then --tp 4): using 4"]
    code, out, err = _run(capsys, f"estimate {job} --tp 2 --tp=2")
    assert code == 0 and json.loads(out)["parallel"]["tp"] == 2 and err == ""  # the same value twice: nothing to say
    code, _, err = _run(capsys, f"estimate {job} --tp 2")  # one parse's options are not the next one's
    assert code == 0 and err == ""
