"""A newcomer's first minutes: boolean flags as bare switches, input problems said one line at a
time before any work, `wiki1m.txt` fetched once into the cache, a failed download that leaves no
empty folder and names the flag, losses upcast to at least float32 (float64 stays float64), and
--help that runs. Local servers only (127.0.0.1)."""
import collections
import copy
import random
import socket
import subprocess
import sys

import pytest
import torch

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from tiny_world import make_model, make_senteval, make_world, sentence, tokenizer

ROOT = common.Path(common.__file__).parent


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--overwrite", "--compile"], (True, True)),
        (["--overwrite", "1"], (True, False)),
        (["--overwrite", "true"], (True, False)),
        (["--overwrite", "0"], (False, False)),
        ([], (False, False)),
    ],
)
def test_boolean_flags_are_bare_switches(argv, expected):
    cfg = common.parse_args(simcse_min.Config, argv)
    assert (cfg.overwrite, cfg.compile) == expected


def test_bad_boolean_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        common.parse_args(simcse_min.Config, ["--overwrite", "maybe"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "maybe" in err[0], err


def test_input_problems_stop_the_run_one_line_at_a_time_before_any_work(tmp_path, capsys):
    """The first problem found stops the run: one line naming it, exit 2, nothing created. Fixed,
    the next one is said [issue 28: fail at the point of use]."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "vocab.txt").write_text("[PAD]\n")  # a folder, but no config.json
    senteval = make_senteval(tmp_path / "senteval", n=2)
    (senteval / common.sts_files("test")[0]).unlink()  # incomplete
    flags = {"--lr": "0", "--data": str(tmp_path / "missing.txt"),
             "--model": str(tmp_path / "model"), "--senteval": str(senteval)}
    (tmp_path / "w").mkdir()
    fixes = {"--lr": "1e-3", "--data": make_world(tmp_path / "w")["data"],
             "--model": str(make_model(tmp_path / "good"))}
    out = tmp_path / "out"
    for flag, problem in [("--lr", "--lr 0"), ("--data", "missing.txt does not exist"),
                          ("--model", "has no config.json"), ("", "is incomplete")]:
        cfg = common.parse_args(simcse_min.Config, [x for kv in flags.items() for x in kv] + [
            "--out_dir", str(out), "--device", "cpu"])
        with pytest.raises(SystemExit) as e:
            common.main_guard(simcse_min.train, cfg)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
        assert problem in err[0] and not out.exists(), (problem, err[0])
        flags.update({flag: fixes[flag]} if flag else {})


def test_wiki1m_resolves_to_the_simcse_corpus_once(hub, tmp_path, monkeypatch, capsys):
    corpus = hub.files["datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    common.check_data("wiki1m.txt")  # absent, yet known: no problem
    path = common.resolve_data("wiki1m.txt")
    assert path == tmp_path / "cache" / "data" / "wiki1m_for_simcse.txt"
    assert path.read_bytes() == corpus
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "wiki1m_for_simcse.txt" in notes[0], notes
    # a large file: the hub, then its CDN
    assert [host for _, host, _, _ in hub.requests] == ["hub", "cdn"]
    assert common.resolve_data("wiki1m.txt") == path  # cached now: the server is not asked again
    assert len(hub.requests) == 2 and not (tmp_path / "cwd" / "wiki1m.txt").exists()


@pytest.mark.parametrize("name, flag", [("bert-base-uncased", "--model"),
                                        ("distilbert-base-uncased", "--generator")])
def test_failed_download_leaves_no_empty_cache_folder(name, flag, tmp_path, monkeypatch):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    monkeypatch.setattr(common, "HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    # no snapshot of a real download either
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(common.UserError) as e:
        # --model: the default
        common.resolve_model(*(name,) if flag == "--model" else (name, flag))
    assert "offline" in str(e.value) and flag in str(e.value), str(e.value)
    assert not (common.CACHE / "models" / name).exists()


def test_upcast_is_at_least_float32():
    assert common.upcast(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert common.upcast(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert common.upcast(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("method", ["simcse", "esimcse", "simcsepp", "diffcse"])
def test_float64_model_gives_a_float64_loss(method):
    torch.manual_seed(0)
    tok, rng = tokenizer(), random.Random(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab))).double().train()
    ids, mask = tok([sentence(rng) for _ in range(4)], max_len=16)
    ids, mask = ids[:, None], mask[:, None]  # [B, 1, L]
    H = model.cfg.hidden_size
    if method == "simcse":
        losses = [simcse_min.train_step(model, simcse_min.MLPHead(H).double(), ids, mask,
                                        simcse_min.Config())[0]]
    elif method == "simcsepp":
        cfg = simcsepp_min.Config()
        losses = [simcsepp_min.train_step(model, simcsepp_min.MLPHead(H).double(), ids, mask,
                                          cfg)[0]]
    elif method == "esimcse":
        cfg, head = esimcse_min.Config(queue_size=6), esimcse_min.MLPHead(H).double()
        momentum, queue = esimcse_min.momentum_encoder(model), collections.deque(maxlen=6)
        losses = [esimcse_min.train_step(model, head, ids, mask, cfg, momentum, queue,
                                         random.Random(0))[0]
                  for _ in range(2)]  # the second step with a queue of float64 vectors
        assert all(q.dtype == torch.float64 for q in queue)
    else:
        disc = diffcse_min.Discriminator(copy.deepcopy(model)).double().train()
        generator = common.Bert(model.cfg, mlm_head=True).double().requires_grad_(False)
        head = diffcse_min.BNProjector(H).double().train()
        losses = [diffcse_min.train_step(model, head, ids, mask, diffcse_min.Config(), disc,
                                         generator, tok,
                                         torch.Generator().manual_seed(0))[0]]
    for loss in losses:
        assert loss.dtype == torch.float64 and torch.isfinite(loss)
    losses[-1].backward()  # the float64 graph is whole
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float64 for g in grads)  # a gradient reached the model


def test_help_runs():
    procs = {script: subprocess.Popen([sys.executable, script, "--help"], cwd=ROOT, text=True,
                                      stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE) for script in ("common.py",
                                                                             "simcse_min.py")}
    try:  # side by side: each is mostly the import of torch
        outputs = {script: p.communicate(timeout=300) for script, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill() if p.poll() is None else None
            p.wait()
    for script, p in procs.items():
        assert p.returncode == 0, (script, outputs[script][1])
    assert "--overwrite" in outputs["simcse_min.py"][0]
    assert "--compile" in outputs["simcse_min.py"][0]
