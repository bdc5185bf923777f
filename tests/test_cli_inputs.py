"""Training, `eval`, `analyze`, `encode` and `search` check every input before any work: the first
problem is one error line (exit status 2), the next one said once it is fixed, and nothing is
created when one is found; inputs are bounded (no FIFO waits forever, sentences cut as training
cuts them, names the file system cannot hold refused first) [issue 28, issue 52]. The oracle:
each input's written rule, and the folders left as they were."""
import os
import subprocess
import sys

import pytest

import common
import simcse_min
from conftest import ROOT, one_line
from tiny_world import make_model, make_senteval


def test_analyze_says_each_bad_input_in_one_line_and_creates_nothing(world, tmp_path, capsys):
    bad_run = tmp_path / "results.json"
    bad_run.write_text("{not json")
    out = tmp_path / "new" / "out"
    args = ["analyze", "--model", world["model"], "--compare", str(tmp_path / "missing"),
            "--runs", str(bad_run), "--senteval", world["senteval"], "--out", str(out),
            "--device", "cpu"]
    line = one_line(capsys, args)
    assert str(tmp_path / "missing") in line and "neither a folder nor a known name" in line
    line = one_line(capsys, [a for a in args if a not in ("--compare", str(tmp_path / "missing"))])
    assert f"--runs {bad_run}: a run's results.json" in line and "not valid JSON" in line
    assert not (tmp_path / "new").exists()


def test_analyze_reports_a_folder_without_vocab_and_an_incomplete_senteval(world, tmp_path, capsys):
    half = make_model(tmp_path / "half")
    (half / "vocab.txt").unlink()
    senteval = make_senteval(tmp_path / "senteval")
    (senteval / common.sts_files("dev")[0]).unlink()
    args = ["analyze", "--model", str(half), "--senteval", str(senteval), "--out",
            str(tmp_path / "out")]
    assert "--batch_size -3: must be at least 1" in one_line(capsys, args + ["--batch_size", "-3"])
    assert "has no vocab.txt" in one_line(capsys, args)
    args[2] = world["model"]
    assert "is incomplete" in one_line(capsys, args) and not (tmp_path / "out").exists()


def test_analyze_out_must_be_a_folder_that_can_be_made(world, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        line = one_line(capsys, ["analyze", "--model", world["model"], "--senteval",
                                 world["senteval"], "--out", str(out), "--device", "cpu"])
        assert f"--out {out}: cannot write a folder there" in line


@pytest.mark.parametrize("batch_size", ["0", "-1"])
def test_eval_refuses_a_batch_size_below_one(world, tmp_path, capsys, batch_size):
    line = one_line(capsys, ["eval", "--model", world["model"], "--senteval", world["senteval"],
                    "--batch_size", batch_size, "--device", "cpu"])
    assert f"--batch_size {batch_size}: must be at least 1" in line


def test_eval_json_that_is_a_folder_is_refused_before_the_evaluation(world, tmp_path, capsys):
    line = one_line(capsys, ["eval", "--model", world["model"], "--senteval", world["senteval"],
                    "--json", str(tmp_path), "--device", "cpu"])
    assert f"--json {tmp_path} is not a regular file" in line  # the one rule [issue 52]


def test_input_problems_stop_the_run_one_line_at_a_time_before_any_work(world, tmp_path, capsys):
    """The first problem found stops the run: one line naming it, exit 2, nothing created. Fixed,
    the next one is said [issue 28: fail at the point of use]."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "vocab.txt").write_text("[PAD]\n")  # a folder, but no config.json
    senteval = make_senteval(tmp_path / "senteval", n=2)
    (senteval / common.sts_files("test")[0]).unlink()  # incomplete
    flags = {"--lr": "0", "--data": str(tmp_path / "missing.txt"),
             "--model": str(tmp_path / "model"), "--senteval": str(senteval)}
    fixes = {"--lr": "1e-3", "--data": world["data"], "--model": world["model"]}
    out = tmp_path / "out"
    for flag, problem in [("--lr", "--lr 0"), ("--data", "missing.txt does not exist"),
                          ("--model", "has no config.json"), ("", "is incomplete")]:
        cfg = common.parse_args(simcse_min.Config, [x for kv in flags.items() for x in kv] + [
            "--out_dir", str(out), "--device", "cpu"])
        err = one_line(capsys, cfg, simcse_min.train)
        assert problem in err and not out.exists(), (problem, err)
        flags.update({flag: fixes[flag]} if flag else {})


def test_inputs_are_bounded_and_names_checked_first(world, tmp_path, capsys):
    world.pop("generator")
    os.mkfifo(tmp_path / "v.npy")  # search would wait on it forever
    (tmp_path / "c.txt").write_text("a man .\n" + "x" * 50_000 + "\n")
    argv = [sys.executable, "common.py", "search", "--model", world["model"], "--corpus",
            str(tmp_path / "c.txt"), "--vectors", str(tmp_path / "v.npy"), "--query", "a"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "not a regular file" in done.stderr
    lines = list(common.corpus_lines(tmp_path / "c.txt", "--input"))
    assert [len(s) for s in lines] == [7, common.MAX_SENTENCE_CHARS]  # as training cuts
    long = str(tmp_path / ("a" * 300))
    for argv in (["encode", "--model", world["model"], "--input", str(tmp_path / "c.txt"),
                  "--out", long + ".npy"], ["eval", "--model", long]):
        assert "bytes or not UTF-8" in one_line(capsys, argv + ["--device", "cpu"])
    bad = str(tmp_path / "run-\udcff")  # a byte that is not UTF-8, as Python holds it
    for flag in ("--out_dir", "--dev_file", "--data"):
        argv = [*sum(([f"--{k}", v] for k, v in world.items()), []), flag, bad]
        assert f"{flag} " in one_line(capsys, argv, lambda a: simcse_min.train(
            common.parse_args(simcse_min.Config, a)))
    assert not os.path.lexists(bad)
