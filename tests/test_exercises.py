"""The exercises of tests/tools/exercise.py [issue 56], on a copy of the tree (never the checkout):
`start` blanks each function under its docstring and `check` then fails; `reset` gives the file
back byte for byte; on the same inputs every known mistake of a function is told apart from ours
and from the others, so `check` names it with its why; one exercise end to end through the
command line, the oracle tests included. The whole check, every mutant through the oracle tests
as well, is `python tests/tools/exercise.py selftest` (minutes: too slow for the suite)."""
import ast
import os
import shutil
import subprocess
import sys

import pytest

import exercise
from conftest import ROOT
from mutants import MUTANTS


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    dest = tmp_path_factory.mktemp("learner")
    exercise.copy_tree(dest)
    return dest


def test_ten_exercises_or_more_each_with_its_equation_tests_and_mistakes():
    assert len(exercise.EXERCISES) >= 10
    for ex in exercise.EXERCISES:
        assert ex.equation and ex.read and ex.tests and ex.mutants, ex.name
        for test in ex.tests:
            file, name = test.split("::")
            assert f"def {name.split('[')[0]}(" in (ROOT / "tests" / file).read_text(), test
        assert {m.name for m in MUTANTS if m.name in ex.mutants} == set(ex.mutants), ex.name


def test_every_mutant_inside_an_exercise_belongs_to_one_on_that_function():
    """A mistake added to mutants.py later inside an exercise's function is graded too."""
    listed = {m for ex in exercise.EXERCISES for m in ex.mutants}
    for ex in exercise.EXERCISES:
        text = (ROOT / ex.file).read_text(encoding="utf-8")
        bodies = [exercise.function_text(text, q) for q in ex.functions]
        inside = {m.name for m in MUTANTS if m.file == ex.file and any(m.old in b for b in bodies)}
        assert inside <= listed, (ex.name, inside - listed)


@pytest.mark.parametrize("name", [ex.name for ex in exercise.EXERCISES])
def test_start_blanks_under_the_docstring_and_reset_gives_the_bytes_back(tree, name, monkeypatch):
    ex = exercise.BY_NAME[name]
    monkeypatch.setattr(exercise, "ROOT", tree)
    path = tree / ex.file
    before = path.read_bytes()
    exercise.start(ex)
    text = path.read_text(encoding="utf-8")
    ast.parse(text)  # the learner's file still imports
    for q in ex.functions:
        assert exercise.is_blank(text, q)
        node = exercise.function_node(ast.parse(before.decode()), q)
        doc = ast.get_docstring(node)
        assert doc is None or ast.get_docstring(exercise.function_node(ast.parse(text), q)) == doc
    assert not exercise.check(ex)  # blank: fails at once, no test run
    exercise.start(ex)  # again: the blank is kept, our body is not saved over
    exercise.reset(ex)
    assert path.read_bytes() == before
    assert not any(exercise.store(ex.file, q, tree).exists() for q in ex.functions)


@pytest.mark.skipif(not shutil.which("git"), reason="no git here: ours is the last commit's")
def test_reset_without_start_puts_the_last_commits_body_back(tree, monkeypatch):
    """A learner who edits the function in place, never `start`: ours is the last commit's."""
    monkeypatch.setattr(exercise, "ROOT", tree)
    path, ex = tree / "simcse_min.py", exercise.BY_NAME["make-views"]
    before = path.read_bytes()
    path.write_text(before.decode().replace("ids.transpose(0, 1).flatten(0, 1), mask", "ids, mask"))
    exercise.reset(ex)
    assert path.read_bytes() == before


def test_blank_keeps_shape_comments_naming_what_each_line_assigns():
    text = (ROOT / "simcse_min.py").read_text(encoding="utf-8")
    body = exercise.function_text(exercise.blanked(text, "info_nce", "info-nce"), "info_nce")
    assert "    # h1, h2: [B, H] each\n    # logits: [B, B]\n" in body
    assert body.rstrip().endswith("check info-nce") and "F.normalize" not in body


@pytest.mark.parametrize("name", [ex.name for ex in exercise.EXERCISES])
def test_each_known_mistake_is_told_apart_on_the_same_inputs(name):
    """On the probe's inputs ours matches no mutant and each mutant matches itself first."""
    ex = exercise.BY_NAME[name]
    text = (ROOT / ex.file).read_text(encoding="utf-8")
    mutants, skipped = exercise.mutants_of(ex, text, {q: exercise.function_text(text, q)
                                                      for q in ex.functions})
    assert len(mutants) == len(ex.mutants) and not skipped
    ours = exercise.probe(ex, text)
    probes = [exercise.probe(ex, t) for _, t in mutants]  # what check compares yours with
    tol = exercise.TOLERANCE.get(name, 1e-6)
    for i, (m, _) in enumerate(mutants):
        assert not isinstance(probes[i], BaseException), (m.name, probes[i])
        assert not exercise.same(ours, probes[i], tol), f"{m.name} gives what ours gives"
        assert exercise.same(probes[i], probes[i], tol)
        earlier = [n.name for (n, _), p in zip(mutants[:i], probes) if exercise.same(p, probes[i],
                                                                                      tol)]
        assert not earlier, f"{m.name} would be named {earlier[0]}"


def cli(tree, *args):
    cmd = [sys.executable, "tests/tools/exercise.py", *args]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return done.returncode, done.stdout + done.stderr


def test_one_exercise_end_to_end_through_the_oracle_tests(tree):
    """info-nce as a learner meets it: blank, one wrong answer named with its why, then ours as
    the answer passes; after reset, nothing is left to grade."""
    path = tree / "simcse_min.py"
    before = path.read_bytes()
    assert cli(tree, "start", "info-nce")[0] == 0
    assert "check info-nce" in cli(tree, "start", "info-nce")[1]
    code, out = cli(tree, "check", "info-nce")
    assert code == 1 and "NotImplementedError" in out
    wrong = next(m for m in MUTANTS if m.name == "simcse-direction")
    text = path.read_text(encoding="utf-8")
    ours = exercise.function_text(before.decode(), "info_nce").replace(wrong.old, wrong.new)
    path.write_text(exercise.with_function(text, "info_nce", ours), encoding="utf-8")
    code, out = cli(tree, "check", "info-nce")
    assert code == 1 and f"simcse-direction: {wrong.why}" in out, out
    text = path.read_text(encoding="utf-8")
    mine = ours.replace(wrong.new, wrong.old).rstrip("\n") + "  # mine\n"  # not ours byte for byte
    path.write_text(exercise.with_function(text, "info_nce", mine))
    code, out = cli(tree, "check", "info-nce")
    assert code == 0 and out.startswith("PASS info-nce"), out
    assert cli(tree, "reset", "info-nce")[0] == 0 and path.read_bytes() == before
    assert cli(tree, "check", "info-nce")[1].startswith("NOT STARTED info-nce")
    if shutil.which("git"):  # nothing left to see: .exercises/ is ignored, and empty
        listed = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=tree,
                                capture_output=True, text=True).stdout
        assert not listed.strip(), listed


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_start_into_a_pipe_its_reader_closed_ends_quietly(tree, unbuffered):
    """`start momentum | head -n 1`: head is gone before the rest is written. As common.main_guard
    does: no traceback, exit 1, and the exercise started all the same, both its functions. With
    Python's default buffering the error comes at the last flush; unbuffered, at the first
    print."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    done = subprocess.run([sys.executable, "tests/tools/exercise.py", "start", "momentum"],
                          cwd=tree, stdout=write_end, stderr=subprocess.PIPE, text=True, env=env)
    os.close(write_end)
    started = [exercise.store("esimcse_min.py", q, tree).is_file()
               for q in exercise.BY_NAME["momentum"].functions]
    assert cli(tree, "reset", "momentum")[0] == 0
    assert done.returncode == 1 and not done.stderr and all(started), (done.stderr, started)
