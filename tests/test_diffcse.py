"""DiffCSE: the RTD loss against a loop, the masking statistics, the conditioning path and the
frozen generator."""
import copy

import pytest
import torch
import torch.nn.functional as F

import common
from common import Bert, BertConfig
from diffcse_min import (BNProjector, Config, Discriminator, corrupt, info_nce, loss_fn,
                         mask_tokens, rtd_loss)

TOK = common.Tokenizer({w: i for i, w in enumerate([*common.SPECIAL_TOKENS, *(f"w{i}" for i
                                                                              in range(123))])})
SPECIAL = (TOK.cls_id, TOK.sep_id)


def sentences(B, L, seed=0, vocab=128):
    """[CLS] w... [SEP] then padding: ids, mask [B, L] with lengths from 3 to L."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, L + 1, (B,), generator=g)
    ids = torch.randint(5, vocab, (B, L), generator=g)
    mask = (torch.arange(L) < lengths[:, None]).long()
    ids[:, 0] = TOK.cls_id
    ids[torch.arange(B), lengths - 1] = TOK.sep_id
    return ids * mask, mask  # [PAD] is id 0


def tiny_models(seed=0):
    torch.manual_seed(seed)
    model = Bert(BertConfig.tiny())
    disc = Discriminator(copy.deepcopy(model))
    generator = Bert(BertConfig.tiny(), mlm_head=True).requires_grad_(False)
    return model, BNProjector(model.cfg.hidden_size), disc, generator


def test_rtd_loss_equals_loop_and_gradcheck():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 2, dtype=torch.double, requires_grad=True)
    labels = torch.randint(0, 2, (3, 5))
    # the longest row: all 5 columns
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    ref = sum(-torch.log_softmax(logits[n, t], -1)[labels[n, t]] for n in range(3) for t
              in range(5)) / 15
    torch.testing.assert_close(rtd_loss(logits, labels, mask), ref)
    g, = torch.autograd.grad(rtd_loss(logits, labels, mask), logits)
    g_ref, = torch.autograd.grad(ref, logits)
    torch.testing.assert_close(g, g_ref)
    assert torch.autograd.gradcheck(lambda x: rtd_loss(x, labels, mask), (logits,))


def test_rtd_loss_is_unchanged_by_padding_past_the_longest_sentence():
    """--compile pads every batch to max_len: the extra columns (whatever their logits) must not
    move the
    loss, which stays the official mean over N x (longest sentence), padding within it included."""
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 6, 2, dtype=torch.double), torch.randint(0, 2, (4, 6))
    mask = (torch.arange(6) < torch.tensor([[6], [3], [5], [2]])).long()
    labels = labels * mask
    padded = torch.cat([logits, torch.randn(4, 10, 2, dtype=torch.double)], 1)  # 10 more columns
    padded_labels, padded_mask = (torch.cat([t, torch.zeros(4, 10, dtype=t.dtype)], 1) for t
                                  in (labels, mask))
    loss = rtd_loss(logits, labels, mask)
    torch.testing.assert_close(rtd_loss(padded, padded_labels, padded_mask), loss, rtol=1e-14,
                               atol=0)
    # the official mean
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), labels.flatten()))
    h = torch.randn(2, 2, 8, dtype=torch.double)
    (a, stats_a), (b, stats_b) = (loss_fn(h, *x, 0.05, 0.1) for x in [(logits, labels, mask),
                                                                    (padded, padded_labels,
                                                                     padded_mask)])
    torch.testing.assert_close(a, b, rtol=1e-14, atol=0)
    assert stats_a.keys() == stats_b.keys()
    for k in stats_a:
        torch.testing.assert_close(stats_a[k], stats_b[k], rtol=1e-14, atol=0)


def test_lambda_zero_is_info_nce_and_stats_count_real_tokens():
    torch.manual_seed(0)
    h, logits = torch.randn(2, 4, 8), torch.randn(8, 6, 2)
    labels = torch.randint(0, 2, (8, 6))
    mask = torch.ones(8, 6, dtype=torch.long)
    mask[:, 4:] = 0
    labels = labels * mask
    loss, stats = loss_fn(h, logits, labels, mask, 0.05, 0.0)
    torch.testing.assert_close(loss, info_nce(h[0], h[1], 0.05))
    loss1, _ = loss_fn(h, logits, labels, mask, 0.05, 0.5)
    # padded to the longest: 4
    official = F.cross_entropy(logits[:, :4].flatten(0, 1), labels[:, :4].flatten())
    torch.testing.assert_close(loss1, loss + 0.5 * official)
    pred, real = logits.argmax(-1), mask.bool()
    rep, kept = real & (labels == 1), real & (labels == 0)
    assert stats["acc_replaced"] == pytest.approx((pred[rep] == 1).float().mean().item())
    assert stats["acc_kept"] == pytest.approx((pred[kept] == 0).float().mean().item())
    assert stats["replaced"] == pytest.approx(rep.sum().item() / real.sum().item())


def test_mask_tokens_statistics():
    ids, mask = sentences(512, 48, seed=1, vocab=30522)
    maskable = mask.bool() & (ids != TOK.cls_id) & (ids != TOK.sep_id)
    gen = torch.Generator().manual_seed(0)
    n = chosen_n = to_mask = to_random = 0
    for _ in range(6):
        out, chosen = mask_tokens(ids, mask, 0.30, TOK.mask_id, 30522, SPECIAL, gen)
        assert not (chosen & ~maskable).any(), "a special token or padding was chosen"
        assert torch.equal(out[~maskable], ids[~maskable]) and torch.equal(out[~chosen],
                                                                           ids[~chosen])
        n, chosen_n = n + maskable.sum().item(), chosen_n + chosen.sum().item()
        to_mask += (chosen & (out == TOK.mask_id)).sum().item()
        to_random += (chosen & (out != TOK.mask_id) & (out != ids)).sum().item()
    assert abs(chosen_n / n - 0.30) < 0.01
    assert abs(to_mask / chosen_n - 0.8) < 0.02 and abs(to_random / chosen_n - 0.1) < 0.02
    assert abs(1 - (to_mask + to_random) / chosen_n - 0.1) < 0.02  # kept as they were


def test_mask_tokens_seeded_and_each_view_on_its_own():
    ids, mask = sentences(4, 20, seed=2)
    # the same sentences twice, as make_views stacks them
    views = ids.repeat(2, 1), mask.repeat(2, 1)
    a, ca = mask_tokens(*views, 0.3, TOK.mask_id, 128, SPECIAL, torch.Generator().manual_seed(7))
    b, cb = mask_tokens(*views, 0.3, TOK.mask_id, 128, SPECIAL, torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and torch.equal(ca, cb)
    assert not torch.equal(ca[:4], ca[4:]), "both views got the same mask"


def test_corrupt_restores_cls_keeps_pads_and_labels_changes():
    _, _, _, generator = tiny_models()
    ids, mask = sentences(6, 12, seed=3)
    cfg = Config(mask_ratio=0.3)
    masked, _ = mask_tokens(ids, mask, cfg.mask_ratio, TOK.mask_id, 128, SPECIAL,
                            torch.Generator().manual_seed(0))
    x2, labels = corrupt(generator, masked, ids, mask, TOK)
    assert torch.equal(x2[:, 0], ids[:, 0]) and torch.equal(x2[mask == 0], ids[mask == 0])
    assert torch.equal(labels, (x2 != ids).long()) and not labels[mask == 0].any() and labels.any()


class PerfectGenerator:
    """Fills every position with the original token, [MASK]ed or not: a generator that never
    errs."""

    def __init__(self, ids):
        self.ids = ids

    def __call__(self, masked, mask):
        return self.ids

    def mlm_logits(self, h):
        return F.one_hot(h, 128).float()


def test_a_token_the_generator_restores_is_labelled_original():
    """ELECTRA's labels: 'replaced' means 'differs from the original', so a masked token the
    generator gets right is 0 [DiffCSE §3; official code]."""
    ids, mask = sentences(6, 12, seed=3)
    masked, chosen = mask_tokens(ids, mask, 0.5, TOK.mask_id, 128, SPECIAL,
                                 torch.Generator().manual_seed(0))
    x2, labels = corrupt(PerfectGenerator(ids), masked, ids, mask, TOK)
    assert chosen.any() and torch.equal(x2, ids) and not labels.any()


def test_discriminator_reads_h_at_position_0():
    _, _, disc, _ = tiny_models()
    disc.eval()
    ids, mask = sentences(3, 10, seed=4)
    h = torch.randn(3, 32)
    other = ids.clone()
    other[:, 0] = 7  # whatever token sits at position 0 is overwritten by h
    torch.testing.assert_close(disc(ids, mask, h), disc(other, mask, h))
    assert not torch.allclose(disc(ids, mask, h), disc(ids, mask, h + 1))
