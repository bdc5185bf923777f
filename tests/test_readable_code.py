"""What a newcomer could not follow [issue 55]: why chunked and unchunked runs differ, a weak
DiffCSE generator taken silently, tags that point nowhere, and Part 1's hardest lines (a shape
comment, a bool added to an int, a regex range that reads as a string, batches that were
generators, GradientCache.backward's order, a positional cls_only)."""
import ast
import inspect
import random
import re
import types

import pytest
import torch

import common
import diffcse_min
import simcse_min
from conftest import ROOT
from tiny_world import make_world, sentence, tokenizer

FILES = ["common.py", "simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py"]


def test_chunk_size_says_its_step_is_exact_for_the_masks_drawn(capsys):
    with pytest.raises(SystemExit):
        common.parse_args(simcse_min.Config, ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "the whole batch's step, other dropout masks" in out
    doc = " ".join((ROOT / "docs" / "large-batches.md").read_text().split())
    assert "exact step, for the dropout masks drawn" in doc and "same distribution" in doc
    speed = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert "3.3x the unchunked one" in speed and "3.3x the unchunked step" in doc


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


def test_a_diffcse_run_with_a_random_generator_warns_in_its_log(tmp_path):
    world = make_world(tmp_path)  # the generator: a tiny BERT with a random MLM head
    diffcse_min.train(diffcse_min.Config(**world, device="cpu", batch_size=8, max_steps=2,
                                         eval_every=2, test="none", out_dir=str(tmp_path / "run")))
    log = (tmp_path / "run" / "log.txt").read_text()
    assert log.count("warning: the generator replaced") == 1  # before: nothing


def test_make_generator_says_when_its_head_is_poor(tmp_path, capsys):
    from make_generator import main
    world = make_world(tmp_path)
    rng = random.Random(0)
    data = tmp_path / "lines.txt"
    data.write_text("".join(sentence(rng) + "\n" for _ in range(60)))
    main(["--model", world["model"], "--data", str(data), "--out", str(tmp_path / "g"),
          "--steps", "1", "--held_out", "20", "--batch_size", "8"])
    assert "warning: only " in capsys.readouterr().out  # one step: a poor head


def test_every_tag_points_to_something_the_reader_has():
    legend = (ROOT / "docs" / "deviations.md").read_text().split("## Where this code departs")[0]
    for tag in ("[official]", "[HF]", "[impl]", "[issue 30]", "[G-prec]"):
        assert f"`{tag}`" in legend, tag
    ids = set(re.findall(r"^- ([GEPD]-\w+):", (ROOT / "docs" / "deviations.md").read_text(), re.M))
    for name in FILES:
        text = (ROOT / name).read_text()
        assert "[DESIGN" not in text, name  # before: a file no reader has
        for tag in re.findall(r"\[([GEPD]-\w+)\]", text):
            assert tag in ids, (name, tag)


def test_testing_md_states_the_ceilings_test_structure_holds():
    from test_structure import BUDGETS
    text = " ".join((ROOT / "docs" / "testing.md").read_text().split())
    ceilings = " / ".join(f"{BUDGETS[p]:,}" for p in ("Part 1", "Part 2", "Part 3"))
    assert f"({ceilings} lines, the transfer tasks {BUDGETS['transfer tasks']})" in text


def test_bert_forward_states_both_shapes():
    source = inspect.getsource(common.Bert.forward)
    assert "cls_only: -> [B, H]" in source
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab))).eval()
    ids, mask = tok(["a man is playing .", "a dog ."])
    assert model(ids, mask, cls_only=True).shape == (2, model.cfg.hidden_size)


def test_an_epoch_yields_pairs_of_tensors():
    tok = tokenizer()
    rng = random.Random(0)
    data = [[tok.encode(sentence(rng))] * 2 for _ in range(8)]
    cfg = simcse_min.Config(batch_size=4)
    batch = next(common.epoch_batches(data, tok, cfg, 0, 2))
    assert isinstance(batch, tuple) and len(batch) == 2  # before: a generator of two
    assert batch[0].shape[:2] == (4, 2) and batch[1].shape == batch[0].shape


def test_part_1_spells_out_what_reads_as_something_else():
    part1 = re.split(r"^# Part 2:", (ROOT / "common.py").read_text(), flags=re.M)[0]
    assert "i += 1 + pair" not in part1  # an int plus a bool
    assert re.search(r'"\\t-\\r" is the range TAB\.\.CR', part1)  # a regex range, not a string
    backward = inspect.getsource(common.GradientCache.backward)
    assert "sums.pop(0)" not in backward and "in order: module, chunk_size, kwargs" in backward
    assert re.search(r"_foreach_add_\(sums, got\)  # .*957 -> 637 ms", backward)  # its gain


@pytest.mark.parametrize("name", ["simcse_min.py", "simcsepp_min.py"])
def test_the_encoder_is_called_with_cls_only_named(name):
    """SimCSE++'s dropout-off pass names cls_only as SimCSE does [issue 55]: `model(..., True,
    cfg.chunk_size)` reads as a flag nobody named."""
    tree = ast.parse((ROOT / name).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id == "model"]
    assert calls, f"{name}: no call of model(...) found: the check would check nothing"
    for call in calls:
        assert not any(isinstance(a, ast.Constant) and a.value is True for a in call.args), \
            (name, ast.unparse(call))
