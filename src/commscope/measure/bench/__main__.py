"""``python -m commscope.measure.bench``: the sweep inside an existing job, one process per rank.

    torchrun --nproc-per-node 8 -m commscope.measure.bench -b 8 -e 1G -f 2 --groups 2,4,8 --out bench.json

Reads RANK / WORLD_SIZE / LOCAL_RANK from torchrun, initialises the default process group (NCCL on
``cuda:LOCAL_RANK`` when CUDA is available, else gloo; ``--backend`` to choose), and runs the same sweep as
``commscope bench``; rank 0 prints the table and writes ``--out``. ``--nproc N`` starts N local ranks instead.
"""

import sys

from commscope.cli.bench_cmd import main

if __name__ == "__main__":
    sys.exit(main())
