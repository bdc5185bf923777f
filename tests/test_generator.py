"""The first fifteen minutes, second pass: a progress line while anything long runs (evaluations,
tokenization),
--help in groups with every default meaningful and switches shown bare, hints that name only flags
and commands
that exist where they are printed, the DiffCSE generator's way out offline, one note for unused
tensors."""
import importlib
import io
import re
import sys

import pytest

import common
from tiny_world import make_model, make_senteval, seeded_run_folder, tokenizer

ROOT = common.Path(common.__file__).parent
METHODS = ["simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py"]


# --- progress -------------------------------------------------------------------------------------

def test_eval_shows_progress_lines_in_a_log(tmp_path, monkeypatch, capsys):
    """Not a terminal: a line every PROGRESS_EVERY seconds (0 here) with done/total, elapsed and the
    ETA."""
    monkeypatch.setattr(common, "PROGRESS_EVERY", 0.0)
    model, senteval = make_model(tmp_path / "m"), make_senteval(tmp_path / "senteval", n=40)
    common.cli(["eval", "--model", str(model), "--senteval", str(senteval), "--device", "cpu",
                "--batch_size", "16"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("STS test: ")]
    total = int(re.search(r"/([\d,]+) sentences encoded", lines[0])[1].replace(",", ""))
    assert len(lines) >= 3 and total > 16, lines
    assert re.fullmatch(r"STS test: 16/[\d,]+ sentences encoded \| \d+ s \| eta \d+ s",
                        lines[0]), lines[0]
    assert lines[-1].endswith("| done") and f"{total:,}/{total:,}" in lines[-1]


def test_a_short_evaluation_in_a_log_says_nothing(tmp_path, capsys):
    """Below PROGRESS_EVERY seconds nothing is printed: the dev evaluations of a training log stay
    one line each."""
    progress = common.Progress("STS-B dev")
    for done in (10, 20, 30):
        progress(done, 30)
    assert capsys.readouterr().err == ""


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_line_is_updated_in_place_then_erased(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    clock = iter([0.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(common.time, "time", lambda: next(clock))
    progress = common.Progress("STS test")
    progress(5, 10), progress(10, 10)
    assert (
        term.getvalue() == "\rSTS test: 5/10 sentences encoded | 1 s | eta 1 s\033[K" + "\r\033[K"
    )


# --- --help ---------------------------------------------------------------------------------------

def help_text(capsys, entry, *argv):
    with pytest.raises(SystemExit) as e:
        entry(*argv)
    assert e.value.code == 0
    return capsys.readouterr().out


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


def test_the_generator_script_explains_itself_and_fails_in_one_line(tmp_path, capsys):
    from make_generator import main
    out = help_text(capsys, main, ["--help"])
    assert "(default: 300)" in out and "--steps" in out and "../shared" not in out
    assert "FROZEN pretrained BERT encoder." in " ".join(out.split())  # the description, whole
    data = tmp_path / "data.txt"
    data.write_text("a sentence .\n" * 2000)
    with pytest.raises(SystemExit) as e:
        main(["--model", str(tmp_path / "no-model"), "--data", str(data), "--out",
              str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err


def test_the_generator_takes_a_model_that_carries_a_pooler(tmp_path):
    from make_generator import with_mlm_head
    _, encoder = seeded_run_folder(tmp_path / "run")  # pooler.dense.*, as all-MiniLM-L6-v2 has
    model = with_mlm_head(encoder)  # before: an AssertionError naming the pooler's tensors
    assert model.pooler is None and model.mlm is not None


# --- hints ----------------------------------------------------------------------------------------

def training_flags():
    return {f.name for m in METHODS for f in common.dataclasses.fields(
        importlib.import_module(m.removesuffix(".py")).Config)}


def test_every_flag_a_message_names_exists():
    """Every --flag in a string of the five files is a training flag, an eval/analyze flag, or
    --help."""
    cli_flags = {"model", "pooler", "senteval", "batch_size", "device", "mode", "tasks", "json",
                 "compare", "runs", "out", "help", "sts_file", "input", "corpus", "vectors",
                 "query", "queries", "top_k"}
    for name in ["common.py", *METHODS]:
        text = (ROOT / name).read_text()
        strings = re.findall(r"\"[^\"\n]*\"", text)
        named = {m for s in strings for m in re.findall(r"(?<![\w-])--([a-z][a-z_]*)", s)}
        named -= {"no_"}  # a switch's off form, --no_ + its name (parse_args) [issue 55]
        assert named <= training_flags() | cli_flags | {"name"}, (name, named - training_flags()
                                                                  - cli_flags)


@pytest.mark.parametrize("what", ["wiki1m_for_simcse.txt", "senteval", "bert-base-uncased"])
def test_download_offline_names_no_flag_it_does_not_have(what, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(common, "CACHE", tmp_path / "c")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(common.UserError) as e:
        common.cli(["download", what])
    err = str(e.value)
    assert "offline" in err and not re.search(r"\s--[a-z]",
                                              err) and f"put it at {tmp_path / 'c'}" in err, err


def test_the_generator_offline_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(common.UserError) as e:
        common.resolve_model("distilbert-base-uncased", "--generator")
    assert "pass its path with --generator" in str(e.value)
    assert "tests/tools/make_generator.py" in str(e.value)
    with pytest.raises(common.UserError, match="tests/tools/make_generator.py"):
        common.check_model("no-such-generator", "--generator")


# --- noise ----------------------------------------------------------------------------------------

def test_unused_pretraining_heads_are_noted_once_with_the_reason(tmp_path, capsys):
    """DiffCSE loads its model twice (encoder and discriminator): BERT's NSP head is noted once, and
    why (its pooler is loaded: --pooler cls)."""
    import torch
    folder = make_model(tmp_path / "m")
    tensors = common.read_safetensors(folder / "model.safetensors")
    tensors |= {"cls.seq_relationship.weight": torch.zeros(2, 32),
                "cls.seq_relationship.bias": torch.zeros(2)}
    common.write_safetensors(folder / "model.safetensors", tensors)
    common.Bert.from_pretrained(folder), common.Bert.from_pretrained(folder)
    err = [x for x in capsys.readouterr().err.splitlines() if "not used from the checkpoint" in x]
    assert len(err) == 1 and "pretraining heads" in err[0], err
    assert "seq_relationship.bias" in err[0], err


def test_analysis_output_is_ignored_by_git():
    assert "analysis/" in (ROOT / ".gitignore").read_text().split()
