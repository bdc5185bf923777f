"""The first fifteen minutes, fourth pass [issue 55]: the tests never touch the checkout's runs/ or
the user's cache (a live run there is left alone), `--dev_file` with `--test none` needs no
SentEval, the README's test line gives the variables' values, a flag of another method names its
file, and every switch has its `--no_` form."""
import fcntl
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from conftest import ROOT
from tiny_world import make_world, sentence

METHODS = [simcse_min, esimcse_min, simcsepp_min, diffcse_min]


def default_out_dir(tmp):
    """Where a Run with the default --out_dir puts its folder (it takes its lock: a live run's
    there refuses it)."""
    world = make_world(tmp)
    world.pop("generator")
    run = common.Run(simcse_min.Config(**world, device="cpu"), simcse_min.__file__)
    run.release()
    return run.out.absolute()


@pytest.fixture(scope="module")
def module_out_dir(tmp_path_factory):  # as test_ddp.py's two processes: before any test's folder
    return default_out_dir(tmp_path_factory.mktemp("world"))


def test_a_test_runs_away_from_the_checkout_and_the_user_cache(tmp_path, module_out_dir):
    assert Path.cwd() != ROOT and ROOT not in Path.cwd().parents  # before: the checkout itself
    assert common.CACHE != Path.home() / ".cache" / "simcse-min"
    assert default_out_dir(tmp_path) == Path.cwd() / "runs" / "simcse"
    assert ROOT not in module_out_dir.parents


def snapshot(folder):
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


def test_the_suite_leaves_a_live_run_and_the_user_cache_alone(tmp_path):
    """A clone whose runs/simcse is held by a live run (its lock taken, as the quick start's) and a
    home whose cache holds a file: the test above, run there by pytest, passes (before: "--out_dir
    runs/simcse is in use by another run"), and both are as they were."""
    clone, home = tmp_path / "clone", tmp_path / "home"
    shutil.copytree(ROOT / "tests", clone / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ROOT.glob("*.py"):
        shutil.copy(f, clone)
    live = clone / "runs" / "simcse"
    live.mkdir(parents=True)
    (live / "log.txt").write_text("step 10/30 | loss 0.0302\n")
    (home / ".cache" / "simcse-min" / "data").mkdir(parents=True)
    (home / ".cache" / "simcse-min" / "data" / "wiki1m_for_simcse.txt").write_text("a man .\n")
    before = snapshot(clone / "runs"), snapshot(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMCSE_", "TORCHINDUCTOR"))}
    env |= {"HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the live run's lock
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "tests/test_newcomer.py::"
                               "test_a_test_runs_away_from_the_checkout_and_the_user_cache"],
                              cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]  # not skipped
    assert (snapshot(clone / "runs"), snapshot(home)) == before


def test_dev_file_with_test_none_needs_no_senteval(tmp_path, monkeypatch):
    world = make_world(tmp_path)
    world.pop("generator")
    rng = random.Random(0)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{sentence(rng)}\t{sentence(rng)}\t{i % 5}\n" for i in range(16)))
    monkeypatch.setattr(common, "HF_ENDPOINT", "http://127.0.0.1:9")  # offline
    monkeypatch.setattr(common, "CACHE", tmp_path / "empty-cache")  # no SentEval anywhere

    def no_download(*args, **kwargs):
        raise AssertionError("a run that reads no SentEval file fetched senteval.tar")
    monkeypatch.setattr(common, "download_senteval", no_download)
    cfg = simcse_min.Config(**{**world, "senteval": ""}, dev_file=str(pairs), test="none",
                            device="cpu", batch_size=8, max_steps=2, eval_every=1,
                            out_dir=str(tmp_path / "run"))
    results = simcse_min.train(cfg)  # before: the download's AssertionError
    assert results["test"] == {} and len(results["dev_history"]) == 3


def test_the_readme_gives_the_test_variables_values_as_ci_sets_them():
    ci = (ROOT / ".ci" / "run").read_text()
    values = dict(re.findall(r"^export (SIMCSE_TEST_MODEL|SIMCSE_SENTEVAL|SIMCSE_TEST_DATA)=(\S+)",
                             ci, re.M))
    assert len(values) == 3
    lines = [line for line in (ROOT / "README.md").read_text().splitlines()
             if "SIMCSE_TEST_MODEL=" in line]
    assert len(lines) == 1  # one copyable line, ../shared beside the checkout as in CI
    for var, value in values.items():
        assert f"{var}={value.replace('$SHARED', '../shared')} " in lines[0], var


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
    with pytest.raises(SystemExit):
        common.parse_args(simcsepp_min.Config, ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--off_dropout, --no_off_dropout negatives from a dropout-off pass" in out
    assert "(default: on)" in out
