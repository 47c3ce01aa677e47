"""``python -m commscope.measure.tune``: ``commscope tune`` for ``torchrun -m`` (every rank measures, rank 0 writes)."""

import sys

from commscope.cli.tune_cmd import main

sys.exit(main())
