"""The first fifteen minutes [issue 42]: flags never guessed from a prefix (each unknown one named
with the nearest known flag, in every method and every common.py command), a smoke run that skips
the test table (--test none), and a log whose ms/step and ETA keep the evaluations' time apart."""
import types

import pytest

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from tiny_world import make_world

METHODS = [simcse_min, esimcse_min, simcsepp_min, diffcse_min]


@pytest.mark.parametrize("module", METHODS, ids=lambda m: m.__name__)
@pytest.mark.parametrize("typed, meant", [("--max_step", "--max_steps"), ("--eval", "--eval_every"),
                                          ("--eval-every", "--eval_every"), ("--tes", "--test"),
                                          ("--max_stesp", "--max_steps")])  # a typo: difflib
def test_a_method_flag_is_never_guessed_and_the_nearest_is_named(module, typed, meant, capsys):
    with pytest.raises(SystemExit) as stop:  # argparse took a prefix as its flag before
        common.parse_args(module.Config, [typed, "10"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: unknown flag {typed}; did you mean {meant}? " \
                                      f"(see --help)\n"


@pytest.mark.parametrize("argv, typed, meant", [
    (["eval", "--model", "m", "--pool", "cls"], "--pool", "--pooler"),
    (["eval", "--model", "m", "--poolr", "cls"], "--poolr", "--pooler"),
    (["analyze", "--model", "m", "--out", "o", "--comp", "x"], "--comp", "--compare"),
    (["encode", "--model", "m", "--input", "f", "--out", "v", "--batch", "8"], "--batch",
     "--batch_size"),
    (["search", "--model", "m", "--corpus", "c", "--query", "q", "--top", "3"], "--top", "--top_k"),
    (["search", "--model", "m", "--corpus", "c", "--query", "q", "--top-k", "3"], "--top-k",
     "--top_k"),
    (["download", "senteval", "--hel"], "--hel", "--help"),
])
def test_a_command_flag_is_never_guessed_and_the_nearest_is_named(argv, typed, meant, capsys):
    with pytest.raises(SystemExit) as stop:  # before: a prefix ran the command, or no hint
        common.cli(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err == f"error: unknown flag {typed}; did you mean {meant}? " \
                                      f"(see --help)\n"


@pytest.mark.parametrize("module", METHODS, ids=lambda m: m.__name__)
def test_a_smoke_run_with_test_none_skips_the_table_and_says_so(module, tmp_path, monkeypatch):
    world = make_world(tmp_path)
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


class Clock:
    """time.time() for common, set by hand: a run's seconds without waiting for them."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def paced_run(monkeypatch):
    """A run's timing state as start() leaves it (loaded in 5 s; 30 steps, dev every 10 on 1,500
    pairs, then the test table), on a clock the test moves; its log lines collected."""
    clock = Clock()
    monkeypatch.setattr(common.time, "time", clock)
    run = types.SimpleNamespace(
        cfg=types.SimpleNamespace(eval_every=10, dev_file="", test="sts"), total=30, first_step=0,
        started=0.0, clock=5.0, last_print=0.0, eval_times=[], lines=[],
        dev_pairs=(["a"] * 1500, ["b"] * 1500, None),
        dev_history=[], align_uniform=[], stats_history=[],
        amp=types.SimpleNamespace(scaler=types.SimpleNamespace(is_enabled=lambda: False)))
    run.log = run.lines.append
    return clock, run


def dev_evaluation(clock, run, step, seconds):
    common.start_evaluation(run, "STS-B dev")
    clock.now += seconds
    dev = {"stsb_dev": 80.0 + step, "align": 0.1, "uniform": -2.0}  # a new best each time
    common.log_dev(run, step, dev, {}, {"dev": 80.0 + step, "step": step})


def test_ms_per_step_counts_the_training_steps_alone(paced_run):
    clock, run = paced_run
    clock.now = 5.0
    dev_evaluation(clock, run, 0, 100.0)  # the step-0 evaluation: 100 s
    assert run.lines[-1].endswith("| start-up 5.0 s | eval 100.0 s")
    clock.now += 10 * 1.0  # 10 steps of 1 s
    dev_evaluation(clock, run, 10, 100.0)
    assert run.lines[-1].endswith("| 1000 ms/step | eval 100.0 s")  # before: 21500 ms/step


def test_the_eta_counts_the_evaluations_left_at_their_measured_time(paced_run):
    clock, run = paced_run
    clock.now = 5.0
    dev_evaluation(clock, run, 0, 100.0)
    clock.now += 1.0  # step 1: the evaluation's line was 1 s ago, the next line comes 10 s after it
    common.log_progress(run, 1, {})
    assert len(run.lines) == 1
    clock.now += 11.0  # step 12
    common.log_progress(run, 12, {})
    # 18 steps x 1 s, dev at 20 and 30 (2 x 100 s), the test table (3,000 dev sentences: 100 s)
    minutes = (18 + 2 * 100 + 100 * common.TEST_SENTENCES / 3000) / 60  # 18.1; before: 2.9
    assert run.lines[-1] == f"step 12/30 | loss - | 1.00 steps/s | eta {minutes:.1f} min"
    run.cfg.test = "none"  # a smoke run: no table to wait for
    run.last_print = 0.0
    common.log_progress(run, 12, {})
    assert run.lines[-1] == "step 12/30 | loss - | 1.00 steps/s | eta 3.6 min"


def test_the_eta_counts_the_sentences_the_test_table_encodes(senteval_dir):
    tasks = common.load_sts(common.resolve_senteval(str(senteval_dir)), "test")
    distinct = {s for subsets in tasks.values() for a, b, _ in subsets.values() for s in a + b}
    assert len(distinct) == common.TEST_SENTENCES  # the table: that many dev sentences' time
