"""Issue 29: the transfer tasks give SentEval's own answers. tests/fixtures/transfer_senteval.json
was made by make_transfer_fixtures.py, running SentEval's transfer code (patched only to run on a
CPU) and scikit-learn: its loaders on files with every trap of the real formats, StratifiedKFold's
folds, and its three classifier schemes in both modes on synthetic vectors. Ours must match
exactly: each accuracy, each prediction, each fold."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import common
from fixtures.make_transfer_fixtures import synthetic, write_task_files

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "transfer_senteval.json").read_text())
RUNS = [(mode, i) for mode, c in FIXTURE["classifiers"].items() for i in range(len(c["runs"]))]


@pytest.mark.parametrize("case", FIXTURE["folds"], ids=lambda c: f"{c['name']}-k{c['k']}")
def test_folds_are_scikit_learns(case):
    folds = common.stratified_kfold(np.array(case["y"]), case["k"])
    assert [test.tolist() for _, test in folds] == case["test_idx"]
    rows = np.arange(len(case["y"]))
    assert all(np.array_equal(np.setdiff1d(rows, test), train) for train, test in folds)


def senteval_reading(task):
    """The fixture's record of SentEval's loader, in load_transfer's shape."""
    got = FIXTURE["loaders"][task]
    if task in common.BINARY_FILES:
        return {"all": (got["samples"], got["labels"])}
    if task == "MRPC":
        return {s: ([tuple(p) for p in zip(d["X_A"], d["X_B"])], d["y"]) for s, d in got.items()}
    return {s: (d["X"], d["y"]) for s, d in got.items()}


@pytest.mark.parametrize("task", common.TRANSFER_TASKS)
def test_files_read_as_senteval_reads_them(task, tmp_path):
    """latin-1 bytes, 0x85 and the other breaks of str.splitlines() (binary tasks: SentEval's
    read().splitlines(); the others: `for line in f`), empty lines, runs of white space, \\r\\n,
    a lone \\r, TREC's fine label, MRPC's header, UTF-8 in SST and MRPC."""
    write_task_files(tmp_path)
    got = common.load_transfer(tmp_path, task)
    assert {s: (list(x), list(y)) for s, (x, y) in got.items()} == senteval_reading(task)


@pytest.fixture
def one_thread():
    """Tiny batched fits: a second thread only waits, 20x slower while another process holds a
    core (the mutation check runs two at a time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("mode,i", RUNS, ids=[
    f"{m}-{FIXTURE['classifiers'][m]['runs'][i]['scheme']}" for m, i in RUNS])
def test_accuracies_are_senteval_s(mode, i, one_thread):
    run = FIXTURE["classifiers"][mode]["runs"][i]
    X, y = synthetic(**run["data"])
    splits = {{"valid": "dev"}.get(s, s): (X[a:b], y[a:b]) for s, (a, b) in run["splits"].items()}
    if run["scheme"] == "inner":
        assert common.inner_kfold({"all": splits["train"]}, mode) == (run["devacc"], run["testacc"])
    elif run["scheme"] == "split":
        assert common.dev_split(splits, mode) == (run["devacc"], run["testacc"])
    else:
        dev, test, yhat = common.kfold_refit(splits, mode)
        assert (dev, test, yhat.tolist()) == (run["devacc"], run["testacc"], run["yhat"])
        if "f1" in run:
            assert common.f1_percent(splits["test"][1], yhat) == run["f1"]


@pytest.mark.parametrize("mode", list(FIXTURE["classifiers"]))
def test_every_inner_fit_reaches_senteval_s_best_dev_accuracy(mode, one_thread):
    """Each of the k x 4 x k inner fits of MR's scheme on its own, in SentEval's order (outer fold,
    L2 weight, inner fold): its best dev accuracy, SentEval's fit() return value."""
    run = next(r for r in FIXTURE["classifiers"][mode]["runs"] if r["scheme"] == "inner")
    X, y = synthetic(**run["data"])
    k, stacked, labels, _ = common.TRANSFER_MODES[mode]["kfold"], *common.stack({"all": (X, y)},
                                                                                 "cpu")
    fits = [(rows[a], rows[b], l2) for rows, _ in common.stratified_kfold(y, k)
            for l2 in common.L2_GRID for a, b in common.stratified_kfold(y[rows], k)]
    _, correct, n = common.fit_logregs(stacked, labels, fits, mode)
    per_outer = len(common.L2_GRID) * k + 1  # SentEval fits the outer fold's refit after these
    want = [a for i, a in enumerate(run["fit_devacc"]) if (i + 1) % per_outer]
    assert [round(c / m, 6) for c, m in zip(correct, n)] == want
