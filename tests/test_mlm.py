"""--do_mlm, the masked-LM auxiliary loss of SimCSE's train.py (also ESimCSE's and SimCSE++'s): the
combined loss against a float64 loop of the official cl_forward, BERT's 15% masking as the official
collator's (80/10/10, never a special token), the chunked step, and the one-line refusal of a
checkpoint without an MLM head."""
import random

import pytest
import torch
import torch.nn.functional as F

import common
import simcse_min
from ddp_world import no_dropout_bert
from conftest import cos, one_line
from tiny_world import make_model, sentence, tokenizer

TOK = tokenizer()
SPECIALS = (TOK.pad_id, TOK.unk_id, TOK.cls_id, TOK.sep_id, TOK.mask_id)


def batch(n, columns=1, seed=0):
    ids, mask = TOK([sentence(random.Random(seed + i)) for i in range(n * columns)])  # [n*C, L]
    return ids.view(n, columns, -1), mask.view(n, columns, -1)



def loss_loop(model, head, ids, mask, cfg, masked, chosen):
    """The official cl_forward written out, unsupervised (ids, mask [B, 1, L]: the sentence twice):
    InfoNCE, plus mlm_weight x the mean over chosen tokens of -log softmax(lm_head(h_t))[x_t]."""
    views = [(ids[:, 0], mask[:, 0])] * 2
    h = [head(model(i, m)[:, 0]) for i, m in views]  # [B, H] each, view by view
    B = len(ids)
    nce = 0.0
    for i in range(B):
        denom = sum(torch.exp(cos(h[0][i], h[1][j]) / cfg.temp) for j in range(B))
        nce = nce - torch.log(torch.exp(cos(h[0][i], h[1][i]) / cfg.temp) / denom) / B
    targets = torch.cat([i for i, _ in views])  # [2B, L]: every view's sentences, as masked
    masks = torch.cat([m for _, m in views])
    nll, count = 0.0, 0
    for r in range(len(targets)):
        logits = model.mlm_logits(model(masked[r:r + 1], masks[r:r + 1]))[0]  # [L, V], row alone
        for t in chosen[r].nonzero()[:, 0].tolist():
            nll, count = nll - torch.log_softmax(logits[t], -1)[targets[r, t]], count + 1
    return nce + cfg.mlm_weight * nll / count


def masks_of(ids, mask, seed):
    views = simcse_min.make_views(ids, mask)
    gen = torch.Generator().manual_seed(seed)
    return common.mask_tokens(*views, 0.15, TOK.mask_id, len(TOK.vocab), SPECIALS, gen)


def test_combined_loss_matches_a_float64_loop():
    torch.manual_seed(0)
    model = no_dropout_bert(TOK, mlm_head=True)
    head = simcse_min.MLPHead(model.cfg.hidden_size).double()
    ids, mask = batch(6, seed=1)
    cfg = simcse_min.Config(do_mlm=True, mlm_weight=0.3)
    loss, stats = simcse_min.train_step(model, head, ids, mask, cfg, TOK,
                                        torch.Generator().manual_seed(5))
    ref = loss_loop(model, head, ids, mask, cfg, *masks_of(ids, mask, 5))
    assert loss.dtype == torch.float64 and loss.item() == pytest.approx(ref.item(), abs=1e-10)
    assert stats["loss"].item() == pytest.approx(ref.item(), abs=1e-10)
    off, _ = simcse_min.train_step(model, head, ids, mask, simcse_min.Config(), TOK, None)
    assert (loss - off).item() == pytest.approx(0.3 * stats["mlm"].item(), abs=1e-10)


def test_chunked_step_is_the_whole_step():
    """--chunk_size: the masked-LM pass goes through gradient caching too: the same loss and
    gradients as the unchunked step (float64, dropout 0)."""
    torch.manual_seed(0)
    model = no_dropout_bert(TOK, mlm_head=True)
    model.pooler = simcse_min.MLPHead(model.cfg.hidden_size).double()
    ids, mask = batch(8, columns=3, seed=2)  # supervised: 3 views, all masked
    results = []
    for chunk in (0, 5):
        cfg = simcse_min.Config(do_mlm=True, chunk_size=chunk)
        loss, _ = simcse_min.train_step(model, model.pooler, ids, mask, cfg, TOK,
                                        torch.Generator().manual_seed(3))
        results.append((loss, torch.autograd.grad(loss, list(model.parameters()))))
    (a, ga), (b, gb) = results
    assert a.item() == pytest.approx(b.item(), abs=1e-12)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    assert all(g.abs().sum() > 0 for g in ga)  # every parameter learns: the MLM head's too


def test_masking_is_bert_s_15_percent_80_10_10_never_a_special_token(monkeypatch):
    """mlm_loss masks 15% of the real tokens, never [CLS], [SEP], [PAD], [UNK] or [MASK]; 80% of
    them become [MASK], 10% a random token, 10% stay [official collator = HF's]."""
    seen = []

    def spy(*args):
        seen.append(common.mask_tokens.__wrapped__(*args))
        return seen[-1]
    spy.__wrapped__ = common.mask_tokens
    monkeypatch.setattr(common, "mask_tokens", spy)
    rng = random.Random(0)
    ids, mask = TOK([sentence(rng) for _ in range(400)], max_len=40)  # [400, L]
    ids = torch.where((torch.rand(ids.shape) < 0.05) & mask.bool(), TOK.unk_id, ids)  # some [UNK]
    ids = torch.where((torch.rand(ids.shape) < 0.05) & mask.bool(), TOK.mask_id, ids)  # [MASK]
    special = torch.isin(ids, torch.tensor(SPECIALS)) | ~mask.bool()
    n = chosen_n = to_mask = to_random = 0
    for seed in range(4):
        vocab = len(TOK.vocab)
        common.mlm_loss(ZeroLogits(vocab), ids, mask, TOK, torch.Generator().manual_seed(seed))
        out, chosen = seen[-1]
        assert not (chosen & special).any(), "a special token or a pad was chosen"
        assert torch.equal(out[~chosen], ids[~chosen])
        n, chosen_n = n + (~special).sum().item(), chosen_n + chosen.sum().item()
        to_mask += (chosen & (out == TOK.mask_id)).sum().item()
        to_random += (chosen & (out != TOK.mask_id) & (out != ids)).sum().item()
    assert abs(chosen_n / n - 0.15) < 0.01, chosen_n / n
    assert abs(to_mask / chosen_n - 0.8) < 0.03 and abs(to_random / chosen_n - 0.1) < 0.03


class ZeroLogits:
    """A stand-in model: its states are the ids, its MLM head's logits all 0."""

    def __init__(self, vocab):
        self.vocab = vocab

    def __call__(self, ids, mask):
        return ids

    def mlm_logits(self, states):
        return torch.zeros(*states.shape, self.vocab)


def test_a_checkpoint_without_an_mlm_head_is_one_line(world, tmp_path, capsys):
    """--do_mlm on a model folder without BERT's MLM head (cls.predictions.*): exit 2, one line
    naming the head and the flag, nothing left behind."""
    plain = str(make_model(tmp_path / "plain", pooler=True))  # the tiny world's has the head
    args = ["--model", plain, "--data", world["data"], "--senteval", world["senteval"],
            "--do_mlm", "--out_dir", str(tmp_path / "run"), "--device", "cpu"]
    err = one_line(capsys, common.parse_args(simcse_min.Config, args), simcse_min.train)
    assert "no masked-LM head" in err and "--do_mlm" in err, err
    assert not (tmp_path / "run").exists()
