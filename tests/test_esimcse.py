"""ESimCSE: the queue loss against a float64 loop oracle of Eq. 6 and gradcheck, sub-word repetition
against the official length rule, and one training step's momentum update and queue, on a tiny
BERT."""
import collections
import dataclasses
import itertools
import random

import pytest
import torch

import common
import simcse_min
from conftest import cos
from esimcse_min import (Config, MLPHead, info_nce_with_queue, loss_fn, make_views,
                         momentum_encoder,
                         momentum_update, repeat_subwords, train, train_step)
from tiny_world import sentence, tokenizer

CLS, SEP = 2, 3  # tiny_world's vocabulary: [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4



def info_nce_with_queue_loop(h1, h2, queue, temp):
    """-1/B sum_i log( e^{cos(h1_i,h2_i)/τ} / (sum_j e^{cos(h1_i,h2_j)/τ} + sum_m
    e^{cos(h1_i,q_m)/τ}) )  [Eq. 6]."""
    B, total = len(h1), 0.0
    for i in range(B):
        denom = sum(torch.exp(cos(h1[i], h2[j]) / temp) for j in range(B))
        denom = denom + sum(torch.exp(cos(h1[i], q) / temp) for q in queue)
        total = total - torch.log(torch.exp(cos(h1[i], h2[i]) / temp) / denom)
    return total / B


@pytest.mark.parametrize("M", [0, 3, 7])
def test_info_nce_with_queue_matches_loop_values_and_gradients(M):
    torch.manual_seed(M)
    h1, h2 = (torch.randn(4, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    queue = torch.randn(M, 8, dtype=torch.float64)
    ours, ref = info_nce_with_queue(h1, h2, queue, 0.05), info_nce_with_queue_loop(h1, h2, queue,
                                                                                   0.05)
    assert torch.allclose(ours.double(), ref, atol=1e-6, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(ours, (h1, h2)), torch.autograd.grad(ref, (h1, h2))):
        assert torch.allclose(a.double(), b, atol=1e-5, rtol=1e-5)


def test_info_nce_with_queue_gradcheck():
    torch.manual_seed(0)
    h1, h2 = (torch.randn(3, 5, dtype=torch.float64, requires_grad=True) for _ in range(2))
    queue = torch.randn(4, 5, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: info_nce_with_queue_loop(a, b, queue, 0.5), (h1,
                                                                                              h2))
    assert torch.autograd.gradcheck(lambda a, b: info_nce_with_queue(a, b, queue, 0.5), (h1, h2))
    assert torch.autograd.gradcheck(lambda a, b: info_nce_with_queue(a, b, queue[:0], 0.5), (h1,
                                                                                             h2))


def test_empty_queue_is_simcse():
    torch.manual_seed(0)
    h = torch.randn(2, 6, 8)
    loss, stats = loss_fn(h, torch.zeros(0, 8), 0.05)
    assert torch.equal(loss, simcse_min.info_nce(h[0], h[1], 0.05)) and stats["loss"] == loss
    assert torch.equal(info_nce_with_queue(h[0], h[1], torch.zeros(0, 8), 0.05),
                       simcse_min.loss_fn(h, 0.05)[0])


def lengths_1_to_32():
    """32 rows, row n-1 of real length n: [CLS] 5 6 ... [SEP] (distinct inner ids), padded with 0 to
    32."""
    ids, mask = torch.zeros(32, 32, dtype=torch.long), torch.zeros(32, 32, dtype=torch.long)
    for n in range(1, 33):
        row = [CLS] + list(range(5, 5 + n - 2)) + [SEP] if n > 1 else [CLS]
        ids[n - 1, :n], mask[n - 1, :n] = torch.tensor(row), 1
    return ids, mask


def test_repeat_subwords_follows_the_official_rule():
    ids, mask = lengths_1_to_32()
    rng, seen_max = random.Random(0), collections.defaultdict(int)
    for _ in range(200):
        new_ids, new_mask = repeat_subwords(ids, mask, 0.32, rng)
        assert new_ids.shape == new_mask.shape and new_ids.dtype == ids.dtype
        for n in range(1, 33):
            m = int(new_mask[n - 1].sum())
            # mask = the new length
            assert new_mask[n - 1].tolist() == [1] * m + [0] * (new_mask.size(1) - m)
            assert (new_ids[n - 1, m:] == 0).all()  # padding stays padding
            row, orig = new_ids[n - 1, :m].tolist(), ids[n - 1, :n].tolist()
            groups = [(t, len(list(g))) for t, g in itertools.groupby(row)]
            # order kept: dropping adjacent duplicates gives the original
            assert [t for t, _ in groups] == orig
            assert all(c <= 2 for _, c in groups)  # each token at most twice, side by side
            assert row.count(CLS) == 1 and row[0] == CLS and (n == 1 or (row.count(SEP) == 1
                                                                         and row[-1] == SEP))
            dup, k = m - n, int(0.32 * n)
            assert 0 <= dup <= max(0, min(10, k) - 1) and (k > 0 or dup == 0)
            seen_max[n] = max(seen_max[n], dup)
    # the whole range randrange(min(10, k))
    assert seen_max[32] == 9 and seen_max[10] == 2 and seen_max[6] == 0


def test_repeat_subwords_is_seeded_and_resampled_every_step():
    ids, mask = lengths_1_to_32()
    a, b = random.Random(7), random.Random(7)
    first = [repeat_subwords(ids, mask, 0.32, a)[0] for _ in range(3)]
    again = [repeat_subwords(ids, mask, 0.32, b)[0] for _ in range(3)]
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not torch.equal(first[0], first[1]) and not torch.equal(first[1], first[2])
    assert torch.equal(repeat_subwords(ids, mask, 0.0, a)[0], ids)  # dup_rate 0: no repetition


def test_make_views_pads_both_views_to_one_width():
    tok = tokenizer()
    ids, mask = tok([sentence(random.Random(i)) for i in range(6)], max_len=32)
    v_ids, v_mask = make_views(ids[:, None], mask[:, None], 0.32, random.Random(1))
    assert v_ids.shape == v_mask.shape and v_ids.size(0) == 12 and v_ids.size(1) >= ids.size(1)
    assert torch.equal(v_ids[:6, :ids.size(1)], ids) and (v_ids[:6, ids.size(1):] == 0).all()
    assert torch.equal(v_mask[:6].sum(1), mask.sum(1)) and (v_mask[6:].sum(1) >= mask.sum(1)).all()
    # dup_rate 0: exactly SimCSE's views
    s_ids, s_mask = simcse_min.make_views(ids[:, None], mask[:, None])
    assert all(torch.equal(a, b) for a, b in zip(make_views(ids[:, None], mask[:, None], 0.0, None),
                                                 (s_ids, s_mask)))


def tiny_setup(B=4, seed=0):
    torch.manual_seed(seed)
    tok, rng = tokenizer(), random.Random(seed)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)))
    head = MLPHead(model.cfg.hidden_size)
    batches = [tok([sentence(rng) for _ in range(B)], max_len=32) for _ in range(4)]
    return model, head, [(ids[:, None], mask[:, None]) for ids, mask in batches]


def test_one_step_moves_the_momentum_encoder_and_fills_the_queue():
    model, head, batches = tiny_setup()
    cfg = Config(queue_size=6, momentum=0.9)
    momentum, queue, rng = (
        momentum_encoder(model),
        collections.deque(maxlen=cfg.queue_size),
        random.Random(0),
    )
    assert not momentum.training and not any(p.requires_grad for p in momentum.parameters())
    # the loaded weights
    assert all(torch.equal(a, b) for a, b in zip(momentum.parameters(), model.parameters()))
    opt, sched = common.make_optimizer([*model.parameters(), *head.parameters()], 1e-3, 100,
                                       torch.device("cpu"))
    model.train(), head.train()
    expected = []
    for ids, mask in batches:
        # what this step should enqueue: the momentum vectors before its update
        with torch.no_grad():
            expected += head(momentum(ids[:, 0], mask[:, 0])[:, 0]).unbind()
        old = [p.detach().clone() for p in momentum.parameters()]
        loss, _ = train_step(model, head, ids, mask, cfg, momentum, queue, rng)
        common.optimizer_step(loss, opt, sched, common.MixedPrecision("fp32", torch.device("cpu")))
        momentum_update(momentum, model, cfg.momentum)
        assert all(p.grad is None for p in momentum.parameters())
        for m, o, p in zip(momentum.parameters(), old, model.parameters()):
            # lerp: last bits
            torch.testing.assert_close(m, 0.9 * o + (1 - 0.9) * p, rtol=1e-6, atol=1e-7)
        # never more than queue_size, the newest rows in order
        assert len(queue) == min(len(expected), 6)
        # cls_only: ~1e-7
        assert all(torch.allclose(q, e, atol=1e-6, rtol=0) for q, e in zip(queue, expected[-6:]))
    # it lags behind
    assert not all(torch.equal(m, p) for m, p in zip(momentum.parameters(), model.parameters()))


def test_no_repetition_and_no_queue_is_simcse():
    model, head, batches = tiny_setup()
    ids, mask = batches[0]
    model.train()
    torch.manual_seed(3)
    ours, _ = train_step(model, head, ids, mask, Config(dup_rate=0, queue_size=0), None,
                         collections.deque(maxlen=0),
                         random.Random(0))
    torch.manual_seed(3)
    theirs, _ = simcse_min.train_step(model, head, ids, mask, simcse_min.Config())
    assert torch.equal(ours, theirs)


def test_train_end_to_end_on_tiny_world_and_rejects_csv(world, tmp_path):
    cfg = Config(model=world["model"], data=world["data"], senteval=world["senteval"], device="cpu",
                 batch_size=8,
                 epochs=2, eval_every=4, queue_size=12, out_dir=str(tmp_path / "out"))
    results = train(cfg)
    assert results["method"] == "esimcse" and [s for s, _ in results["dev_history"]] == [0, 4, 8,
                                                                                         12]
    assert all(torch.isfinite(torch.tensor(v)) for v in results["test"].values())
    csv = tmp_path / "nli.csv"
    csv.write_text("".join(f"{sentence(random.Random(i))},{sentence(random.Random(-i))}\n" for i
                           in range(16)))
    with pytest.raises(common.UserError, match="unsupervised"):
        train(dataclasses.replace(cfg, data=str(csv), out_dir=str(tmp_path / "out-csv")))
