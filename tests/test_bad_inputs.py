"""Hostile and broken inputs (tests/tools/bad_inputs.py lists them): each gives its exit code and
one line on stderr, never a traceback, and a refusal before training leaves no out_dir behind. Run
in-process through main_guard, the same path as the command line (tests/tools/bad_inputs.py runs
them through real processes and prints the table). The oracle: each case's exit code and its one
line, as the table states them."""
import importlib
import sys
from pathlib import Path

import pytest

import common
from conftest import same_bytes
from bad_inputs import cases, lock_held, prepare, run_cli, substitute


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad-inputs")
    rows, context = cases(tmp)
    return rows, prepare(tmp, context), tmp


def run(script, args):
    if script.endswith(".py"):  # a tool (tests/tools/): in its own process, as a user runs it
        code, stderr = run_cli(script, args)
        print(stderr, end="", file=sys.stderr)
        return code
    try:
        if script == "common":
            common.main_guard(common.cli, args)
        else:
            module = importlib.import_module(f"{script}_min")
            common.main_guard(module.train, common.parse_args(module.Config, args))
    except SystemExit as e:
        return e.code
    return 0


def saved_files(names):
    """Bytes of every checkpoint, model and results file of the prepared runs (their logs may
    grow)."""
    return {p: p.read_bytes() for folder in names.values() for p in Path(folder).iterdir()
            if p.name != "log.txt"}


def test_every_bad_input_gives_one_line_and_its_exit_code(table, capsys, monkeypatch):
    rows, names, tmp = table
    wrong, before = [], saved_files(names)
    for label, script, args, code, no_out_dir, *options in rows:
        if options and "fsize" in options[0]:
            continue  # a file-size limit needs its own process: test_a_full_disk_is_one_line
        for k, v in (options[0].get("env", {}) if options else {}).items():
            monkeypatch.setenv(k, v)
        with lock_held(names, *options):
            got = run(script, substitute(args, names))
        monkeypatch.undo()
        err = capsys.readouterr().err
        errors = [line for line in err.splitlines() if "error:" in line]
        if got != code or "Traceback" in err or (code and len(errors) != 1):
            wrong.append(f"{label}: exit {got} (want {code}): {err.strip()[-300:]}")
        if no_out_dir and (tmp / "out").exists():
            wrong.append(f"{label}: left {tmp / 'out'} behind")
    assert not wrong, "\n".join(wrong)
    assert saved_files(names) == before  # every refused --resume left its run as it was


def test_a_full_disk_is_one_line_and_the_last_checkpoint_stays(table):
    """A checkpoint of a later step, or the final model, cannot be written: the previous checkpoint
    is intact."""
    rows, names, _ = table
    full = [r for r in rows if len(r) > 5 and "fsize" in r[5]]
    assert [r[2][-1] for r in full] == ["FULL_DISK", "FULL_DISK_FINAL"]
    for label, script, args, code, _, options in full:
        folder = Path(names[args[-1]])
        before = (folder / "checkpoint.pt").read_bytes()
        got, stderr = run_cli(script, substitute(args, names), options)
        assert got == code and "Traceback" not in stderr, stderr[-500:]
        assert stderr.strip().splitlines()[-1].startswith("error: no room to write"), stderr[-300:]
        assert same_bytes((folder / "checkpoint.pt").read_bytes(), before)
        assert not list(folder.glob(".*.tmp"))
        assert not (folder / "model.safetensors").exists(), label  # no partial model


def test_long_lines_are_cut_and_said_once(tmp_path, capsys):
    path = tmp_path / "long.txt"
    path.write_text("short one .\n" + "word " * 5000 + "\n")
    rows = list(common.training_rows(path))
    assert [len(r[0]) for r in rows] == [11, common.MAX_SENTENCE_CHARS]
    assert capsys.readouterr().err.count("longer than 10,000 characters were cut") == 1


@pytest.mark.parametrize("flag, value", [("batch_size", 1), ("lr", float("inf")), ("dropout", -0.1),
                                         ("max_len", 2), ("queue_size", -3)])
def test_flag_ranges(flag, value):
    cfg = importlib.import_module("esimcse_min").Config(**{flag: value})
    with pytest.raises(common.UserError, match=f"--{flag} "):
        common.check_inputs(cfg, models=())
