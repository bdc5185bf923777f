"""SimCSE's loss against a float64 loop oracle of the paper's equation, gradcheck, identities, and a
loss-falls-on-a-repeated-batch check (llm.c style)."""
import math

import pytest
import torch

import common
from conftest import cos
from simcse_min import MLPHead, info_nce, loss_fn, make_views, train_step, Config
from tiny_world import sentence, tokenizer



def info_nce_loop(h1, h2, temp, h3=None, hard_weight=0.0):
    """-1/B sum_i log( e^{cos(h1_i,h2_i)/τ} / (sum_j e^{cos(h1_i,h2_j)/τ} + sum_j
    e^{cos(h1_i,h3_j)/τ + w[i=j]}) )."""
    B, total = len(h1), 0.0
    for i in range(B):
        denom = sum(torch.exp(cos(h1[i], h2[j]) / temp) for j in range(B))
        if h3 is not None:
            denom = denom + sum(torch.exp(cos(h1[i], h3[j]) / temp + hard_weight * (i == j)) for j
                                in range(B))
        total = total - torch.log(torch.exp(cos(h1[i], h2[i]) / temp) / denom)
    return total / B


@pytest.mark.parametrize("hard", [False, True])
def test_info_nce_matches_loop_values_and_gradients(hard):
    torch.manual_seed(0)
    h1, h2, h3 = (torch.randn(4, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    args = (h3, 0.7) if hard else ()
    ours = info_nce(h1, h2, 0.05, *args)
    ref = info_nce_loop(h1, h2, 0.05, *args)
    assert torch.allclose(ours.double(), ref, atol=1e-6, rtol=1e-6)
    g_ours = torch.autograd.grad(ours, (h1, h2, h3) if hard else (h1, h2))
    g_ref = torch.autograd.grad(ref, (h1, h2, h3) if hard else (h1, h2))
    for a, b in zip(g_ours, g_ref):
        assert torch.allclose(a.double(), b, atol=1e-5, rtol=1e-5)


def test_info_nce_gradcheck():
    torch.manual_seed(0)
    h1, h2, h3 = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    # noqa: E731  the oracle is differentiable ...
    f64 = lambda a, b, c: info_nce_loop(a, b, 0.5, c, 0.3)
    assert torch.autograd.gradcheck(f64, (h1, h2, h3))
    # ... and ours
    assert torch.autograd.gradcheck(lambda a, b, c: info_nce(a, b, 0.5, c, 0.3), (h1, h2, h3))
    assert torch.autograd.gradcheck(lambda a, b: info_nce(a, b, 0.5), (h1, h2))


@pytest.mark.parametrize("B", [2, 4, 16])
def test_identical_rows_give_log_B(B):
    h = torch.randn(1, 8).expand(B, 8)
    assert math.isclose(info_nce(h, h, 0.05).item(), math.log(B), rel_tol=1e-5)


def test_loss_fn_uses_third_view_as_hard_negatives():
    torch.manual_seed(0)
    h = torch.randn(3, 4, 8)
    loss, stats = loss_fn(h, 0.05, 0.2)
    assert torch.equal(loss, info_nce(h[0], h[1], 0.05, h[2],
                                      0.2)) and stats["loss"] == loss.detach()
    assert torch.equal(loss_fn(h[:2], 0.05)[0], info_nce(h[0], h[1], 0.05))


def test_make_views_unsupervised_duplicates_supervised_keeps_columns():
    ids = torch.arange(2 * 1 * 3).view(2, 1, 3)
    v, m = make_views(ids, torch.ones_like(ids))
    assert v.tolist() == [[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]] and m.shape == (4, 3)
    ids = torch.arange(2 * 3 * 2).view(2, 3, 2)  # 2 rows x (sentence, entailment, contradiction)
    v, _ = make_views(ids, torch.ones_like(ids))
    assert v.tolist() == [[0, 1], [6, 7], [2, 3], [8, 9], [4, 5], [10, 11]]


def test_two_views_differ_only_by_dropout():
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)))
    ids, mask = tok(["a man is playing a guitar ."])
    v_ids, v_mask = make_views(ids[:, None], mask[:, None])
    model.train()
    h = model(v_ids, v_mask)[:, 0]
    assert not torch.allclose(h[0], h[1])
    model.eval()
    h = model(v_ids, v_mask)[:, 0]
    assert torch.allclose(h[0], h[1])


def test_loss_falls_on_a_repeated_batch():
    import random
    torch.manual_seed(0)
    tok, rng = tokenizer(), random.Random(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab), hidden_size=64))
    head = MLPHead(64)
    ids, mask = tok([sentence(rng) for _ in range(16)], max_len=32)
    ids, mask = ids[:, None], mask[:, None]
    opt, sched = common.make_optimizer([*model.parameters(), *head.parameters()], 1e-3, 1000,
                                       torch.device("cpu"))
    cfg, losses = Config(), []
    model.train()
    # a tiny random BERT sits at log B (chance) for a while before it separates sentences
    for _ in range(100):
        loss, _ = train_step(model, head, ids, mask, cfg)
        assert torch.isfinite(loss)
        losses.append(loss.item())
        common.optimizer_step(loss, opt, sched, common.MixedPrecision("fp32", torch.device("cpu")))
    assert max(losses[-10:]) < math.log(16) - 1.0, losses  # well below chance, log B


def test_loss_math_runs_in_fp32_under_bf16_autocast(monkeypatch):
    # DESIGN: bf16 autocast for the encoder, the similarity/softmax math in fp32. Under autocast a
    # matmul of fp32 tensors still runs in bf16, so train_step must switch autocast off around
    # loss_fn, not only upcast.
    import simcse_min
    tok, seen = tokenizer(), {}
    model, head = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab))), MLPHead(32)
    ids, mask = tok(["a man is playing a guitar .", "the cat sat on the mat .", "rain falls ."])

    def spy(h, *args):
        seen.update(dtype=h.dtype, autocast=torch.is_autocast_enabled("cpu"))
        return loss_fn(h, *args)
    monkeypatch.setattr(simcse_min, "loss_fn", spy)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = train_step(model, head, ids[:, None], mask[:, None], Config())
    assert seen == {"dtype": torch.float32, "autocast": False} and loss.dtype == torch.float32
