"""`analyze` on what used to end it in a traceback is one line now [issue 27]: a malformed run
history, gold scores outside 0-5, a diverged (NaN) model; a collapsed model (all-zero vectors) is
analysed, its singular values 0. The oracle: each input's written rule, and the model's weights
set by hand."""
import json
import shutil

import pytest
import torch

import common
from tiny_world import tokenizer


def analyze(world, tmp_path, *more, model=None, senteval=None):
    return common.cli(["analyze", "--model", model or world["model"], "--device", "cpu",
                       "--senteval", senteval or world["senteval"], "--out",
                       str(tmp_path / "analysis"), *more])


def with_weights(world, tmp_path, fill):
    model = common.Bert.from_pretrained(world["model"])
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(fill)
    common.save_pretrained(model, tmp_path / "filled", tokenizer())
    return str(tmp_path / "filled")


@pytest.mark.parametrize("history", [[["x", 0.1, -1.0]], [[0, 0.1]], {"0": [0.1, -1.0]}])
def test_a_malformed_run_history_is_one_line(history, world, tmp_path):
    run = {"method": "simcse", "config": {}, "test": {}, "best_dev": 80.0}  # finished, but:
    (tmp_path / "results.json").write_text(json.dumps({**run, "align_uniform": history}))
    with pytest.raises(common.UserError, match="no align_uniform history of \\[step, alignment"):
        analyze(world, tmp_path, "--runs", str(tmp_path / "results.json"))


def test_gold_scores_outside_0_to_5_are_one_line(world, tmp_path):
    root = tmp_path / "senteval"
    shutil.copytree(world["senteval"], root)
    for f in root.rglob("sts-*.csv"):
        f.write_text("".join("\t".join(r[:4] + ["7.5"] + r[5:]) + "\n"
                             for r in (line.split("\t") for line in f.read_text().splitlines())))
    with pytest.raises(common.UserError, match="gold scores outside 0-5"):
        analyze(world, tmp_path, senteval=str(root))


def test_a_diverged_model_is_one_line_and_a_collapsed_one_is_analysed(world, tmp_path):
    with pytest.raises(common.UserError, match="non-finite sentence vectors"):
        analyze(world, tmp_path, model=with_weights(world, tmp_path, float("nan")))
    models = analyze(world, tmp_path, model=with_weights(world, tmp_path, 0.0))
    assert models[0]["test"]["singular_values"][0] == 0.0  # every vector the same: none spread
    assert (tmp_path / "analysis" / "singular_values.svg").exists()
