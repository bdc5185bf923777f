"""What `python common.py summarize RUN...` is given that is not two finished runs of one setting
[issue 63]: a run that stopped itself, a task one table lacks, a folder, FIFO or huge file named
results.json, a score too large for a float. Each is one line naming the run; nothing is averaged
in without a word. Also the huge config.json of a model folder, read by the same reader."""
import json
import os

import pytest

import common

RUN = {"method": "simcse", "config": {"seed": 1, "lr": 3e-5}, "best_dev": 80.0, "best_step": 250,
       "test": {"STS12": 70.0, "STS15": 72.0, "Avg": 71.0}}  # a finished run's results.json, short


def run_folder(tmp_path, name, **changes):
    """A folder holding RUN's results.json (seed 2: another seed), with `changes`."""
    folder = tmp_path / name
    folder.mkdir()
    r = json.loads(json.dumps(RUN)) | {"config": {"seed": 2, "lr": 3e-5}} | changes
    (folder / "results.json").write_text(json.dumps(r))
    return str(folder)


def refused(tmp_path, other, *says):
    first = run_folder(tmp_path, "first", config=RUN["config"])
    with pytest.raises(common.UserError) as e:
        common.summarize([first, other])
    assert "\n" not in str(e.value) and all(s in str(e.value) for s in says), str(e.value)


def test_two_finished_runs_are_summarized(tmp_path):
    first = run_folder(tmp_path, "first", config=RUN["config"])
    table, seeds = common.summarize([first, run_folder(tmp_path, "second", best_dev=82.0)])
    assert seeds == [1, 2] and table["best dev"][0] == 81.0


def test_a_run_that_stopped_itself_is_named_not_averaged(tmp_path):
    """A non-finite loss stopped it: its table is of an unfinished run, not of the setting."""
    stopped = run_folder(tmp_path, "stopped", stopped="the loss is nan at step 300")
    refused(tmp_path, stopped, stopped, "stopped", "the loss is nan at step 300")


def test_a_task_one_table_lacks_is_named(tmp_path):
    short = run_folder(tmp_path, "short", test={"STS12": 70.0, "Avg": 71.0})
    refused(tmp_path, short, short, "STS15")


@pytest.mark.parametrize("kind, says", [("folder", "is a directory"),
                                        ("fifo", "not a regular file (a FIFO")])
def test_a_results_json_that_is_no_file_is_named_for_what_it_is(tmp_path, kind, says):
    folder = tmp_path / "odd"
    folder.mkdir()
    if kind == "folder":
        (folder / "results.json").mkdir()
    else:
        os.mkfifo(folder / "results.json")  # read, it would wait for ever
    refused(tmp_path, str(folder), says)


def test_a_huge_results_json_is_one_line_before_it_is_read(tmp_path):
    folder = tmp_path / "huge"
    folder.mkdir()
    with open(folder / "results.json", "w") as f:
        os.truncate(f.fileno(), 2**40)  # 1 TiB, sparse: read whole, a MemoryError
    refused(tmp_path, str(folder), "too large")


def test_a_huge_config_json_is_one_line_before_it_is_read(model_dir, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for f in model_dir.iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    os.truncate(folder / "config.json", 2**40)
    with pytest.raises(common.UserError, match="too large"):
        common.read_config(folder)


@pytest.mark.parametrize("field, value", [("best_dev", 10**400), ("test", {"STS12": 10**400,
                                                                            "STS15": 72.0,
                                                                            "Avg": 71.0})])
def test_a_score_too_large_for_a_float_is_one_line(tmp_path, field, value):
    refused(tmp_path, run_folder(tmp_path, "big", **{field: value}), "not a number")
