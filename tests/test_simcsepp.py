"""SimCSE++: the two sub-losses against float64 loop oracles of their formulas, gradcheck, the
identities that tie them to SimCSE, and the dropout-off pass (really no dropout, with gradient,
modes restored)."""
import pytest
import torch
import torch.nn as nn

import common
import simcse_min
from conftest import cos
from simcsepp_min import (
    Config,
    MLPHead,
    dcl_loss,
    dropout_off,
    loss_fn,
    off_dropout_nce,
    train,
    train_step,
)


def off_dropout_oracle(h1, h2, h0, temp, m):
    """-1/B sum_i log(e^{m s(h1_i, h2_i)} / (e^{m s(h1_i, h2_i)} + sum_{j≠i} e^{s(h0_i, h0_j)})),
    s = cos/τ."""
    B, total = len(h1), 0.0
    for i in range(B):
        pos = torch.exp(m * cos(h1[i], h2[i]) / temp)
        neg = sum(torch.exp(cos(h0[i], h0[j]) / temp) for j in range(B) if j != i)
        total = total - torch.log(pos / (pos + neg))
    return total / B


def dcl_oracle(h1, h2, temp_dcl):
    """Per-dimension standardisation (biased variance, eps 1e-5), s_cd = sum_i z1_ic z2_id / B /
    τ_DCL,
    -1/H sum_c log(e^{s_cc} / sum_d e^{s_cd})."""
    B, H = h1.shape

    def standardise(h):  # -> z[c][i]
        z = []
        for c in range(H):
            mean = sum(h[i, c] for i in range(B)) / B
            var = sum((h[i, c] - mean) ** 2 for i in range(B)) / B
            z.append([(h[i, c] - mean) / torch.sqrt(var + 1e-5) for i in range(B)])
        return z

    z1, z2, total = standardise(h1), standardise(h2), 0.0
    for c in range(H):
        s = [sum(z1[c][i] * z2[d][i] for i in range(B)) / B / temp_dcl for d in range(H)]
        total = total - torch.log(torch.exp(s[c]) / sum(torch.exp(x) for x in s))
    return total / H


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("temp, m", [(0.05, 0.9), (0.1, 1.0), (0.05, 1.2)])
def test_off_dropout_nce_matches_oracle(temp, m):
    h = [rand(4, 8, seed=s) for s in range(3)]
    ours, ref = off_dropout_nce(*h, temp, m), off_dropout_oracle(*h, temp, m)
    torch.testing.assert_close(ours, ref)
    for g, r in zip(torch.autograd.grad(ours, h), torch.autograd.grad(ref, h)):
        torch.testing.assert_close(g, r)


@pytest.mark.parametrize("temp_dcl", [5.0, 0.5])
def test_dcl_loss_matches_oracle(temp_dcl):
    h = [rand(4, 8, seed=s) for s in range(2)]
    ours, ref = dcl_loss(*h, temp_dcl), dcl_oracle(*h, temp_dcl)
    torch.testing.assert_close(ours, ref)
    for g, r in zip(torch.autograd.grad(ours, h), torch.autograd.grad(ref, h)):
        torch.testing.assert_close(g, r)


def test_gradcheck():
    h = [rand(4, 8, seed=s) for s in range(3)]
    assert torch.autograd.gradcheck(lambda a, b, c: off_dropout_nce(a, b, c, 0.05, 0.9), h)
    assert torch.autograd.gradcheck(lambda a, b: dcl_loss(a, b, 5.0), h[:2])


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("temp", [0.05, 1.0])
def test_off_dropout_with_one_view_and_m_1_is_simcse(seed, temp):
    h = torch.randn(16, 32, generator=torch.Generator().manual_seed(seed))
    torch.testing.assert_close(off_dropout_nce(h, h, h, temp, 1.0), simcse_min.info_nce(h, h, temp))


def test_dcl_rewards_correlated_dimensions():
    h = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    shuffled = h[torch.randperm(64, generator=torch.Generator().manual_seed(1))]
    assert dcl_loss(h, h, 5.0) < dcl_loss(h, shuffled, 5.0) - 0.05
    # standardised per dimension
    torch.testing.assert_close(dcl_loss(3 * h + 1, h, 5.0), dcl_loss(h, h, 5.0))


def test_loss_fn_combines_both_parts():
    h = torch.randn(3, 8, 16, generator=torch.Generator().manual_seed(0))
    loss, stats = loss_fn(h, 0.05, 0.9, 0.1, 5.0)
    torch.testing.assert_close(stats["nce"], off_dropout_nce(h[0], h[1], h[2], 0.05, 0.9))
    torch.testing.assert_close(stats["dcl"], dcl_loss(h[0], h[1], 5.0))
    torch.testing.assert_close(loss, stats["nce"] + 0.1 * stats["dcl"])
    torch.testing.assert_close(loss_fn(h, 0.05, 0.9, 0.0, 5.0)[0], stats["nce"])  # λ = 0: DCL off
    torch.testing.assert_close(loss_fn(h[:2], 0.05, 0.9, 0.1, 5.0)[0],  # no h0: SimCSE's negatives
                               simcse_min.info_nce(h[0], h[1], 0.05) + 0.1 * stats["dcl"])


def tiny(hidden=0.5, attn=0.5):
    torch.manual_seed(0)
    cfg = common.BertConfig.tiny(hidden_dropout_prob=hidden, attention_probs_dropout_prob=attn)
    return common.Bert(cfg).train(), MLPHead(cfg.hidden_size)


# each kind of dropout on its own
@pytest.mark.parametrize("hidden, attn", [(0.5, 0.5), (0.5, 0.0), (0.0, 0.5)])
def test_dropout_off_pass_has_no_dropout(hidden, attn):
    model, head = tiny(hidden, attn)
    ids = torch.randint(5, 128, (4, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    h0 = lambda: head(model(ids, mask)[:, 0])  # noqa: E731
    assert not torch.equal(h0(), h0())  # dropout on outside
    with dropout_off(model):
        a, b = h0(), h0()
    assert torch.equal(a, b) and a.requires_grad
    assert model.training and all(m.training for m in model.modules())
    assert all(m.p == hidden for m in model.modules() if isinstance(m, nn.Dropout))
    assert all(layer.attn_p == attn for layer in model.layers)
    a.sum().backward()
    assert model.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    model.eval()
    torch.testing.assert_close(a, h0())  # the same as eval mode


def test_dropout_off_restores_mixed_modes_and_on_error():
    model, _ = tiny()
    model.layers[0].eval()
    before = [m.training for m in model.modules()]
    with pytest.raises(RuntimeError), dropout_off(model):
        raise RuntimeError
    assert [m.training for m in model.modules()] == before


@pytest.mark.parametrize("off_dropout", [True, False])
def test_train_step_runs_the_third_pass_in_eval_mode(off_dropout):
    model, head = tiny()
    calls = []
    model.register_forward_hook(lambda mod, args, out: calls.append((len(args[0]), mod.training)))
    ids = torch.randint(5, 128, (8, 1, 10), generator=torch.Generator().manual_seed(0))
    loss, stats = train_step(model, head, ids, torch.ones_like(ids),
                             Config(off_dropout=off_dropout))
    assert calls == ([(16, True), (8, False)] if off_dropout else [(16, True)])
    assert torch.isfinite(loss) and set(stats) == {"loss", "nce", "dcl"}
    loss.backward()
    assert model.training and head.dense.weight.grad is not None


def test_supervised_csv_is_refused(tmp_path, model_dir, senteval_dir):
    csv = tmp_path / "nli.csv"
    csv.write_text("sent0,sent1\n" + "a man plays,someone plays\n" * 80)
    with pytest.raises(common.UserError, match="unsupervised"):
        train(Config(data=str(csv), model=str(model_dir), senteval=str(senteval_dir), device="cpu",
                     out_dir=str(tmp_path / "out")))
