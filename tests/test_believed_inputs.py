"""What training, eval and search believe of their inputs [issue 52]: the best step is never -inf
and a changed --dev_file or a typed flag on --resume is one line; inputs are bounded (no FIFO waits
forever, sentences cut as training cuts them, names the file system cannot hold refused first); no
traceback after the work; the --sts_file rules as docs/using-a-model.md writes them."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

import common
import simcse_min
from bad_inputs import unfinished_run
from tiny_world import make_world

ROOT = common.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = make_world(tmp_path_factory.mktemp("believed"))
    return {k: v for k, v in world.items() if k != "generator"}


def one_line(capsys, argv, main=common.cli):
    with pytest.raises(SystemExit) as e:
        common.main_guard(main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


def test_the_best_step_is_the_first_of_equal_or_undefined_scores():
    model, best = torch.nn.Linear(2, 2), dict(dev=-math.inf, step=0, state=None)
    for step, dev, kept in ((10, math.nan, 10), (20, math.nan, 10), (30, 50.0, 30),
                            (40, 50.0, 30), (50, 49.0, 30)):
        common.keep_best(best, step, dev, model)
        assert best["step"] == kept and best["state"] is not None and best["dev"] != -math.inf


def test_a_changed_dev_file_or_a_typed_flag_on_resume_is_one_line(world, tmp_path, capsys):
    pairs = tmp_path / "dev.tsv"
    pairs.write_text("a man runs .\ta person runs .\t4\na dog\ta cat\t1\nthe sun\ta car\t0\n")
    unfinished_run(tmp_path, world, "run", dev_file=str(pairs), test="none")  # a checkpoint
    cfg = common.parse_args(simcse_min.Config, ["--resume", str(tmp_path / "run"), "--test",
                                                "sts"])  # the default, typed: it contradicts
    with pytest.raises(common.UserError, match="--test sts contradicts the resumed run's none"):
        common.read_resumed_run(cfg, "simcse")
    pairs.write_text(pairs.read_text().replace("\t1\n", "\t2\n"))  # edited before --resume
    with pytest.raises(common.UserError, match="--dev_file .* changed since the run started"):
        simcse_min.train(simcse_min.Config(resume=str(tmp_path / "run"), device="cpu"))


def test_a_checkpoint_of_the_format_before_the_dev_files_hash_is_named_older(world, tmp_path):
    """A format-5 checkpoint (no dev_sha256) said 'the --dev_file  changed' of a run without one."""
    unfinished_run(tmp_path, world, "run")
    path = tmp_path / "run" / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["dev_sha256"]
    torch.save({**ckpt, "format": 5}, path)
    with pytest.raises(common.UserError, match=r"written by an older simcse-min \(format 5\)"):
        simcse_min.train(simcse_min.Config(resume=str(tmp_path / "run"), device="cpu"))


def test_inputs_are_bounded_and_names_checked_first(world, tmp_path, capsys):
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


def test_no_traceback_after_the_work(world, tmp_path):
    (tmp_path / "c.txt").write_text("a man .\na dog .\nthe sun .\n")
    (tmp_path / "q.txt").write_text("a query .\n" * 3000)  # more than a pipe holds
    search = (f"{sys.executable} common.py search --model {world['model']} --corpus "
              f"{tmp_path / 'c.txt'} --queries {tmp_path / 'q.txt'} --json --device cpu")
    done = subprocess.run(["bash", "-c", f"{search} | head -n 1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(done.stdout)["rank"] == 1 and done.stderr == ""
    for name in ("details", "seconds", "transfer", "sentences_encoded"):  # the table's own keys
        (tmp_path / name).write_text("a man\ta person\t4\na dog\ta cat\t1\nthe sun\ta car\t0\n")
        results = common.main_guard(common.cli, [
            "eval", "--model", world["model"], "--sts_file", str(tmp_path / name), "--device",
            "cpu", "--json", str(tmp_path / "r.json")])
        assert results["details"]["sts_file"]["test"]["n"] == 3


@pytest.mark.parametrize("text, why", [
    ("a\tb\t1e309\nc\td\t2\n", "line 1"), ("a\tb\t4,8\nc\td\t2\ne\tf\t3\n", "line 1"),
    ("s1\ts2\tscore\na\tb\t3\nc\td\t3\n", "every pair scores 3"),
    ("a\tb\t1\nc\td\tnan\n", "line 2"), ("a\tb\t1\nc\td\tinf\n", "line 2")])
def test_sts_file_rows(text, why, tmp_path):
    (tmp_path / "p.tsv").write_text(text)
    with pytest.raises(common.UserError, match=why):
        common.read_sts_pairs(tmp_path / "p.tsv", "--sts_file")


def test_a_header_and_line_separators_inside_a_sentence(tmp_path):
    (tmp_path / "p.tsv").write_text("s1\ts2\tscore\na\u2028b\tc\x85d\t1\ne\tf\t2\n")
    a, b, gold = common.read_sts_pairs(tmp_path / "p.tsv", "--sts_file")
    assert len(a) == 2 and list(gold) == [1.0, 2.0]  # two pairs, a header: nothing split


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
