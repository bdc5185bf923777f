"""What a run's log and an evaluation say while they go: on a clock the test moves, ms/step counts
the training steps alone and the ETA counts the evaluations left at their measured time, the test
table at TEST_SENTENCES (checked against SentEval's files); an evaluation prints a progress line
in a log every PROGRESS_EVERY seconds, nothing when short, and on a terminal one line updated in
place then erased [issue 42]."""
import io
import re
import sys
import types

import pytest

import common
from tiny_world import make_model, make_senteval


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
    common.Run.progress(run, "STS-B dev")
    clock.now += seconds
    dev = {"stsb_dev": 80.0 + step, "align": 0.1, "uniform": -2.0}  # a new best each time
    common.Run.log_dev(run, step, dev, {}, {"dev": 80.0 + step, "step": step})


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
    common.Run.log_progress(run, 1, {})
    assert len(run.lines) == 1
    clock.now += 11.0  # step 12
    common.Run.log_progress(run, 12, {})
    # 18 steps x 1 s, dev at 20 and 30 (2 x 100 s), the test table (3,000 dev sentences: 100 s)
    minutes = (18 + 2 * 100 + 100 * common.TEST_SENTENCES / 3000) / 60  # 18.1; before: 2.9
    assert run.lines[-1] == f"step 12/30 | loss - | 1.00 steps/s | eta {minutes:.1f} min"
    run.cfg.test = "none"  # a smoke run: no table to wait for
    run.last_print = 0.0
    common.Run.log_progress(run, 12, {})
    assert run.lines[-1] == "step 12/30 | loss - | 1.00 steps/s | eta 3.6 min"


def test_the_eta_counts_the_sentences_the_test_table_encodes(senteval_dir):
    tasks = common.load_sts(common.resolve_senteval(str(senteval_dir)), "test")
    distinct = {s for subsets in tasks.values() for a, b, _ in subsets.values() for s in a + b}
    assert len(distinct) == common.TEST_SENTENCES  # the table: that many dev sentences' time


def test_eval_shows_progress_lines_in_a_log(tmp_path, monkeypatch, capsys):
    """Not a terminal: a line every PROGRESS_EVERY seconds (0 here) with done/total, elapsed and the
    ETA."""
    monkeypatch.setattr(common, "PROGRESS_EVERY", 0.0)
    model, senteval = make_model(tmp_path / "m"), make_senteval(tmp_path / "senteval", n=40)
    common.cli(["eval", "--model", str(model), "--senteval", str(senteval), "--device", "cpu",
                "--batch_size", "16"])
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("STS test: ")]
    total = int(re.search(r"/([\d,]+) sentences encoded", lines[0])[1].replace(",", ""))
    assert len(lines) >= 3 and total > 16, lines
    assert re.fullmatch(r"STS test: 16/[\d,]+ sentences encoded \| \d+ s \| eta \d+ s",
                        lines[0]), lines[0]
    assert lines[-1].endswith("| done") and f"{total:,}/{total:,}" in lines[-1]


def test_a_short_evaluation_in_a_log_says_nothing(tmp_path, capsys):
    """Below PROGRESS_EVERY seconds nothing is printed: the dev evaluations of a training log stay
    one line each."""
    progress = common.Progress("STS-B dev")
    for done in (10, 20, 30):
        progress(done, 30)
    assert capsys.readouterr().err == ""


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_line_is_updated_in_place_then_erased(monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    clock = iter([0.0, 1.0, 2.0, 3.0])
    monkeypatch.setattr(common.time, "time", lambda: next(clock))
    progress = common.Progress("STS test")
    progress(5, 10), progress(10, 10)
    assert (
        term.getvalue() == "\rSTS test: 5/10 sentences encoded | 1 s | eta 1 s\033[K" + "\r\033[K"
    )
