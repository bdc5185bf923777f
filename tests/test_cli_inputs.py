"""`common.py eval` and `analyze` check every input before any work: the first problem is one error
line (exit status 2), and nothing is created when one is found."""
import pytest

import common
from tiny_world import make_model, make_senteval, make_world


def refused(args, capsys):
    """Run the command line as `python common.py` does -> its one stderr line (exit status 2)."""
    with pytest.raises(SystemExit) as e:
        common.main_guard(common.cli, args)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("world"))


def test_analyze_says_each_bad_input_in_one_line_and_creates_nothing(world, tmp_path, capsys):
    bad_run = tmp_path / "results.json"
    bad_run.write_text("{not json")
    out = tmp_path / "new" / "out"
    args = ["analyze", "--model", world["model"], "--compare", str(tmp_path / "missing"),
            "--runs", str(bad_run), "--senteval", world["senteval"], "--out", str(out),
            "--device", "cpu"]
    line = refused(args, capsys)
    assert str(tmp_path / "missing") in line and "neither a folder nor a known name" in line
    line = refused([a for a in args if a not in ("--compare", str(tmp_path / "missing"))], capsys)
    assert f"--runs {bad_run}: a run's results.json" in line and "not valid JSON" in line
    assert not (tmp_path / "new").exists()


def test_analyze_reports_a_folder_without_vocab_and_an_incomplete_senteval(world, tmp_path, capsys):
    half = make_model(tmp_path / "half")
    (half / "vocab.txt").unlink()
    senteval = make_senteval(tmp_path / "senteval")
    (senteval / common.sts_files("dev")[0]).unlink()
    args = ["analyze", "--model", str(half), "--senteval", str(senteval), "--out",
            str(tmp_path / "out")]
    assert "--batch_size -3: must be at least 1" in refused(args + ["--batch_size", "-3"], capsys)
    assert "has no vocab.txt" in refused(args, capsys)
    args[2] = world["model"]
    assert "is incomplete" in refused(args, capsys) and not (tmp_path / "out").exists()


def test_analyze_out_must_be_a_folder_that_can_be_made(world, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    for out in (tmp_path / "file", tmp_path / "file" / "sub"):
        line = refused(["analyze", "--model", world["model"], "--senteval", world["senteval"],
                        "--out", str(out), "--device", "cpu"], capsys)
        assert f"--out {out}: cannot write a folder there" in line


@pytest.mark.parametrize("batch_size", ["0", "-1"])
def test_eval_refuses_a_batch_size_below_one(world, tmp_path, capsys, batch_size):
    line = refused(["eval", "--model", world["model"], "--senteval", world["senteval"],
                    "--batch_size", batch_size, "--device", "cpu"], capsys)
    assert f"--batch_size {batch_size}: must be at least 1" in line


def test_eval_json_that_is_a_folder_is_refused_before_the_evaluation(world, tmp_path, capsys):
    line = refused(["eval", "--model", world["model"], "--senteval", world["senteval"],
                    "--json", str(tmp_path), "--device", "cpu"], capsys)
    assert f"--json {tmp_path} is not a regular file" in line  # the one rule [issue 52]
