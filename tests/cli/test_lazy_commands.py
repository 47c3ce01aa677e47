"""Sub-commands load lazily: ``commscope --help`` imports no command module, ``commscope X --help`` only X's,
and the help the user sees is the same as with every command loaded (issue 17)."""

import subprocess
import sys

import pytest

from commscope.cli.main import _COMMANDS, build_parser, main


def _imported_after(argv: list[str]) -> list[str]:
    code = (f"import sys\nfrom commscope.cli.main import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print(' '.join(sorted(m for m in sys.modules if m.endswith('_cmd') or m == 'numpy')), file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stderr.split()


def test_help_imports_no_command_module_and_no_numpy():
    assert _imported_after(["--help"]) == []


def test_command_help_imports_only_that_command():
    assert [m for m in _imported_after(["traffic", "--help"]) if m != "numpy"] == ["commscope.cli.traffic_cmd"]


def test_listed_help_lines_are_the_commands_own():
    full = build_parser()
    choices = next(a for a in full._actions if isinstance(a, type(full._subparsers._group_actions[0])))
    own = {action.dest: action.help for action in choices._choices_actions}
    assert own == _COMMANDS
    assert build_parser("").format_help() == full.format_help()


def test_each_command_parses_as_with_every_command_loaded():
    argv = ["estimate", "--tp", "2", "--pp", "2", "--dp", "2"]
    assert vars(build_parser("estimate").parse_args(argv)).keys() == vars(build_parser().parse_args(argv)).keys()


def test_unknown_command_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["trafic"])
    assert exc.value.code == 2
    assert "invalid choice: 'trafic'" in capsys.readouterr().err
