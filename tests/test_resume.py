"""Resumable training: a run killed at a random step (SIGKILL: nothing saved at the moment of death)
or stopped by
SIGTERM, then resumed with --resume, ends with exactly the weights and results.json of the same run
uninterrupted
(seeded, deterministic CPU). The oracle is that uninterrupted run; tiny BERT, 2 x 8 steps,
checkpoints every 3 steps."""
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
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
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


@pytest.mark.parametrize("method", ["simcse", "esimcse"])
def test_sigkill_at_a_random_step_then_resume_is_bit_identical(method, world, tmp_path,
                                                               uninterrupted):
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    out = tmp_path / "out"
    args = [f"--{k}={v}" for k, v in flags(method, world, out).items()]
    proc = subprocess.Popen([sys.executable, f"{method}_min.py", *args],
                            cwd=common.Path(common.__file__).parent,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for = rng.choice([3, 6])  # a checkpoint exists, then death at a random moment after it
    deadline = time.time() + 60
    while checkpoint_step(out) < wait_for and proc.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    time.sleep(rng.uniform(0, 0.05))
    os.kill(proc.pid, signal.SIGKILL)
    assert (
        proc.wait() == -signal.SIGKILL
    ), f"seed {seed}: the run ended before the kill: {proc.stderr.read()}"
    killed_at = checkpoint_step(out)
    assert 3 <= killed_at < 16 and not (out / "results.json").exists(), f"seed {seed}"
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
    results = json.loads((out / "results.json").read_text())
    assert results["stopped"].startswith("the loss became nan at step 6")
    assert results["best_step"] in (0, 5)
    assert common.Bert.from_pretrained(out) is not None


@pytest.fixture
def own_handlers():
    """The test process's signal handlers back as they were (a run stopped by an exception keeps its
    own)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def finish_or_resume(out, world):
    """A finished run as it is; a checkpoint resumed to the end; a run stopped before any step
    started afresh."""
    module = importlib.import_module("simcse_min")
    if (out / "results.json").exists():
        return "finished"
    if (out / "checkpoint.pt").exists():
        module.train(module.Config(resume=str(out)))
        return "resumed"
    log = (out / "log.txt").read_text() if (out / "log.txt").exists() else ""
    assert "checkpoint saved" not in log and "| loss " not in log, log  # no training step was done
    module.train(config("simcse", world, out))
    return "restarted"


def test_sigterm_at_random_moments_finishes_or_resumes_identically(world, tmp_path, uninterrupted):
    """SIGTERM at random moments of whole runs through the command line (start-up, steps,
    evaluations, checkpoints,
    the final evaluation and save): every outcome is a finished run or one that --resume finishes
    identically."""
    seed = random.randrange(10**6)
    rng, outcomes = random.Random(seed), []
    args = [f"--{k}={v}" for k, v in flags("simcse", world, tmp_path / "timed").items()]
    start = time.time()
    subprocess.run([sys.executable, "simcse_min.py", *args],
                   cwd=common.Path(common.__file__).parent, check=True,
                   capture_output=True)
    seconds = time.time() - start
    for trial in range(6):
        out = tmp_path / f"out{trial}"
        args = [f"--{k}={v}" for k, v in flags("simcse", world, out).items()]
        proc = subprocess.Popen([sys.executable, "simcse_min.py", *args],
                                cwd=common.Path(common.__file__).parent,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(seconds * (trial + rng.random()) / 6)  # one moment in each sixth of a run
        proc.send_signal(signal.SIGTERM)
        code, err = proc.wait(), proc.stderr.read().decode()
        assert code in (0, 128 + signal.SIGTERM,
                        -signal.SIGTERM) and "Traceback" not in err, f"seed {seed}: {err}"
        outcomes.append(finish_or_resume(out, world))
        assert_same_run(uninterrupted("simcse"), out)
    print(f"seed {seed}: {outcomes}")


def signals_after_step(monkeypatch, module, n, *signals):
    """module.optimizer_step raises `signals` after the n-th step -> the list of steps taken (one
    item each)."""
    real_step, calls = module.optimizer_step, []

    def step_then_signals(*args):
        real_step(*args)
        calls.append(1)
        for s in signals if len(calls) == n else ():
            signal.raise_signal(s)
    monkeypatch.setattr(module, "optimizer_step", step_then_signals)
    return calls


def signals_inside(monkeypatch, name, count, when=lambda: True):
    """common.<name> raises `count` SIGTERMs when it is called (and `when()`), then runs."""
    real = getattr(common, name)

    def wrapper(*args, **kw):
        if when():
            for _ in range(count):
                signal.raise_signal(signal.SIGTERM)
        return real(*args, **kw)
    monkeypatch.setattr(common, name, wrapper)


@pytest.mark.parametrize("name, count", [("evaluate_sts", 1), ("evaluate_sts", 2),
                                         ("write_safetensors", 2)])
def test_signals_in_the_final_evaluation_and_save_lose_nothing(name, count, world, tmp_path,
                                                               uninterrupted,
                                                                 monkeypatch, own_handlers, capsys):
    """One signal during the final test evaluation: the run finishes. A second one stops it at once
    (there, or
    while the model is written), saying how to go on: the checkpoint of the last step is there, and
    --resume
    finishes identically."""
    out, module = tmp_path / "out", importlib.import_module("simcse_min")
    signals_inside(monkeypatch, name, count)
    try:
        module.train(config("simcse", world, out))
        assert count == 1
    except KeyboardInterrupt:
        assert count == 2 and checkpoint_step(out) == 16 and not (out / "results.json").exists()
        assert (
            "SIGTERM again: stopping now; the last checkpoint is kept: continue with --resume"
            f" {out}"
            in capsys.readouterr().err
        )
    monkeypatch.undo()
    import gc
    gc.collect()  # the stopped run's frames (and its out_dir lock) go
    finish_or_resume(out, world)
    assert_same_run(uninterrupted("simcse"), out)


def test_a_second_signal_waits_for_the_checkpoint_being_written(world, tmp_path, uninterrupted,
                                                                monkeypatch,
                                                                 own_handlers):
    out, module = tmp_path / "out", importlib.import_module("simcse_min")
    # the first: a checkpoint after step 5
    calls = signals_after_step(monkeypatch, module, 5, signal.SIGTERM)
    # the second, while it is saved
    signals_inside(monkeypatch, "rng_states", 1, when=lambda: len(calls) == 5)
    stops_at_then_resumes_identically(5, module, world, out, monkeypatch, uninterrupted)


def test_a_second_run_on_a_live_out_dir_is_refused(world, tmp_path):
    """The first run holds out_dir (a lock on its log.txt that dies with its process): the second is
    refused."""
    import fcntl
    out = tmp_path / "out"
    out.mkdir()
    with open(out / "log.txt", "a") as held:  # what a live run holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        args = [f"--{k}={v}" for k, v in flags("simcse", world, out).items()]
        proc = subprocess.run([sys.executable, "simcse_min.py", *args],
                              cwd=common.Path(common.__file__).parent,
                              capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip().endswith("pick another --out_dir"), proc.stderr
    assert not (out / "checkpoint.pt").exists() and not (out / "results.json").exists()
    # released: it runs
    importlib.import_module("simcse_min").train(config("simcse", world, out, max_steps=2))


def test_a_second_signal_before_any_checkpoint_waits_for_one(world, tmp_path, uninterrupted,
                                                             monkeypatch,
                                                             own_handlers):
    """Two quick signals in step 2, nothing saved yet (the first checkpoint would come at step 3):
    the run still
    stops at the end of the step with a checkpoint, so nothing it did is lost."""
    out, module = tmp_path / "out", importlib.import_module("simcse_min")
    signals_after_step(monkeypatch, module, 2, signal.SIGTERM, signal.SIGINT)
    stops_at_then_resumes_identically(2, module, world, out, monkeypatch, uninterrupted)


def stops_at_then_resumes_identically(step, module, world, out, monkeypatch, uninterrupted):
    """The run (signals already planted) exits 128 + SIGTERM with a checkpoint at `step`; resumed
    without them, it
    ends as the uninterrupted run did."""
    with pytest.raises(SystemExit) as stop:
        module.train(config("simcse", world, out))
    assert stop.value.code == 128 + signal.SIGTERM and checkpoint_step(out) == step
    monkeypatch.undo()
    module.train(config("simcse", world, out, resume=str(out)))
    assert_same_run(uninterrupted("simcse"), out)
