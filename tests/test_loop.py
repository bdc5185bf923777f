"""The loop pieces, each checked for the property it is named for, directly: the optimizer is the
official AdamW (betas, eps, no weight decay) with a linear decay that ends at 0; a gradient above
1.0 is cut to 1.0 before the step; the gradients are cleared after it; each epoch draws its own
order of full batches from the seed; a later, worse evaluation never replaces the best model, which
is the model saved and tested; the best step is the first of equal scores, and a dev score that
is not a number (NaN) never selects the model (results.json strict JSON, NaN written as null). The
oracles: the official trainer's settings, torch's own clip_grad_norm_, and the scores fed in."""
import json
import math

import pytest
import torch

import common
from conftest import tiny_config

CPU = torch.device("cpu")


def test_adamw_as_the_official_trainer_sets_it_decaying_linearly_to_zero():
    p = torch.nn.Parameter(torch.ones(3))
    opt, sched = common.make_optimizer([p], 3e-5, 10, CPU)
    group = opt.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.999), 1e-8, 0.0)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.ones(3)
        opt.step(), sched.step()
    assert lrs == pytest.approx([3e-5 * (1 - s / 10) for s
                                 in range(10)]) and opt.param_groups[0]["lr"] == 0.0


def grad_norms_at_the_step(scale):
    """One optimizer_step on a loss whose gradient norm is `scale` -> (gradient norm the optimizer
    saw, grads after, lr after)."""
    p = torch.nn.Parameter(torch.zeros(4))
    opt, sched = common.make_optimizer([p], 1e-3, 10, CPU)
    seen = []
    opt.register_step_pre_hook(lambda *_: seen.append(float(torch.linalg.vector_norm(p.grad))))
    common.optimizer_step((p * torch.tensor([scale, 0.0, 0.0, 0.0])).sum(), opt, sched,
                          common.MixedPrecision("fp32", CPU))
    return seen[0], p.grad, opt.param_groups[0]["lr"]


def test_a_gradient_above_the_threshold_is_cut_to_it_and_one_below_is_left():
    assert grad_norms_at_the_step(62.0)[0] == pytest.approx(1.0)
    assert grad_norms_at_the_step(0.5)[0] == pytest.approx(0.5)


def test_the_step_clears_the_gradients_and_moves_the_schedule():
    _, grad, lr = grad_norms_at_the_step(3.0)
    assert grad is None and lr == pytest.approx(1e-3 * 0.9)


def batch_orders(seed, n_rows=20, batch_size=4, total=10):
    """The row order epoch_batches draws (each row's id list is its row number) -> one list per
    epoch."""
    fields = ["seed", "batch_size", "epochs", "max_steps", "compile"]
    cfg = common.dataclasses.make_dataclass("Cfg", fields)(seed, batch_size, 100, total, False)
    assert common.total_steps(n_rows, cfg) == total
    data = [[[i + 10]] for i in range(n_rows)]
    tok = common.Tokenizer({"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4})
    batches = [ids[:, 0, 0].tolist() for ids, _ in common.epoch_batches(data, tok, cfg, 0, total)]
    assert all(len(b) == batch_size for b in batches)  # full batches only
    rows = [r - 10 for b in batches for r in b]
    epoch = n_rows // batch_size * batch_size
    return [rows[i:i + epoch] for i in range(0, len(rows), epoch)]


def test_each_epoch_draws_its_own_order_of_full_batches_from_the_seed():
    first, second = batch_orders(seed=42)
    assert sorted(first) == sorted(second) == list(range(20))  # every row once an epoch
    assert first != second  # a fresh permutation per epoch
    # the seed decides
    assert batch_orders(seed=42) == [first, second] and batch_orders(seed=7)[0] != first
    assert len(batch_orders(seed=42, n_rows=22)[0]) == 20  # the 2 rows of a short last batch wait


def test_a_later_worse_evaluation_never_replaces_the_best_model(world, tmp_path, monkeypatch):
    """Dev scores 50, 70, 60, 65 at steps 0-3: the model of step 1 is the one kept, tested and
    saved."""
    import simcse_min
    scores, states = iter([50.0, 70.0, 60.0, 65.0]), {}

    def evaluate_dev(model, dev, pooler, progress=None):
        states[len(states)] = {k: v.clone() for k, v in model.state_dict().items()}
        return {"stsb_dev": next(scores), "align": 0.5, "uniform": -2.0}
    monkeypatch.setattr(simcse_min, "evaluate_dev", evaluate_dev)
    out = tmp_path / "out"
    results = simcse_min.train(tiny_config(simcse_min, world, out, max_steps=3))
    assert (results["best_step"], results["best_dev"]) == (1, 70.0)
    saved = common.Bert.from_pretrained(out).state_dict()
    assert "pooler.dense.weight" in states[1]  # the MLP head, saved as BERT's pooler [issue 41]
    assert all(torch.equal(saved[k], v) for k, v in states[1].items())
    assert not all(torch.equal(saved[k], v) for k, v in states[3].items())
    assert math.isfinite(results["test"]["Avg"])


def test_shard_takes_this_ranks_block_of_each_view(monkeypatch):
    """Rank 1 of 2, two views of B = 4: rows 2-3 of each view, in order (all_gather puts them back
    there)."""
    monkeypatch.setattr(common, "world", lambda: (1, 2))
    x = torch.arange(8)[:, None]  # [views * B, 1], view-major
    assert common.shard(x, views=2).flatten().tolist() == [2, 3, 6, 7]


def test_all_gather_backward_sums_over_ranks_and_keeps_this_ranks_slice(monkeypatch):
    """Each rank's loss is the whole batch's: rank r's gradient is the sum over ranks of dL, its own
    rows."""
    monkeypatch.setattr(common, "world", lambda: (1, 2))
    # the other rank sent the same
    monkeypatch.setattr(common.dist, "all_reduce", lambda t: t.mul_(2))
    grad = torch.arange(8.0).view(2, 4, 1)  # [views, N*b, 1]
    out = common.AllGather.backward(None, grad)
    assert out.flatten().tolist() == [4.0, 6.0, 12.0, 14.0]


def strict_json(path):
    def refuse(token):
        raise ValueError(f"{path} holds {token}, which strict JSON does not have")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("scores", [[math.nan, 5.0, math.nan, 4.0, math.nan], [math.nan] * 5])
def test_a_dev_score_that_is_not_a_number_is_never_best(scores, world, tmp_path, monkeypatch):
    import simcse_min
    given = iter(scores)
    monkeypatch.setattr(simcse_min, "evaluate_dev", lambda model, dev, pooler, progress=None: {
        "stsb_dev": next(given), "align": 0.5, "uniform": -2.0})
    out = tmp_path / "out"
    simcse_min.train(tiny_config(simcse_min, world, out, max_steps=4))
    results = strict_json(out / "results.json")  # NaN and -inf written as null
    finite = [(s, d) for s, d in enumerate(scores) if math.isfinite(d)]
    best_step, best_dev = max(finite, key=lambda x: x[1]) if finite else (0, None)
    assert (results["best_step"], results["best_dev"]) == (best_step, best_dev)
    assert [d for _, d in results["dev_history"]] == [d if math.isfinite(d) else None for d
                                                      in scores]


def test_the_best_step_is_the_first_of_equal_or_undefined_scores():
    model, best = torch.nn.Linear(2, 2), dict(dev=-math.inf, step=0, state=None)
    for step, dev, kept in ((10, math.nan, 10), (20, math.nan, 10), (30, 50.0, 30),
                            (40, 50.0, 30), (50, 49.0, 30)):
        common.keep_best(best, step, dev, model)
        assert best["step"] == kept and best["state"] is not None and best["dev"] != -math.inf
