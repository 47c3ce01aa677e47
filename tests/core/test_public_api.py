"""The public API is what __all__ says, and the analytical core stays light (numpy and the standard library)."""

import subprocess
import sys

import commscope


def test_all_names_resolve():
    for name in commscope.__all__:
        assert getattr(commscope, name) is not None, name


def test_core_imports_neither_torch_nor_plotting():
    code = ("import sys, commscope, commscope.estimate, commscope.estimate.plan, commscope.estimate.memory, commscope.pattern.volumes, "
            "commscope.estimate.shapes, commscope.estimate.schedule, commscope.cli.main; commscope.cli.main.build_parser(); "
            "print(sorted(m for m in ('torch', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
