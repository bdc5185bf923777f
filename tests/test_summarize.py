"""`python common.py summarize RUN...` [issue 43, issue 53]: the test table and the best dev score
of one setting over several seeds, as mean ± sample standard deviation with n, checked against
numpy on three real tiny runs; runs that differ in more than seed, out_dir, resume and overwrite
are one line naming the fields."""
import dataclasses
import json

import numpy as np
import pytest

import common
import simcse_min
from conftest import tiny_config

SEEDS = (1, 2, 3)


@pytest.fixture(scope="module")
def runs(tiny_world, tmp_path_factory):
    """Three tiny SimCSE runs, seeds 1, 2, 3 (lr 1e-3: their tables differ) -> their folders."""
    tmp = tmp_path_factory.mktemp("seeds")
    folders = []
    for seed in SEEDS:
        folder = tmp / f"simcse-s{seed}"
        simcse_min.train(tiny_config(simcse_min, tiny_world, folder, max_steps=3, eval_every=2,
                                     lr=1e-3, seed=seed))
        folders.append(str(folder))
    return folders


def results(folder):
    return json.loads((common.Path(folder) / "results.json").read_text())


def test_mean_and_sample_std_as_numpy_computes_them(runs, capsys):
    table = common.cli(["summarize", *runs])
    tests = [results(f)["test"] for f in runs]
    assert len({t["Avg"] for t in tests}) == 3, "the seeds gave one table: nothing is checked"
    for task in [*common.TEST_TASKS, "Avg"]:
        values = np.array([t[task] for t in tests])
        assert table[task] == pytest.approx((values.mean(), values.std(ddof=1)), abs=1e-9)
    dev = np.array([results(f)["best_dev"] for f in runs])
    assert table["best dev"] == pytest.approx((dev.mean(), dev.std(ddof=1)), abs=1e-9)
    out = capsys.readouterr().out
    assert "3 runs (seeds 1, 2, 3)" in out and "n = 3" in out
    mean, std = table["Avg"]
    assert f"Avg  {mean:6.2f} ± {std:.2f}" in out  # the printed line, a task a line


def rewritten(tmp_path, folder, name, **changes):
    """A copy of the run's results.json with config fields (or `method`) changed."""
    r = results(folder)
    r["method"] = changes.pop("method", r["method"])
    r["config"] |= changes
    path = tmp_path / name / "results.json"
    path.parent.mkdir()
    path.write_text(json.dumps(r))
    return str(path)


def test_out_dir_resume_and_overwrite_may_differ(runs, tmp_path):
    other = rewritten(tmp_path, runs[2], "moved", out_dir="elsewhere", resume=True,
                      overwrite=True)
    table, seeds = common.summarize([runs[0], runs[1], other])
    assert seeds == [1, 2, 3] and table["Avg"] == common.summarize(runs)[0]["Avg"]


@pytest.mark.parametrize("changes, named", [
    (dict(lr=3e-5), "lr"), (dict(lr=3e-5, temp=0.1), "lr, temp"),
    (dict(method="esimcse"), "method"), (dict(dropout=0.2, seed=7), "dropout")])
def test_runs_of_another_setting_are_one_line_naming_the_fields(runs, tmp_path, changes, named):
    other = rewritten(tmp_path, runs[1], "other", **changes)
    with pytest.raises(common.UserError, match=f"differ in {named}: not seeds") as e:
        common.summarize([runs[0], other])
    assert "\n" not in str(e.value)


def test_a_field_one_run_lacks_is_a_difference(runs, tmp_path):
    r = results(runs[1])
    del r["config"]["temp"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "results.json").write_text(json.dumps(r))
    with pytest.raises(common.UserError, match="differ in temp"):
        common.summarize([runs[0], str(tmp_path / "old")])


def test_what_cannot_be_summarized_is_one_line(runs, tmp_path):
    with pytest.raises(common.UserError, match="2 runs at least"):
        common.summarize(runs[:1])
    with pytest.raises(common.UserError, match="seed 1 twice"):
        common.summarize([runs[0], runs[0]])
    with pytest.raises(common.UserError, match="does not exist"):
        common.summarize([runs[0], str(tmp_path / "nowhere")])
    r = results(runs[1]) | {"test": {}}
    (tmp_path / "none").mkdir()
    (tmp_path / "none" / "results.json").write_text(json.dumps(r))
    with pytest.raises(common.UserError, match="no test table"):
        common.summarize([runs[0], str(tmp_path / "none")])
    (tmp_path / "none" / "results.json").write_text(json.dumps(r | {"test": {"Avg": "75.3"}}))
    with pytest.raises(common.UserError, match="not a number"):
        common.summarize([runs[0], str(tmp_path / "none")])
    fields = {f.name for f in dataclasses.fields(simcse_min.Config)}
    assert set(common.RUN_FIELDS) <= fields  # the names it lets differ are a run's fields
