"""Every method end to end on a tiny BERT, a 48-sentence file and a tiny SentEval folder: a few CPU
steps, finite numbers, results.json, and a saved model that reloads and gives the vectors the
evaluation used."""
import dataclasses
import importlib
import json
import math
import subprocess
import sys

import pytest
import torch

import common
from tiny_world import make_world, stsb_dev

METHODS = ["simcse", "esimcse", "simcsepp", "diffcse"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_world(tmp_path_factory.mktemp("world"))


def config(module, world, out_dir, **kw):
    fields = {f.name for f in dataclasses.fields(module.Config)}
    values = dict(device="cpu", batch_size=8, max_steps=3, eval_every=2, out_dir=str(out_dir),
                  **world, **kw)
    return module.Config(**{k: v for k, v in values.items() if k in fields})


@pytest.mark.parametrize("method", METHODS)
def test_train_end_to_end(method, world, tmp_path):
    module = importlib.import_module(f"{method}_min")
    results = module.train(config(module, world, tmp_path / "out"))
    assert results["method"] == method
    assert [step for step, _ in results["dev_history"]] == [0, 2, 3]
    assert all(math.isfinite(s["loss"]) for _, s in results["stats_history"][1:])
    assert set(results["test"]) == {*common.TEST_TASKS, "Avg"}
    assert all(math.isfinite(v) for v in results["test"].values())
    out = tmp_path / "out"
    assert json.loads((out / "results.json").read_text())["best_step"] == results["best_step"]
    assert (out / "log.txt").read_text().splitlines()[1].startswith("config {")
    # the written best model reloads and gives exactly the vectors the evaluation used
    tok, model = common.Tokenizer.from_pretrained(out), common.Bert.from_pretrained(out)
    dev = common.DevSet(tok, stsb_dev(common.resolve_senteval(world["senteval"])), 512)
    dev_score = common.evaluate_dev(model, dev)["stsb_dev"]
    assert dev_score == pytest.approx(results["best_dev"], abs=1e-3)
    pooling = json.loads((out / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] and not pooling["pooling_mode_mean_tokens"]


@pytest.mark.parametrize("method", METHODS)
def test_cli_errors_are_one_line(method, world, tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, f"{method}_min.py", *args], capture_output=True,
                              text=True,
                              cwd=common.Path(common.__file__).parent, timeout=120)
    base = ["--model", world["model"], "--senteval", world["senteval"], "--out_dir",
            str(tmp_path / "o")]
    cases = [(["--data", str(tmp_path / "missing.txt"), "--device", "cpu"], "does not exist")]
    if not torch.cuda.is_available():
        cases.append((["--data", world["data"], "--device", "cuda"], "no CUDA device"))
    (tmp_path / "empty.txt").write_text("\n \n")
    cases.append((["--data", str(tmp_path / "empty.txt"), "--device", "cpu"], "holds no sentences"))
    # the checks are shared: once is enough
    for args, message in cases if method == "simcse" else cases[:1]:
        r = run(*base, *args)
        assert r.returncode == 2, r.stderr
        assert "Traceback" not in r.stderr and message in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith("error: ")


def test_help_explains_every_flag():
    r = subprocess.run([sys.executable, "simcse_min.py", "--help"], capture_output=True, text=True,
                       cwd=common.Path(common.__file__).parent, timeout=300)
    assert r.returncode == 0 and "--temp" in r.stdout and "temperature" in r.stdout


def test_token_cache_round_trip(world, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path)
    tok = common.Tokenizer.from_pretrained(world["model"])
    first, _, hit1 = common.tokenize_file(tok, world["data"], 16)
    second, _, hit2 = common.tokenize_file(tok, world["data"], 16)
    assert (hit1, hit2) == (False, True) and len(first) == len(second) == 48
    lines = common.read_lines(world["data"])
    assert all(first[i] == second[i] == (tok.encode(lines[i], 16),) for i in range(len(lines)))
    # another max_len is another entry
    assert common.tokenize_file(tok, world["data"], 12)[2] is False


@pytest.mark.parametrize("max_len, refused", [(32, True), (27, False)])
def test_esimcse_checks_its_repeated_view_against_the_positions(world, tmp_path, max_len, refused):
    """ESimCSE's repeated view holds up to 9 tokens more than --max_len: a model of 36 positions
    takes --max_len 27; 32 on 40-word sentences is refused before any work [issue 30], where it
    used to stop at the first batch whose repeats ran past the position table."""
    import esimcse_min
    from tiny_world import WORDS, tokenizer
    tok = tokenizer()
    cfg = common.BertConfig.tiny(vocab_size=len(tok.vocab), max_position_embeddings=36)
    common.save_pretrained(common.Bert(cfg), tmp_path / "m36", tok)
    (tmp_path / "long.txt").write_text("".join(" ".join(WORDS[(i + j) % len(WORDS)] for j in
                                                        range(40)) + "\n" for i in range(16)))
    cfg = config(esimcse_min, {**world, "model": str(tmp_path / "m36"),
                               "data": str(tmp_path / "long.txt")}, tmp_path / "o", max_len=max_len)
    if refused:
        with pytest.raises(common.UserError, match="--max_len 32 \\+ 9 .* exceeds the 36 "):
            esimcse_min.train(cfg)
        assert not (tmp_path / "o").exists()
    else:
        assert math.isfinite(esimcse_min.train(cfg)["test"]["Avg"])
