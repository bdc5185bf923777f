"""Signals at every moment of a run (random moments, the final evaluation and save, while a
checkpoint is written, before any), and a second run on a live out_dir: nothing lost, --resume
finishes identically. The oracle: the same run uninterrupted (test_resume.py's)."""
import importlib
import random
import signal
import subprocess
import sys
import time

import pytest

import common
from test_resume import (assert_same_run, checkpoint_step, config, flags,  # noqa: F401 (fixtures)
                         uninterrupted, world)


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
    evaluations, checkpoints, the final evaluation and save): every outcome is a finished run or one
    that --resume finishes identically."""
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
    """common.<name> (and simcse_min's import of it) raises `count` SIGTERMs when it is called
    (and `when()`), then runs."""
    real = getattr(common, name)

    def wrapper(*args, **kw):
        if when():
            for _ in range(count):
                signal.raise_signal(signal.SIGTERM)
        return real(*args, **kw)
    for module in (common, importlib.import_module("simcse_min")):
        if getattr(module, name, None) is real:
            monkeypatch.setattr(module, name, wrapper)


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
        assert count == 1  # it said what it did: the table, then results.json [issue 42]
        assert "SIGTERM: finishing the test table, about " in capsys.readouterr().err
        assert "SIGTERM: finishing the test table" in (out / "log.txt").read_text()  # [issue 55]
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
    """The first run holds out_dir (a lock on the folder that dies with its process): the second is
    refused; renaming the log does not let it in."""
    import fcntl
    out = tmp_path / "out"
    out.mkdir()
    (out / "log.txt").write_text("a live run's log\n")
    held = common.os.open(out, common.os.O_RDONLY)  # what a live run holds
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    (out / "log.txt").rename(out / "moved.txt")
    args = [f"--{k}={v}" for k, v in flags("simcse", world, out).items()]
    proc = subprocess.run([sys.executable, "simcse_min.py", *args],
                          cwd=common.Path(common.__file__).parent, capture_output=True, text=True)
    common.os.close(held)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("pick another --out_dir"), proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["moved.txt"]
    # released: it runs, beside the renamed log only with --overwrite (not a run's file) [issue 40]
    importlib.import_module("simcse_min").train(config("simcse", world, out, max_steps=2,
                                                       overwrite=True))


def test_a_second_signal_before_any_checkpoint_waits_for_one(world, tmp_path, uninterrupted,
                                                             monkeypatch,
                                                             own_handlers):
    """Two quick signals in step 2, nothing saved yet (the first checkpoint would come at step 3):
    the run still stops at the end of the step with a checkpoint, so nothing it did is lost."""
    out, module = tmp_path / "out", importlib.import_module("simcse_min")
    signals_after_step(monkeypatch, module, 2, signal.SIGTERM, signal.SIGINT)
    stops_at_then_resumes_identically(2, module, world, out, monkeypatch, uninterrupted)


def stops_at_then_resumes_identically(step, module, world, out, monkeypatch, uninterrupted):
    """The run (signals already planted) exits 128 + SIGTERM with a checkpoint at `step`; resumed
    without them, it ends as the uninterrupted run did."""
    with pytest.raises(SystemExit) as stop:
        module.train(config("simcse", world, out))
    assert stop.value.code == 128 + signal.SIGTERM and checkpoint_step(out) == step
    monkeypatch.undo()
    module.train(config("simcse", world, out, resume=str(out)))
    assert_same_run(uninterrupted("simcse"), out)
