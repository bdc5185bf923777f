"""What a learner's code and edits do to tests/tools/exercise.py [issue 62], each on a fresh copy of
the tree: a body that does not parse, loops, exits or interrupts is graded in one line, and so are
Ctrl-C and SIGTERM, which end its child too; `reset` gives the bytes back from a file that does not
parse, whose function was deleted, with CRLF line ends or comments after the last statement, and
keeps the learner's other edits; an exercise never started is not graded; a copy without git (a zip
download) works."""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import exercise
import mutate


@pytest.fixture
def tree(tmp_path):
    exercise.copy_tree(tmp_path)
    return tmp_path


def started(tree, name):
    code, out = exercise.tool(tree, "start", name)
    assert code == 0, out
    return tree / exercise.BY_NAME[name].file


def answer(path, *lines):
    """The learner's lines in place of the blank, as an editor writes them: they may not parse."""
    text = path.read_text()
    blank = re.search(r"^( *)raise NotImplementedError  # yours.*\n", text, re.M)
    path.write_text(text[:blank.start()] + "".join(f"{blank[1]}{x}\n" for x in lines)
                    + text[blank.end():])


def one_line(out):
    return len(out.strip().splitlines()) == 1 and "Traceback" not in out


def test_a_body_that_does_not_parse_is_named_in_one_line_and_reset_still_works(tree):
    before = (tree / "simcse_min.py").read_bytes()
    path = started(tree, "info-nce")
    answer(path, "logits = (h1 @ h2.T / temp", "return logits")
    line = path.read_text().splitlines().index("    logits = (h1 @ h2.T / temp") + 1
    code, out = exercise.tool(tree, "check", "info-nce")
    assert code == 1 and one_line(out) and f"simcse_min.py line {line}:" in out, out
    code, out = exercise.tool(tree, "reset", "info-nce")
    assert code == 0 and path.read_bytes() == before, out


def test_reset_leaves_a_broken_edit_to_another_function_as_it_is(tree):
    before = (tree / "simcse_min.py").read_text()
    path = started(tree, "info-nce")
    answer(path, "return (1 +")
    broken = ("ids.transpose(0, 1).flatten(0, 1),", "ids.transpose(0, 1.flatten(0, 1),")
    path.write_text(path.read_text().replace(*broken))  # make_views no longer parses either
    line = next(i for i, x in enumerate(path.read_text().splitlines(), 1) if broken[1] in x)
    code, out = exercise.tool(tree, "reset", "info-nce")
    assert code == 0 and path.read_text() == before.replace(*broken), out
    assert "info_nce is ours again" in out and f"simcse_min.py line {line}" in out, out


@pytest.mark.parametrize("name, qualname", [("info-nce", "info_nce"),
                                            ("attention", "Layer.forward")])
def test_reset_puts_back_a_deleted_function(tree, name, qualname):
    path = tree / exercise.BY_NAME[name].file
    before = path.read_bytes()
    started(tree, name)
    lines = path.read_text().splitlines(keepends=True)
    first, _, end = exercise.span("".join(lines), qualname)
    path.write_text("".join(lines[:first - 1] + lines[end:]))  # and the blank line above it
    code, out = exercise.tool(tree, "check", name)
    assert code == 1 and one_line(out) and f"no {qualname} in" in out, out
    code, out = exercise.tool(tree, "reset", name)
    assert code == 0 and path.read_bytes() == before, out


def test_reset_takes_comments_after_the_last_statement_and_keeps_other_edits(tree):
    before = (tree / "simcse_min.py").read_text()
    path = started(tree, "info-nce")
    answer(path, "return h1.sum()", "# after the last statement", "    # and deeper still")
    mine = ("def make_views(ids, mask):\n", "def make_views(ids, mask):  # mine\n")
    path.write_text(path.read_text().replace(*mine))
    code, out = exercise.tool(tree, "reset", "info-nce")
    assert code == 0 and path.read_text() == before.replace(*mine), out


def test_crlf_line_ends_stay_through_start_and_reset(tree):
    path = tree / "esimcse_min.py"
    crlf = path.read_bytes().replace(b"\n", b"\r\n")
    path.write_bytes(crlf)
    started(tree, "momentum")
    assert b"\n" not in path.read_bytes().replace(b"\r\n", b"")
    code, out = exercise.tool(tree, "reset", "momentum")
    assert code == 0 and path.read_bytes() == crlf, out


def test_reset_says_ours_again_only_when_the_bytes_are(tree, monkeypatch):
    monkeypatch.setattr(exercise, "ROOT", tree)
    exercise.start(exercise.BY_NAME["dcl"])
    monkeypatch.setattr(exercise, "put_back", lambda text, snapshot, qualname: text)
    with pytest.raises(SystemExit) as stop:
        exercise.reset(exercise.BY_NAME["dcl"])
    assert "could not be put back byte for byte" in str(stop.value)


def test_check_says_an_exercise_was_never_started(tree):
    code, out = exercise.tool(tree, "check", "momentum")
    assert code == 1 and one_line(out) and out.startswith("NOT STARTED momentum"), out
    before = (tree / "esimcse_min.py").read_bytes()
    started(tree, "momentum").write_bytes(before)  # ours back by hand, as `git checkout` does
    code, out = exercise.tool(tree, "check", "momentum")
    assert code == 1 and one_line(out) and out.startswith("NOT STARTED momentum"), out


def test_start_says_where_ours_can_still_be_seen(tree):
    code, out = exercise.tool(tree, "start", "info-nce")
    assert "`git diff simcse_min.py`" in out and "until check passes" in out, out
    assert "simcsepp_min.py, diffcse_min.py hold their own info_nce" in out, out


@pytest.mark.parametrize("stop, says", [("import sys; sys.exit(0)", "raised SystemExit"),
                                        ("raise KeyboardInterrupt", "raised KeyboardInterrupt"),
                                        ("import os; os._exit(0)", "ended the process")])
@pytest.mark.parametrize("rows", ["< 6", "== 6"])  # the oracle tests' inputs (4, 64), the probe's
def test_a_body_that_exits_or_interrupts_fails_in_one_line(tree, stop, says, rows):
    """On the oracle tests' inputs alone (a body that always stops takes this path too), or on the
    probe's alone, after the oracle tests ran through."""
    answer(started(tree, "dcl"), f"if len(h1) {rows}: {stop}", "return h1.sum()")
    code, out = exercise.tool(tree, "check", "dcl")
    assert code == 1 and one_line(out) and out.startswith("FAIL dcl") and says in out, out


@pytest.mark.parametrize("limit, sig, code, says", [
    ("5", None, 1, "did not return within 5 s"),
    ("300", signal.SIGINT, 130, "stopped by Ctrl-C"),  # as a terminal sends it: to the group
    ("300", signal.SIGTERM, 143, "stopped by SIGTERM")])  # as `kill PID` does: to check alone
def test_an_endless_loop_ends_check_and_its_child_in_one_line(tree, limit, sig, code, says):
    """At the time limit, on Ctrl-C, on SIGTERM: check ends the child that runs the loop."""
    assert exercise.LIMIT >= 4 * 70  # attention's pass: 70 s on two cores under five other jobs
    answer(started(tree, "dcl"), f"open({str(tree / 'looping')!r}, 'w').close()", "while True:",
           "    pass")
    cmd = [sys.executable, "tests/tools/exercise.py", "check", "dcl", "--timeout", limit]
    check = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    deadline = time.time() + 60
    while sig and not (tree / "looping").exists() and time.time() < deadline:
        time.sleep(0.1)  # until the oracle tests' child is in the loop
    assert not sig or (tree / "looping").exists(), "the body never ran: the signal would come early"
    if sig == signal.SIGINT:
        os.killpg(check.pid, sig)
    elif sig:
        check.send_signal(sig)
    try:
        out = check.communicate(timeout=120)[0]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the loop's process, if check left it
            os.killpg(check.pid, signal.SIGKILL)
            out = "check left the loop running"
    assert check.returncode == code and one_line(out) and says in out, out


def test_a_function_edited_before_start_is_still_graded(tree):
    path = tree / "simcse_min.py"
    edit = ("F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)  # [B, H] each",
            "F.normalize(h1, dim=1), F.normalize(h2, dim=1)  # [B, H] each")
    path.write_text(path.read_text().replace(*edit))  # simcse-normalise's line: not ours now
    answer(started(tree, "info-nce"), "h1, h2 = F.normalize(h1, dim=-1), F.normalize(h2, dim=-1)",
           "return F.cross_entropy(h1 @ h2.T / temp, torch.arange(len(h1)).flip(0))")
    code, out = exercise.tool(tree, "check", "info-nce")
    assert code == 1 and "known mistake, simcse-target" in out and "old text" not in out, out


def test_without_git_the_tree_copies_and_the_exercises_work(tmp_path, monkeypatch):
    """A zip download: no .git. Its runs/ is ignored as git would ignore it."""
    download, copy = tmp_path / "download", tmp_path / "copy"
    mutate.copy_tree(download)
    (download / "runs").mkdir()
    (download / "runs" / "log.txt").write_text("a run")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    monkeypatch.setattr(mutate, "ROOT", download)
    mutate.copy_tree(copy)
    files = [p.relative_to(download) for p in download.rglob("*") if p.is_file()]
    assert sorted(p.relative_to(copy) for p in copy.rglob("*") if p.is_file()) == sorted(
        p for p in files if p.parts[0] != "runs")
    code, out = exercise.tool(download, "reset", "dcl")
    assert code == 1 and one_line(out) and "never started" in out, out
    before = (download / "simcsepp_min.py").read_bytes()
    started(download, "dcl")
    code, out = exercise.tool(download, "check", "dcl")
    assert code == 1 and one_line(out) and "NotImplementedError" in out, out
    assert exercise.tool(download, "reset", "dcl")[0] == 0
    assert (download / "simcsepp_min.py").read_bytes() == before
