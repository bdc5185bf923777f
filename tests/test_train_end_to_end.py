"""Every method end to end on the tiny world (a 2-layer BERT, 48 sentences, a tiny SentEval
folder): a few CPU steps, finite numbers, results.json, and a saved model that reloads and gives
the vectors the evaluation used (the oracle: the evaluation's own DevSet on the reloaded model);
--test none trains and saves without the test table, and with --dev_file needs no SentEval; the
command line's errors are one line; the token cache gives back what it stored."""
import importlib
import json
import math
import random
import subprocess
import sys

import pytest
import torch

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from conftest import tiny_config
from tiny_world import sentence, stsb_dev

METHODS = ["simcse", "esimcse", "simcsepp", "diffcse"]


def config(module, world, out_dir, **kw):
    return tiny_config(module, world, out_dir, max_steps=3, eval_every=2, **kw)


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
        cases.append((["--data", world["data"], "--device", "cuda"], "sees no such device"))
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


@pytest.mark.parametrize("module", [simcse_min, esimcse_min, simcsepp_min, diffcse_min],
                         ids=lambda m: m.__name__)
def test_a_smoke_run_with_test_none_skips_the_table_and_says_so(module, world, tmp_path,
                                                              monkeypatch):
    if module is not diffcse_min:
        world.pop("generator")

    def no_table(*args, **kwargs):
        raise AssertionError("--test none computed the test table")
    monkeypatch.setattr(module, "evaluate_sts", no_table)
    cfg = module.Config(**world, device="cpu", batch_size=8, max_steps=2, eval_every=1,
                        test="none", out_dir=str(tmp_path / "run"))
    results = module.train(cfg)
    log = (tmp_path / "run" / "log.txt").read_text()
    assert results["test"] == {} and results["test_details"] == {}
    assert "no test table (--test none)" in log and len(results["dev_history"]) == 3
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_dev_file_with_test_none_needs_no_senteval(world, tmp_path, monkeypatch):
    world.pop("generator")
    rng = random.Random(0)
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{sentence(rng)}\t{sentence(rng)}\t{i % 5}\n" for i in range(16)))
    monkeypatch.setattr(common, "HF_ENDPOINT", "http://127.0.0.1:9")  # offline
    monkeypatch.setattr(common, "CACHE", tmp_path / "empty-cache")  # no SentEval anywhere

    def no_download(*args, **kwargs):
        raise AssertionError("a run that reads no SentEval file fetched senteval.tar")
    monkeypatch.setattr(common, "download_senteval", no_download)
    cfg = simcse_min.Config(**{**world, "senteval": ""}, dev_file=str(pairs), test="none",
                            device="cpu", batch_size=8, max_steps=2, eval_every=1,
                            out_dir=str(tmp_path / "run"))
    results = simcse_min.train(cfg)  # before: the download's AssertionError
    assert results["test"] == {} and len(results["dev_history"]) == 3
