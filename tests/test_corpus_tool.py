"""The tools a user runs (tests/tools/: make_corpus.py, make_generator.py, exercise.py; and
bench/bench_scale.py, bench/gpu_scale.py) [issue 63]: an existing file or model is replaced only
with --overwrite, an input never; a mistake is one line and exit status 2, never a traceback."""
import sys

import pytest

import bench_scale
import exercise
import gpu_scale
import make_corpus
import make_generator
from tiny_world import make_model


def run_tool(module, args, capsys, monkeypatch):
    """module.main() with `args` on its command line -> (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", [module.__file__, *args])
    try:
        module.main()
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def refused(module, args, capsys, monkeypatch, says):
    """The tool exits 2 with one line holding `says`."""
    code, err = run_tool(module, args, capsys, monkeypatch)
    assert code == 2 and err.count("\n") == 1 and says in err, (code, err)


def folder_bytes(folder):
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_an_existing_corpus_is_replaced_only_with_overwrite(wiki_path, tmp_path, capsys,
                                                           monkeypatch):
    out = tmp_path / "thesis.txt"
    out.write_text("my thesis\n")
    (tmp_path / "thesis.txt.tmp").write_text("my notes\n")  # a name the tool once used
    args = ["--out", str(out), "--head", str(wiki_path), "--lines", "50"]
    refused(make_corpus, args, capsys, monkeypatch, "pass --overwrite")
    assert out.read_text() == "my thesis\n"
    assert run_tool(make_corpus, [*args, "--overwrite"], capsys, monkeypatch)[0] == 0
    assert len(out.read_text().splitlines()) == 50
    assert (tmp_path / "thesis.txt.tmp").read_text() == "my notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.txt", "thesis.txt.tmp"]


def test_an_input_is_never_an_output(wiki_path, model_dir, tmp_path, capsys, monkeypatch):
    head = tmp_path / "head.txt"
    head.write_bytes(wiki_path.read_bytes())
    refused(make_corpus, ["--out", str(head), "--head", str(head), "--lines", "5", "--overwrite"],
            capsys, monkeypatch, "is an input")
    assert head.read_bytes() == wiki_path.read_bytes()
    vocab = tmp_path / "m" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_bytes((model_dir / "vocab.txt").read_bytes())
    refused(make_corpus, ["--model_out", str(vocab.parent), "--vocab", str(vocab),
                          "--overwrite"], capsys, monkeypatch, "is an input")
    assert sorted(p.name for p in vocab.parent.iterdir()) == ["vocab.txt"]


def test_a_trained_model_is_not_replaced_by_random_weights(model_dir, tmp_path, capsys,
                                                          monkeypatch):
    trained = make_model(tmp_path / "trained")
    before = folder_bytes(trained)
    for flag in ("--model_out", "--generator_out"):
        refused(make_corpus, [flag, str(trained), "--vocab", str(model_dir / "vocab.txt")],
                capsys, monkeypatch, "pass --overwrite")
    refused(make_corpus, ["--model_out", str(tmp_path / "new"), "--generator_out",
                          str(tmp_path / "new"), "--vocab", str(model_dir / "vocab.txt")],
            capsys, monkeypatch, "both write")
    refused(make_generator, ["--model", str(model_dir), "--data", str(model_dir / "vocab.txt"),
                             "--out", str(trained)], capsys, monkeypatch, "pass --overwrite")
    refused(make_generator, ["--model", str(trained), "--data", str(model_dir / "vocab.txt"),
                             "--out", str(trained), "--overwrite"], capsys, monkeypatch,
            "is an input")
    assert folder_bytes(trained) == before and not (tmp_path / "new").exists()


@pytest.mark.parametrize("args, says", [
    (["--lines", "-5"], "--lines -5: must be at least 1"),
    (["--head", "nowhere.txt"], "--head nowhere.txt does not exist"),
    (["--head", "FOUR"], "--head holds 4 words"),
    (["--lines", "x"], "invalid int value"),
    (["--out", "FILE/inside.txt"], "is not a writable folder"),
])
def test_a_mistake_with_make_corpus_is_one_line(args, says, tmp_path, capsys, monkeypatch):
    (tmp_path / "four.txt").write_text("one two three four\n")
    (tmp_path / "file").write_text("x")
    # a head of 2,000 words, not the default beside the checkout: mutate.py runs this in a copy
    (tmp_path / "head.txt").write_text(" ".join(f"w{i}" for i in range(2000)) + "\n")
    names = {"FOUR": str(tmp_path / "four.txt"), "FILE": str(tmp_path / "file")}
    args = [names.get(a, a.replace("FILE", str(tmp_path / "file"))) for a in args]
    head = [] if "--head" in args else ["--head", str(tmp_path / "head.txt")]
    refused(make_corpus, ["--out", str(tmp_path / "out.txt"), *head, *args], capsys, monkeypatch,
            says)
    assert not (tmp_path / "out.txt").exists()


@pytest.mark.parametrize("module, args, says", [
    (bench_scale, ["--scale", "abc"], "'abc' is not line counts"),
    (bench_scale, [], "--data is required"),
    (gpu_scale, ["--data", "DATA", "--model", "MODEL", "--extra", '"--lr 1'],
     "No closing quotation"),
    (gpu_scale, ["--data", "DATA", "--model", "MODEL", "--extra", "--out_dir /tmp/x"],
     "--out_dir is set by gpu_scale.py itself"),
    (gpu_scale, ["--data", "DATA", "--model", "MODEL", "--out_dir", "x"], "unknown flag"),
    (gpu_scale, ["--data", "nowhere.txt", "--model", "MODEL"], "does not exist"),
    (exercise, ["nope"], "invalid choice: 'nope'"),
])
def test_a_mistake_with_a_benchmark_or_exercise_is_one_line(module, args, says, wiki_path,
                                                            model_dir, capsys, monkeypatch):
    args = [{"DATA": str(wiki_path), "MODEL": str(model_dir)}.get(a, a) for a in args]
    refused(module, args, capsys, monkeypatch, says)
