"""--help, as a newcomer reads it: every script's help runs (in a process of its own), each
method's flags in groups with switches shown bare and every empty default said, common.py alone
lists its commands. The oracle: the help text's written layout [issue 42, issue 55]."""
import importlib
import re
import subprocess
import sys

import pytest

import common
from conftest import ROOT, help_text

METHODS = ["simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py"]


def test_help_runs():
    procs = {script: subprocess.Popen([sys.executable, script, "--help"], cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for script in ("common.py",
                                                                             "simcse_min.py")}
    try:  # side by side: each is mostly the import of torch
        outputs = {script: p.communicate(timeout=300) for script, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill() if p.poll() is None else None
            p.wait()
    for script, p in procs.items():
        assert p.returncode == 0, (script, outputs[script][1])
    assert "--overwrite" in outputs["simcse_min.py"][0]
    assert "--compile" in outputs["simcse_min.py"][0]


@pytest.mark.parametrize("script", METHODS)
def test_method_help_groups_flags_and_shows_switches_bare(script, capsys):
    module = importlib.import_module(script.removesuffix(".py"))
    out = help_text(capsys, common.parse_args, module.Config, ["--help"])
    headers = re.findall(r"^(\S[^:\n]*):$", out, re.M)
    assert headers[-4:] == ["data and model", "training", "method", "run and output"], headers
    assert not re.search(r"--\w+ \[[A-Z_]+\]", out), "a switch shown with a value"
    assert "--overwrite, --no_overwrite\n" in out and "(default: off)" in out  # [issue 55]
    assert "(default: )" not in out and "(default: None)" not in out
    # empty defaults: the help says what empty means
    for flag in ("--senteval", "--out_dir", "--resume"):
        assert re.search(rf"{flag} \S+\s+\S", out), flag


def test_common_alone_lists_its_commands_and_each_help_is_grouped(capsys):
    common.cli([])
    alone = capsys.readouterr().out
    assert all(c in alone for c in ("eval", "download", "analyze")), alone
    for command in ("eval", "analyze"):
        out = help_text(capsys, common.cli, [command, "--help"])
        assert "data and model:" in out and "run and output:" in out and "(default: )" not in out
        assert "empty: ./SentEval/data/downstream" in out  # what an empty --senteval does
