"""The released checkpoints' format [issue 41]: the poolers as SimCSE's evaluation.py computes
them, runs saved as the released models are (the MLP as BERT's pooler, read by transformers and
sentence-transformers as we read it), supervised SimCSE tested with its MLP, and SentEval's
rounding of the transfer accuracies.

The references in fixtures/pooler_ref.json come from transformers and sentence-transformers
(fixtures/make_pooler_fixtures.py, run outside the project; its docstring says how)."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import common
import simcse_min
from conftest import FIXTURES, ROOT, tiny_config
from tiny_world import make_model, make_senteval, seeded_run_folder, tokenizer

REF = json.loads((FIXTURES / "pooler_ref.json").read_text(encoding="utf-8"))


# ---- the poolers, as evaluation.py computes them (transformers' BertModel on MiniLM) -------------

@pytest.mark.parametrize("pooler", ["cls", "cls_before_pooler"])
def test_sts_of_each_cls_pooler_is_evaluation_py_s(minilm, senteval_dir, pooler):
    """STS13 ('all') and STS-B test within 0.02 of evaluation.py's batcher on BertModel."""
    tok, model = minilm
    tasks = {"STS13": {s: common.load_sts_subset(senteval_dir, "STS13", s)
                       for s in common.STS_YEARS["STS13"]},
             "STSBenchmark": {"test": common.load_sts_split(senteval_dir, "STSBenchmark", "test")}}
    res = common.evaluate_sts(model, tok, senteval_dir, pooler=pooler, tasks=tasks)
    for task, expected in REF["sts"][pooler].items():
        assert res[task] == pytest.approx(expected, abs=0.02), (task, res[task], expected)


@pytest.mark.parametrize("pooler", common.POOLERS)
def test_every_pooler_is_the_batcher_s_branch(minilm, pooler):
    """Each of the five vectors equals evaluation.py's (avg_first_last: layer 1 and the last)."""
    tok, model = minilm
    ours = common.encode_sentences(model, tok, REF["poolers"]["sentences"], pooler)
    theirs = torch.tensor(REF["poolers"][pooler], dtype=torch.float32)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_pooler_cls_on_a_folder_without_a_pooler_is_one_line(tmp_path):
    folder = make_model(tmp_path / "no-pooler")  # the tiny world's model has no pooler
    senteval = make_senteval(tmp_path / "senteval")
    out = subprocess.run([sys.executable, str(ROOT / "common.py"), "eval", "--model", str(folder),
                          "--pooler", "cls", "--senteval", str(senteval)], capture_output=True,
                         text=True, cwd=tmp_path)
    assert out.returncode == 2, out.stderr  # a bad input [main_guard]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(folder) in lines[0] and "cls_before_pooler" in lines[0], lines


# ---- a saved run, as transformers and sentence-transformers read it -----------------------------

def test_a_saved_run_reads_in_transformers_and_sentence_transformers_as_ours(tmp_path):
    """pooler_output is the MLP's vector (our cls), last_hidden_state[:, 0] and sentence-
    transformers' encode (CLS pooling) the raw [CLS] (our cls_before_pooler), each to 1e-5."""
    tok, _ = seeded_run_folder(tmp_path)
    model = common.Bert.from_pretrained(tmp_path)
    ref = REF["saved"]
    ours = {p: common.encode_sentences(model, tok, ref["sentences"], p)
            for p in ("cls", "cls_before_pooler")}
    for theirs, mine in (("pooler_output", "cls"), ("last_hidden_cls", "cls_before_pooler"),
                         ("sentence_transformers", "cls_before_pooler")):
        torch.testing.assert_close(ours[mine], torch.tensor(ref[theirs]), atol=1e-5, rtol=0)


def test_a_supervised_folder_gives_the_mlp_vector_in_sentence_transformers(tmp_path):
    """A supervised run's test vector (cls): sentence-transformers' encode is our cls to 1e-5 (CLS
    pooling, then a 2_Dense module, tanh(dense)), written as the installed library writes one."""
    tok, model = seeded_run_folder(tmp_path, pooler="cls")
    ref, fmt = REF["saved_supervised"], REF["dense_format"]
    ours = common.encode_sentences(common.Bert.from_pretrained(tmp_path), tok, ref["sentences"],
                                   "cls")
    torch.testing.assert_close(ours, torch.tensor(ref["sentence_transformers"]), atol=1e-5, rtol=0)
    config = json.loads((tmp_path / "2_Dense" / "config.json").read_text())
    H = model.cfg.hidden_size
    assert config == {k: fmt["config"][k] for k in config} | {"in_features": H, "out_features": H}
    assert sorted(p.name for p in (tmp_path / "2_Dense").iterdir()) == fmt["files"]
    dense = common.read_safetensors(tmp_path / "2_Dense" / "model.safetensors")
    assert sorted(dense) == fmt["keys"] and torch.equal(dense["linear.weight"],
                                                        model.pooler.dense.weight.detach())
    entry = json.loads((tmp_path / "modules.json").read_text())[-1]
    assert {k: entry[k] for k in ("idx", "name", "path")} == {k: fmt["modules_entry"][k] for k in
                                                              ("idx", "name", "path")}
    assert entry["type"].split(".")[-1] == fmt["modules_entry"]["type"].split(".")[-1] == "Dense"


def run_simcse(world, tmp_path, monkeypatch, data=None, **kw):
    """A 3-step tiny-world run; evaluate_dev and evaluate_sts record the pooler they are given."""
    seen = []
    scores = iter([50.0, 60.0, 70.0, 80.0])

    def evaluate_dev(model, dev, pooler, progress=None):
        seen.append(("dev", pooler))
        return {"stsb_dev": next(scores), "align": 0.5, "uniform": -2.0}

    def evaluate_sts(model, tok, root, mode, pooler, progress=None):
        seen.append(("test", pooler))
        return {t: 1.0 for t in common.TEST_TASKS} | {"Avg": 1.0, "details": {}}
    monkeypatch.setattr(simcse_min, "evaluate_dev", evaluate_dev)
    monkeypatch.setattr(simcse_min, "evaluate_sts", evaluate_sts)
    out = tmp_path / "out"
    simcse_min.train(tiny_config(simcse_min, {**world, "data": data or world["data"]}, out,
                                 max_steps=3, **kw))
    return out, seen


def test_supervised_simcse_uses_its_mlp_at_dev_and_test_and_saves_it_as_the_pooler(
        world, tmp_path, monkeypatch):
    rows = [f"{a},{b},{c}" for a, b, c in zip(*[["a man is eating .", "the dog runs ."] * 8] * 3)]
    (tmp_path / "nli.csv").write_text("sent0,sent1,hard_neg\n" + "\n".join(rows) + "\n")
    out, seen = run_simcse(world, tmp_path, monkeypatch, data=str(tmp_path / "nli.csv"))
    assert set(seen) == {("dev", "cls"), ("test", "cls")}
    saved = common.read_safetensors(out / "model.safetensors")
    assert torch.equal(common.read_safetensors(out / "2_Dense" / "model.safetensors")[
        "linear.weight"], saved["pooler.dense.weight"])  # sentence-transformers: the MLP too
    # the MLP trained in BERT's pooler's place, not the checkpoint's pooler, which it never uses
    start = common.read_safetensors(Path(world["model"]) / "model.safetensors")
    assert not torch.equal(saved["pooler.dense.weight"], start["bert.pooler.dense.weight"])


def test_unsupervised_simcse_tests_the_raw_cls_and_saves_its_mlp_as_the_pooler(world, tmp_path,
                                                                              monkeypatch):
    out, seen = run_simcse(world, tmp_path, monkeypatch)
    assert set(seen) == {("dev", "cls_before_pooler"), ("test", "cls_before_pooler")}
    assert "pooler.dense.weight" in common.read_safetensors(out / "model.safetensors")
    assert not (out / "2_Dense").exists()  # sentence-transformers: the raw [CLS]
    assert len(json.loads((out / "modules.json").read_text())) == 2


def test_diffcse_saves_no_bert_pooler_as_its_released_models(tmp_path):
    """DiffCSE's BN projector is no BERT pooler (pooler.net.*, where voidism/diffcse-* hold it as
    mlp.net.*): transformers initialises pooler.dense for both; loaded here, the model has none."""
    import diffcse_min
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)))
    model.pooler = diffcse_min.BNProjector(model.cfg.hidden_size)
    common.save_pretrained(model, tmp_path, tok)
    saved = common.read_safetensors(tmp_path / "model.safetensors")
    assert "pooler.net.0.weight" in saved and "pooler.dense.weight" not in saved
    assert common.Bert.from_pretrained(tmp_path, quiet=True).pooler is None


# ---- SentEval's rounding of the transfer accuracies ----------------------------------------------

def test_a_mean_of_folds_is_rounded_with_numpy_as_senteval_does():
    """round(100 * np.mean(...), 2) on a numpy float is numpy's round: 75.595 -> 75.6, where
    Python's round of the float 75.595 (75.594999...) gives 75.59 [SentEval validation.py]."""
    folds = np.array([0.75, 0.76190])  # mean 0.755950 -> 75.595 x 100
    assert 100 * np.mean(folds) == 75.595 and round(float(100 * np.mean(folds)), 2) == 75.59
    assert common.mean_percent(folds) == 75.6


def test_building_the_pooler_draws_nothing_from_the_rng():
    """A checkpoint's pooler is built without a draw: a run's dropout masks are those it had before
    the pooler was kept (the README's quick-start numbers stay)."""
    cfg = common.BertConfig.tiny()
    torch.manual_seed(0)
    common.Bert(cfg, pooler=True)
    after_with = torch.rand(3)
    torch.manual_seed(0)
    common.Bert(cfg)
    assert torch.equal(after_with, torch.rand(3))
