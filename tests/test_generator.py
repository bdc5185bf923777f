"""DiffCSE's generator: tests/tools/make_generator.py explains itself, fails in one line and takes a
model that carries a pooler; offline, the way out names it; a generator that replaces more than is
masked (a weak one, as a random MLM head) is named once in the run's log, and make_generator.py
says when its head is poor. The oracle: the replaced fraction against --mask_ratio [issue 55]."""
import random
import types

import pytest
import torch

import common
import diffcse_min
import simcse_min
from conftest import help_text
from tiny_world import seeded_run_folder, sentence


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


def log_of(cfg, stats):
    lines = []
    common.check_generator(types.SimpleNamespace(cfg=cfg, log=lines.append), stats)
    return lines


def test_a_generator_that_replaces_more_than_is_masked_is_named_once():
    cfg = diffcse_min.Config()  # --mask_ratio 0.3
    assert log_of(cfg, {"replaced": torch.tensor(0.25)}) == []  # 300 steps of make_generator.py
    warned = log_of(cfg, {"replaced": torch.tensor(0.70)})  # 20 steps: it rewrites what it sees
    assert warned == ["warning: the generator replaced 0.70 of the real tokens, more than the 0.3 "
                      "masked: a weak one (tests/tools/make_generator.py: train it longer)"]
    assert log_of(simcse_min.Config(), {"loss": torch.tensor(0.1)}) == []  # no generator


def test_a_diffcse_run_with_a_random_generator_warns_in_its_log(world, tmp_path):
    # the tiny world's generator: a tiny BERT with a random MLM head
    diffcse_min.train(diffcse_min.Config(**world, device="cpu", batch_size=8, max_steps=2,
                                         eval_every=2, test="none", out_dir=str(tmp_path / "run")))
    log = (tmp_path / "run" / "log.txt").read_text()
    assert log.count("warning: the generator replaced") == 1  # before: nothing


def test_make_generator_says_when_its_head_is_poor(world, tmp_path, capsys):
    from make_generator import main
    rng = random.Random(0)
    data = tmp_path / "lines.txt"
    data.write_text("".join(sentence(rng) + "\n" for _ in range(60)))
    main(["--model", world["model"], "--data", str(data), "--out", str(tmp_path / "g"),
          "--steps", "1", "--held_out", "20", "--batch_size", "8"])
    assert "warning: only " in capsys.readouterr().out  # one step: a poor head
