"""What a newcomer reads says what the code does [issue 55]: the help and docs say why chunked and
unchunked runs differ, every tag points to something the reader has, docs/testing.md states the
ceilings test_structure holds, and Part 1's hardest lines are spelled out (a shape comment, a bool
added to an int, a regex range that reads as a string, batches that were generators,
GradientCache.backward's order, a positional cls_only). The oracle: the code itself, read with
ast and inspect, beside the text that describes it."""
import ast
import inspect
import random
import re

import pytest

import common
import simcse_min
from conftest import ROOT, help_text
from tiny_world import sentence, tokenizer

FILES = ["common.py", "simcse_min.py", "esimcse_min.py", "simcsepp_min.py", "diffcse_min.py"]


def test_chunk_size_says_its_step_is_exact_for_the_masks_drawn(capsys):
    out = " ".join(help_text(capsys, common.parse_args, simcse_min.Config, ["--help"]).split())
    assert "the loss sees the whole batch" in out
    doc = " ".join((ROOT / "docs" / "large-batches.md").read_text().split())
    assert "exact step, for the dropout masks drawn" in doc and "same distribution" in doc
    speed = " ".join((ROOT / "docs" / "speed.md").read_text().split())
    assert "3.3x the unchunked one" in speed and "3.3x the unchunked step" in doc


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


@pytest.mark.parametrize("name", ["simcse_min.py", "esimcse_min.py", "simcsepp_min.py",
                                  "diffcse_min.py"])
def test_the_encoder_is_called_with_cls_only_named(name):
    """Every encoder pass names cls_only as SimCSE's does [issue 55]: `model(..., True,
    cfg.chunk_size)` read as a flag nobody named. The passes go through gradient_cache."""
    tree = ast.parse((ROOT / name).read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id in ("model", "momentum", "gradient_cache")]
    assert calls, f"{name}: no encoder call found: the check would check nothing"
    for call in calls:
        assert not any(isinstance(a, ast.Constant) and a.value is True for a in call.args), \
            (name, ast.unparse(call))
