"""A mutation check over the core: each mutant changes one line so that a reader would call the
result a different method (or a broken one); the suite must fail on every one. Stdlib only.

    python tests/tools/mutate.py                 # every mutant: its test files, then the whole
    suite if it lived
    python tests/tools/mutate.py clip shuffle    # the mutants named so
    python tests/tools/mutate.py --list

Each mutant is applied to a copy of the tree (the five top-level files and tests/), never to the
checkout; its own test files run first (-x), and a mutant they miss runs the whole suite before it
is called a survivor. A mutant whose old text does not occur exactly once is an error, and so is a
test file or test (file.py::name) it names that tests/ does not hold: the list cannot rot silently.
The data variables (SIMCSE_TEST_MODEL, ...) pass through: set them as .ci/run does, or the tests
that need them skip.
"""
import argparse
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]


def tests_not_found(m):
    """The test files (file.py) and tests (file.py::name) m names that tests/ does not hold."""
    gone = []
    for name in m.tests:
        file, _, test = name.partition("::")
        path = ROOT / "tests" / file
        if not path.is_file():
            gone.append(name)
        elif test and not re.search(rf"^def {re.escape(test)}\(", path.read_text(), re.M):
            gone.append(name)
    return gone


def check(mutants):
    """Every old text occurs exactly once in its file, and every test a mutant names exists: a
    moved line or a moved test is an error, not a silent pass (pytest's "not found" would count
    as a kill)."""
    bad = [f"{m.name}: {m.file} holds its old text {(ROOT / m.file).read_text().count(m.old)} times"
           for m in mutants if (ROOT / m.file).read_text().count(m.old) != 1]
    bad += [f"{m.name}: no test {', '.join(tests_not_found(m))} in tests/" for m in mutants
            if tests_not_found(m)]
    if bad:
        sys.exit("error: " + "; ".join(bad))


def copy_tree(dest):
    """The files git tracks or would track (not ignored): the checkout as a clone has it."""
    for name in listed_files():
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


def listed_files():
    """git's list of the tree's files, tracked or untracked but not ignored; without git (a zip
    download), every file but those .gitignore names."""
    try:
        done = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                              capture_output=True, text=True)
    except FileNotFoundError:
        done = None
    if done and done.returncode == 0:
        return done.stdout.splitlines()
    rules = [x.strip() for x in (ROOT / ".gitignore").read_text().splitlines()
             if x.strip() and not x.startswith("#")]
    listed = []
    for folder, subfolders, files in os.walk(ROOT):
        here = Path(folder).relative_to(ROOT)
        subfolders[:] = sorted(s for s in subfolders
                               if s != ".git" and not ignored(here / s, rules, True))
        listed += [(here / f).as_posix() for f in sorted(files)
                   if not ignored(here / f, rules, False)]
    return listed


def ignored(path, rules, is_folder):
    """Whether a .gitignore rule of the forms this project uses names path: 'runs/' a folder of
    that name anywhere, '*.pyc' a name anywhere, '/out/' or 'docs/analysis.json' from the root."""
    for rule in rules:
        if rule.endswith("/") and not is_folder:
            continue
        pattern = rule.strip("/")
        if "/" in rule.rstrip("/"):
            hit = fnmatch.fnmatchcase(path.as_posix(), pattern)
        else:
            hit = fnmatch.fnmatchcase(path.name, pattern)
        if hit:
            return True
    return False


def pytest(tree, files, timeout, mutant):
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", *files]
    # SIMCSE_MUTANT: the copy lacks this mutant's old text by design (test_the_suite.py reads it)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "SIMCSE_MUTANT": mutant}
    try:
        done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, "timed out"  # a mutant that hangs the suite is caught too
    lines = done.stdout.strip().splitlines() or [""]
    failed = [x.split()[1].removeprefix("tests/") for x in lines if x.startswith("FAILED ")]
    return done.returncode != 0, (f"{failed[0]} | " if failed else "") + lines[-1]


def run_mutant(m, timeout):
    """-> (name, killed, by what, seconds): the mutant's own files first, then the whole suite."""
    start = time.time()
    with tempfile.TemporaryDirectory(prefix=f"mutant-{m.name}-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        path = tree / m.file
        path.write_text(path.read_text().replace(m.old, m.new))
        killed, last = pytest(tree, [f"tests/{t}" for t in m.tests], timeout, m.name)
        where = ", ".join(m.tests)
        if not killed:
            killed, last = pytest(tree, ["tests"], 4 * timeout, m.name)
            where = "the whole suite"
    return m.name, killed, f"{where}: {last}", time.time() - start


def main():
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--jobs", type=int, default=2, help="mutants checked at once")
    parser.add_argument("--timeout", type=int, default=300, help="seconds for one mutant's own "
                                                                 "test files")
    args = parser.parse_args()
    unknown = set(args.names) - {m.name for m in MUTANTS}
    if unknown:
        sys.exit(f"error: no mutant named {', '.join(sorted(unknown))} (see --list)")
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    check(MUTANTS)
    if args.list:
        for m in chosen:
            print(f"{m.name:<24} {m.file:<16} {m.why}")
        return
    start, survived = time.time(), []
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, killed, detail, seconds in pool.map(lambda m: run_mutant(m, args.timeout),
                                                      chosen):
            print(f"{'killed  ' if killed else 'SURVIVED'} {name:<24} {seconds:5.0f} s  {detail}",
                  flush=True)
            survived += [] if killed else [name]
    print(f"{len(chosen)} mutants, {len(chosen) - len(survived)} killed, {len(survived)} survived"
          + (f" ({', '.join(survived)})" if survived else "") + f", in {time.time() - start:.0f} s")
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()
