"""The suite itself [issue 55]: the tests never touch the checkout's runs/ or the user's cache (a
live run there is left alone, checked by running a test in a clone under a home of its own), the
README's test line gives the variables' values as CI sets them, and docs/testing.md's table names
every test file, each once, and no other. The oracles: the clone's and the home's files before
and after, .ci/run, and the files in tests/."""
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import common
import conftest
import simcse_min
from conftest import ROOT


def default_out_dir(world):
    """Where a Run with the default --out_dir puts its folder (it takes its lock: a live run's
    there refuses it)."""
    paths = {k: world[k] for k in ("model", "data", "senteval")}
    run = common.Run(simcse_min.Config(**paths, device="cpu"), simcse_min.__file__)
    run.release()
    return run.out.absolute()


@pytest.fixture(scope="module")
def module_out_dir(tiny_world):  # as test_ddp.py's two processes: before any test's folder
    return default_out_dir(tiny_world)


def test_a_test_runs_away_from_the_checkout_and_the_user_cache(world, module_out_dir):
    assert Path.cwd() != ROOT and ROOT not in Path.cwd().parents  # before: the checkout itself
    assert common.CACHE != Path.home() / ".cache" / "simcse-min"
    assert default_out_dir(world) == Path.cwd() / "runs" / "simcse"
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
                               "tests/test_the_suite.py::"
                               "test_a_test_runs_away_from_the_checkout_and_the_user_cache"],
                              cwd=clone, env=env, capture_output=True, text=True, timeout=300)
    finally:
        os.close(fd)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]  # not skipped
    assert (snapshot(clone / "runs"), snapshot(home)) == before


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


def test_the_testing_doc_names_every_test_file_once():
    """docs/testing.md's table of subjects: every tests/**/test_*.py in one row, and each row a file
    that exists, so the table cannot go stale."""
    text = (ROOT / "docs" / "testing.md").read_text()
    table = text.split("## Where each subject is tested")[1].split("\n## ")[0]
    named = re.findall(r"^\| [^|]+ \| \[`[^`]+`\]\(\.\./tests/(\S+?)\) \| [^|]+ \|$", table, re.M)
    files = {p.relative_to(ROOT / "tests").as_posix() for p in (ROOT / "tests").rglob("test_*.py")}
    assert not set(named) - files, f"named but not in tests/: {sorted(set(named) - files)}"
    assert not files - set(named), f"test files the table leaves out: {sorted(files - set(named))}"
    assert len(named) == len(set(named)), "a file named twice"


def test_every_test_a_mutant_names_exists():
    """tests/tools/mutate.py refuses a mutant that names a test file or a test tests/ does not hold
    (pytest's "not found" fails, which the check would count as a kill); the list holds none."""
    from mutants import MUTANTS, Mutant
    from mutate import check
    # in mutate.py's copy a mutant's old text is gone by design (and, with it, its neighbours'):
    # there the list is not read, else every mutant the whole suite runs for would be "killed";
    # mutate.py checks it on the checkout before any mutant
    if not os.environ.get("SIMCSE_MUTANT"):
        check(MUTANTS)
    for gone in ("test_gone.py", "test_flags.py::test_gone"):
        with pytest.raises(SystemExit, match=gone):
            check([Mutant("x", "common.py", "def upcast(x):", "", "", [gone])])


def test_a_pytest_a_test_starts_and_kills_leaves_its_folders_in_the_sessions(tmp_path):
    """A pytest that a test starts (exercise.py check does) and that ends mid-test, its teardown
    never run: its cache and pytest's folders lie inside this session's conftest.TEMP, which goes
    at exit, and none in the temporary folder itself (pytest's default, /tmp/pytest-of-<user>)."""
    (tmp_path / "test_ended.py").write_text("import os\n\n\ndef test_ended(tmp_path):\n"
                                            "    os._exit(0)\n")
    top = Path(tempfile.gettempdir())
    before = set(top.glob("pytest-of-*")), set(conftest.TEMP.iterdir())
    env = {**os.environ, "PYTHONPATH": str(ROOT / "tests")}  # conftest.py as a plugin, -p
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest", "-p",
                    "no:cacheprovider", "test_ended.py"], cwd=tmp_path, env=env, timeout=120)
    assert set(top.glob("pytest-of-*")) == before[0]
    child = [p for p in conftest.TEMP.iterdir() if p not in before[1]]
    assert [p.name[:13] for p in child] == ["simcse-tests-"], child
    assert {p.name for p in child[0].iterdir()} == {"cache", "pytest"}
