"""Resumable training: a run killed at a random step (SIGKILL: nothing saved at the moment of death)
or stopped by SIGTERM, then resumed with --resume, ends with exactly the weights and results.json of
the same run uninterrupted, the oracle (seeded CPU); tiny BERT, 2 x 8 steps, save_every 3."""
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import torch

import common
from conftest import same_bytes
from tiny_world import make_model, make_senteval, sentence

TIMING = {"train_seconds"}  # differ between any two runs


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume-world")
    rng = random.Random(3)
    # 8 steps per epoch
    (tmp / "train.txt").write_text("".join(sentence(rng) + "\n" for _ in range(64)))
    return dict(model=str(make_model(tmp / "model")), data=str(tmp / "train.txt"),
                senteval=str(make_senteval(tmp / "senteval")))


def flags(method, world, out, **kw):
    values = dict(device="cpu", batch_size=8, epochs=2, eval_every=4, save_every=3,
                  out_dir=str(out), **world, **kw)
    if method == "esimcse":
        # 1.5 batches: the queue is full, wraps, and is cleared at the epoch start
        values["queue_size"] = 12
    return values


def config(method, world, out, **kw):
    return importlib.import_module(f"{method}_min").Config(**flags(method, world, out, **kw))


@pytest.fixture(scope="module")
def uninterrupted(world, tmp_path_factory):
    done = {}

    def get(method):
        if method not in done:
            out = tmp_path_factory.mktemp(f"{method}-uninterrupted")
            importlib.import_module(f"{method}_min").train(config(method, world, out))
            done[method] = out
        return done[method]
    return get


def assert_same_run(a, b):
    model = "model.safetensors"
    assert same_bytes((a / model).read_bytes(), (b / model).read_bytes())
    ra, rb = (json.loads((d / "results.json").read_text()) for d in (a, b))
    for r in (ra, rb):
        r["test_details"].pop("seconds")
        for k in TIMING:
            r.pop(k)
        for k in ("out_dir", "resume"):
            r["config"].pop(k)
    assert ra == rb
    assert not (b / "checkpoint.pt").exists()  # a finished run leaves no checkpoint behind


def checkpoint_step(out):
    try:
        return torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    except (OSError, RuntimeError, EOFError):
        return 0


def killed_after_checkpoint(method, world, out, rng, seconds=300):
    """Starts the run, waits for its checkpoint at step 3 or 6 (about 2 s here), SIGKILLs it a
    random moment later -> the checkpoint's step, or None when the run ended first (this process
    was kept off the CPU for the whole run: nothing tested, the caller tries again). A run short of
    the checkpoint after `seconds` is stuck: the test fails with its stacks (from faulthandler)."""
    args = [f"--{k}={v}" for k, v in flags(method, world, out).items()]
    log = out.parent / f"{out.name}.stderr"
    with log.open("wb") as stderr:  # a file, not a pipe: a full pipe would stop the run
        proc = subprocess.Popen([sys.executable, f"{method}_min.py", *args],
                                cwd=common.Path(common.__file__).parent, stdout=subprocess.DEVNULL,
                                stderr=stderr, env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    wait_for, start = rng.choice([3, 6]), time.time()  # a checkpoint exists, then death after it
    while checkpoint_step(out) < wait_for and proc.poll() is None:
        if time.time() > start + seconds:
            proc.send_signal(signal.SIGABRT)
            proc.wait()
            pytest.fail(f"no checkpoint at step {wait_for} after {seconds} s:\n{log.read_text()}")
        time.sleep(0.005)
    time.sleep(rng.uniform(0, 0.05))
    proc.kill()  # SIGKILL; nothing when the run has ended and been waited for
    code = proc.wait()
    if code != -signal.SIGKILL or (out / "results.json").exists():
        assert code in (0, -signal.SIGKILL), log.read_text()
        return None
    return checkpoint_step(out)  # 16: after the last step's checkpoint, which is there so that
    # the final evaluation and save can be resumed too (a fast machine gets there)


@pytest.mark.parametrize("method", ["simcse", "esimcse"])
def test_sigkill_at_a_random_step_then_resume_is_bit_identical(method, world, tmp_path,
                                                               uninterrupted):
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    for attempt in range(3):
        out = tmp_path / f"out{attempt}"
        killed_at = killed_after_checkpoint(method, world, out, rng)
        if killed_at is not None:
            break
    assert killed_at is not None, f"seed {seed}: each of 3 runs ended before the kill"
    assert 3 <= killed_at <= 16, f"seed {seed}"
    module = importlib.import_module(f"{method}_min")
    # `--resume DIR` alone: the rest comes from the checkpoint
    module.train(module.Config(resume=str(out)))
    assert_same_run(uninterrupted(method), out)
    assert (
        f"resumed from {out / 'checkpoint.pt'} at step {killed_at}/16" in (
            out / "log.txt"
        ).read_text()
    )


def test_sigterm_checkpoints_at_the_step_end_and_resume_survives_a_torn_write(world, tmp_path,
                                                                              uninterrupted,
                                                                            monkeypatch):
    module, out, calls = importlib.import_module("simcse_min"), tmp_path / "out", []
    real_step = module.optimizer_step

    def step_then_signal(*args):
        real_step(*args)
        calls.append(1)
        if len(calls) == 7:
            signal.raise_signal(signal.SIGTERM)
    monkeypatch.setattr(module, "optimizer_step", step_then_signal)
    with pytest.raises(SystemExit) as stop:
        module.train(config("simcse", world, out))
    assert stop.value.code == 128 + signal.SIGTERM
    assert checkpoint_step(out) == 7 and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.undo()
    # a crash in the middle of the next checkpoint leaves a torn temporary file beside the last good
    # checkpoint.pt (atomic_write renames only a complete file); it is not read
    (out / ".checkpoint.pt.x.tmp").write_bytes(b"\0" * 5)
    module.train(config("simcse", world, out, resume=str(out)))
    assert_same_run(uninterrupted("simcse"), out)


def test_resuming_a_finished_run_does_nothing(world, uninterrupted):
    out = uninterrupted("simcse")
    before = (out / "results.json").read_bytes()
    with pytest.raises(common.RunFinished, match="has finished"):
        importlib.import_module("simcse_min").train(config("simcse", world, out, resume=str(out)))
    assert (out / "results.json").read_bytes() == before


def test_non_finite_loss_stops_naming_the_step_and_keeps_the_best_model(world, tmp_path,
                                                                        monkeypatch):
    module, out = importlib.import_module("simcse_min"), tmp_path / "out"
    real_loss, calls = module.loss_fn, []

    def loss_goes_nan(h, *args):
        loss, stats = real_loss(h, *args)
        calls.append(1)
        loss = loss * float("nan") if len(calls) == 6 else loss
        return loss, {**stats, "loss": loss.detach()}
    monkeypatch.setattr(module, "loss_fn", loss_goes_nan)
    with pytest.raises(common.TrainingStopped, match="the loss became nan at step 6") as stop:
        module.train(config("simcse", world, out))
    assert stop.value.exit_code == 3
    assert len(calls) == 6  # step 6 saves a checkpoint, so its loss is read there: no step after
    results = json.loads((out / "results.json").read_text())
    assert results["stopped"].startswith("the loss became nan at step 6")
    assert results["best_step"] in (0, 5)
    assert common.Bert.from_pretrained(out) is not None


def test_weights_gone_nan_at_a_dev_step_stop_the_run_keeping_the_best(world, tmp_path, monkeypatch):
    """NaN weights after a finite loss (an inf gradient): a NaN dev score, passed over, then the
    loss stops the run, exit 3 (not `eval`'s vector check: exit 2, the best model lost)."""
    module, out, calls = importlib.import_module("simcse_min"), tmp_path / "out", []
    real_step = module.optimizer_step

    def step_then_break(loss, opt, *args):
        real_step(loss, opt, *args)
        calls.append(1)
        if len(calls) == 4:  # a dev step (eval_every=4)
            with torch.no_grad():
                opt.param_groups[0]["params"][0].fill_(float("nan"))
    monkeypatch.setattr(module, "optimizer_step", step_then_break)
    with pytest.raises(common.TrainingStopped, match="at step 5") as stop:
        module.train(config("simcse", world, out))
    assert stop.value.exit_code == 3
    assert json.loads((out / "results.json").read_text())["best_step"] in (0, 4)
