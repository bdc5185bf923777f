"""Hostile and broken inputs (tests/bad_inputs.py lists them): each gives its exit code and one line on stderr, never
a traceback, and a refusal before training leaves no out_dir behind. Run in-process through main_guard, the same
path as the command line (tests/bad_inputs.py runs them through real processes and prints the table)."""
import importlib

import pytest

import common
from bad_inputs import cases, prepare, substitute


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-inputs")
    rows, context = cases(tmp)
    return rows, prepare(tmp, context), tmp


def run(script, args):
    module = importlib.import_module(f"{script}_min")
    try:
        common.main_guard(module.train, common.parse_args(module.Config, args))
    except SystemExit as e:
        return e.code
    return 0


def test_every_bad_input_gives_one_line_and_its_exit_code(table, capsys):
    rows, names, tmp = table
    wrong = []
    for label, script, args, code, no_out_dir in rows:
        got = run(script, substitute(args, names))
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if "error:" in line]
        if got != code or "Traceback" in err or (code and len(errors) != 1):
            wrong.append(f"{label}: exit {got} (want {code}): {err.strip()[-300:]}")
        if no_out_dir and (tmp / "out").exists():
            wrong.append(f"{label}: left {tmp / 'out'} behind")
    assert not wrong, "\n".join(wrong)


def test_long_lines_are_cut_and_said_once(tmp_path, capsys):
    path = tmp_path / "long.txt"
    path.write_text("short one .\n" + "word " * 5000 + "\n")
    rows = common.read_training_data(path)
    assert [len(r[0]) for r in rows] == [11, common.MAX_SENTENCE_CHARS]
    assert capsys.readouterr().err.count("longer than 10,000 characters were cut") == 1


@pytest.mark.parametrize("flag, value", [("batch_size", 1), ("lr", float("inf")), ("dropout", -0.1),
                                         ("max_len", 2), ("queue_size", -3)])
def test_flag_ranges(flag, value):
    cfg = importlib.import_module("esimcse_min").Config(**{flag: value})
    with pytest.raises(common.UserError, match=f"--{flag} "):
        common.check_inputs(cfg, models=())
