"""The flags as parse_args and common.py's commands read them: boolean flags are bare switches
with a --no_ form (the old `--flag 0` too); a flag is never guessed from a prefix, an unknown one
names the nearest known flag, another method's flag names its file; every --flag a message names
exists; a flag typed with a dash that is not one is said. The oracle: each flag's written rule,
on every method's Config and every command."""
import re

import pytest

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from conftest import ROOT, help_text, one_line

METHODS = [simcse_min, esimcse_min, simcsepp_min, diffcse_min]
SCRIPTS = [m.__name__ + ".py" for m in METHODS]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--overwrite", "--compile"], (True, True)),
        (["--overwrite", "1"], (True, False)),
        (["--overwrite", "true"], (True, False)),
        (["--overwrite", "0"], (False, False)),
        ([], (False, False)),
    ],
)
def test_boolean_flags_are_bare_switches(argv, expected):
    cfg = common.parse_args(simcse_min.Config, argv)
    assert (cfg.overwrite, cfg.compile) == expected


def test_bad_boolean_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        common.parse_args(simcse_min.Config, ["--overwrite", "maybe"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "maybe" in err[0], err


@pytest.mark.parametrize("module", METHODS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("typed, meant", [("--max_step", "--max_steps"), ("--eval", "--eval_every"),
                                          ("--eval-every", "--eval_every"), ("--tes", "--test"),
                                          ("--max_stesp", "--max_steps")])  # a typo: difflib
def test_a_method_flag_is_never_guessed_and_the_nearest_is_named(module, typed, meant, capsys):
    with pytest.raises(SystemExit) as stop:  # argparse took a prefix as its flag before
        common.parse_args(module.Config, [typed, "10"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: unknown flag {typed}; did you mean {meant}? " \
                                      f"(see --help)\n"


@pytest.mark.parametrize("argv, typed, meant", [
    (["eval", "--model", "m", "--pool", "cls"], "--pool", "--pooler"),
    (["eval", "--model", "m", "--poolr", "cls"], "--poolr", "--pooler"),
    (["analyze", "--model", "m", "--out", "o", "--comp", "x"], "--comp", "--compare"),
    (["encode", "--model", "m", "--input", "f", "--out", "v", "--batch", "8"], "--batch",
     "--batch_size"),
    (["search", "--model", "m", "--corpus", "c", "--query", "q", "--top", "3"], "--top", "--top_k"),
    (["search", "--model", "m", "--corpus", "c", "--query", "q", "--top-k", "3"], "--top-k",
     "--top_k"),
    (["download", "senteval", "--hel"], "--hel", "--help"),
])
def test_a_command_flag_is_never_guessed_and_the_nearest_is_named(argv, typed, meant, capsys):
    with pytest.raises(SystemExit) as stop:  # before: a prefix ran the command, or no hint
        common.cli(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: unknown flag {typed}; did you mean {meant}? " \
                                      f"(see --help)\n"


def training_flags():
    return {f.name for m in METHODS for f in common.dataclasses.fields(m.Config)}


def test_every_flag_a_message_names_exists():
    """Every --flag in a string of the five files is a training flag, an eval/analyze flag, or
    --help."""
    cli_flags = {"model", "pooler", "senteval", "batch_size", "device", "mode", "tasks", "json",
                 "compare", "runs", "out", "help", "sts_file", "input", "corpus", "vectors",
                 "query", "queries", "top_k"}
    for name in ["common.py", *SCRIPTS]:
        text = (ROOT / name).read_text()
        strings = re.findall(r"\"[^\"\n]*\"", text)
        named = {m for s in strings for m in re.findall(r"(?<![\w-])--([a-z][a-z_]*)", s)}
        named -= {"no_"}  # a switch's off form, --no_ + its name (parse_args) [issue 55]
        assert named <= training_flags() | cli_flags | {"name"}, (name, named - training_flags()
                                                                  - cli_flags)


@pytest.mark.parametrize("module, flag, owner", [
    (simcse_min, "--dup_rate", "ESimCSE's: esimcse_min.py"),
    (simcse_min, "--mask_ratio", "DiffCSE's: diffcse_min.py"),
    (simcse_min, "--m", "SimCSE++'s: simcsepp_min.py"),
    (esimcse_min, "--hard_weight", "SimCSE's: simcse_min.py"),
    (diffcse_min, "--no_off_dropout", "SimCSE++'s: simcsepp_min.py"),
    (diffcse_min, "--mlm_weight", "SimCSE's: simcse_min.py, ESimCSE's: esimcse_min.py, "
                                  "SimCSE++'s: simcsepp_min.py"),  # each of them
])
def test_a_flag_of_another_method_names_its_file(module, flag, owner, capsys):
    with pytest.raises(SystemExit) as stop:  # before: "did you mean --data?", or no hint
        common.parse_args(module.Config, [flag, "0.3"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == f"error: unknown flag {flag}; {flag} is {owner} (see --help)\n"


def test_a_command_flag_names_no_method(capsys):
    with pytest.raises(SystemExit):
        common.cli(["eval", "--model", "m", "--dup_rate", "0.3"])
    assert capsys.readouterr().err == "error: unknown flag --dup_rate (see --help)\n"


@pytest.mark.parametrize("module", METHODS, ids=lambda m: m.__name__)
def test_every_switch_has_its_no_form(module, capsys):
    switches = [f for f in common.dataclasses.fields(module.Config) if f.type in (bool, "bool")]
    assert switches
    for f in switches:
        on, off = f"--{f.name}", f"--no_{f.name}"
        assert getattr(common.parse_args(module.Config, [on]), f.name) is True
        assert getattr(common.parse_args(module.Config, [off]), f.name) is False  # before: refused
        assert getattr(common.parse_args(module.Config, [on, "0"]), f.name) is False  # the old form
        with pytest.raises(SystemExit):
            common.parse_args(module.Config, [off, "1"])  # --no_X takes no value
    capsys.readouterr()
    with pytest.raises(SystemExit):
        common.parse_args(module.Config, ["--help"])
    out = capsys.readouterr().out
    for f in switches:
        assert f"--{f.name}, --no_{f.name}" in out


def test_off_dropout_defaults_on_and_turns_off(capsys):
    assert common.parse_args(simcsepp_min.Config, ["--no_off_dropout"]).off_dropout is False
    out = " ".join(help_text(capsys, common.parse_args, simcsepp_min.Config, ["--help"]).split())
    assert "--off_dropout, --no_off_dropout negatives from a dropout-off pass" in out
    assert "(default: on)" in out


def test_errors_name_the_flag_typed(world, tmp_path, capsys):
    (tmp_path / "c.txt").write_text("a man .\na dog .\n")
    (tmp_path / "q.txt").write_text("\n  \n")
    search = ["search", "--model", world["model"], "--corpus", str(tmp_path / "c.txt"),
              "--device", "cpu"]
    assert "--queries" in one_line(capsys, search + ["--queries", str(tmp_path / "q.txt")])
    for query in ("", "   "):
        assert "--query is empty" in one_line(capsys, search + ["--query", query])
    (tmp_path / "q.txt").write_text("one\u2028query\x85still one\nanother\n")
    found = common.main_guard(common.cli, search + ["--queries", str(tmp_path / "q.txt")])
    assert {f["query"] for f in found} == {"one\u2028query\x85still one", "another"}
    for argv, hint in ((["\u2013lr", "1e-5"], "type --lr"), (["--lr", "-1e-5"], "--lr=-1e-5")):
        with pytest.raises(SystemExit):
            common.parse_args(simcse_min.Config, argv)
        assert hint in capsys.readouterr().err
