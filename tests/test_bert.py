"""The compact BERT: shapes, padding invariance, dropout, the MLM head, and parity with Hugging Face
on MiniLM."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import common
from common import Bert, BertConfig
from conftest import FIXTURES


def tiny(seed=0, **kw):
    torch.manual_seed(seed)
    return Bert(BertConfig.tiny(**kw))


def random_ids(B, L, seed=1):
    return torch.randint(5, 128, (B, L), generator=torch.Generator().manual_seed(seed))


def test_shapes_on_tiny():
    cfg = BertConfig.tiny()
    model = tiny().eval()
    ids, mask = random_ids(3, 10), torch.ones(3, 10, dtype=torch.long)
    assert model(ids, mask).shape == (3, 10, cfg.hidden_size)
    x = model.embeddings(ids)
    assert x.shape == (3, 10, cfg.hidden_size)
    states = model.encode(x, mask, all_layers=True)
    assert len(states) == cfg.num_hidden_layers + 1 and all(s.shape == (3, 10, cfg.hidden_size)
                                                            for s in states)
    assert torch.equal(states[0], x)
    assert model.mlm is None


def test_padding_does_not_change_real_tokens():
    model = tiny().eval()
    ids = random_ids(2, 7)
    ref = model(ids, torch.ones(2, 7, dtype=torch.long))
    # [PAD] or garbage under mask 0
    for pad_ids in (torch.zeros(2, 5, dtype=torch.long), random_ids(2, 5, seed=2)):
        padded = torch.cat([ids, pad_ids], 1)
        mask = torch.cat([torch.ones(2, 7), torch.zeros(2, 5)], 1).long()
        torch.testing.assert_close(model(padded, mask)[:, :7], ref, atol=1e-5, rtol=0)


def test_batching_sentences_of_different_lengths():
    model = tiny().eval()
    short, long = random_ids(1, 4, seed=3), random_ids(1, 9, seed=4)
    ids = torch.cat([torch.cat([short, torch.zeros(1, 5, dtype=torch.long)], 1), long])
    mask = torch.tensor([[1] * 4 + [0] * 5, [1] * 9])
    out = model(ids, mask)
    torch.testing.assert_close(out[0, :4], model(short, torch.ones(1, 4, dtype=torch.long))[0],
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(out[1], model(long, torch.ones(1, 9, dtype=torch.long))[0],
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("hidden,attention", [(0.1, 0.1), (0.1, 0.0), (0.0, 0.5)])
def test_dropout_on_in_train_off_in_eval(hidden, attention):
    model = tiny(hidden_dropout_prob=hidden, attention_probs_dropout_prob=attention)
    ids, mask = random_ids(2, 8), torch.ones(2, 8, dtype=torch.long)
    model.train()
    assert not torch.allclose(model(ids, mask), model(ids, mask))
    model.eval()
    assert torch.equal(model(ids, mask), model(ids, mask))


def test_dropout_zero_from_pretrained_makes_train_mode_deterministic(tmp_path):
    words = [*common.SPECIAL_TOKENS, *(f"w{i}" for i in range(123))]  # the tiny BERT's 128
    tok = common.Tokenizer({w: i for i, w in enumerate(words)})
    common.save_pretrained(tiny(attention_probs_dropout_prob=0.5), tmp_path, tok)
    model = Bert.from_pretrained(tmp_path, dropout=0.0).train()
    ids, mask = random_ids(2, 8), torch.ones(2, 8, dtype=torch.long)
    assert model.cfg.hidden_dropout_prob == model.cfg.attention_probs_dropout_prob == 0.0
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    a, b = model(ids, mask), model(ids, mask)
    assert torch.equal(a, b)
    torch.testing.assert_close(a, model.eval()(ids, mask), atol=1e-6, rtol=0)


@pytest.mark.parametrize("train", [False, True])
def test_embed_then_encode_equals_forward(train):
    model = tiny().train(train)
    ids = random_ids(2, 8)
    mask = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    torch.manual_seed(7)
    a = model(ids, mask)
    torch.manual_seed(7)
    b = model.encode(model.embeddings(ids), mask)
    assert torch.equal(a, b)


def test_mlm_head_shape_and_tied_weights():
    cfg = BertConfig.tiny()
    torch.manual_seed(0)
    model = Bert(cfg, mlm_head=True).eval()
    ids, mask = random_ids(2, 6), torch.ones(2, 6, dtype=torch.long)
    logits = model.mlm_logits(model(ids, mask))
    assert logits.shape == (2, 6, cfg.vocab_size)
    # tied: the only [V, H] matrix is the word embeddings, and the logits use it directly
    big = [n for n, p in model.named_parameters() if p.shape == (cfg.vocab_size, cfg.hidden_size)]
    assert big == ["embeddings.word_embeddings.weight"]
    assert "mlm.decoder.weight" not in model.state_dict()
    h = model(ids, mask)
    W = model.embeddings.word_embeddings.weight
    expected = F.linear(model.mlm.norm(F.gelu(model.mlm.dense(h))), W, model.mlm.bias)
    torch.testing.assert_close(model.mlm_logits(h), expected)
    # a token that is not in the input still gets a gradient on its embedding row, through the
    # output layer
    unused = sorted(set(range(5, cfg.vocab_size)) - set(ids.flatten().tolist()))[0]
    model.mlm_logits(model(ids, mask))[..., unused].sum().backward()
    assert W.grad[unused].abs().sum() > 0


def masked_mean(h, mask):  # h [B, L, H] -> [B, H] over the real tokens
    m = mask.unsqueeze(-1).to(h.dtype)
    return (h * m).sum(1) / m.sum(1)


def test_minilm_parity_with_hugging_face(minilm):
    """Every layer's states as transformers' (the fixture's avg_first_last: the embedding output
    and the last layer; evaluation.py's poolers themselves are in test_released_format.py)."""
    tok, model = minilm
    ref = np.load(FIXTURES / "minilm_ref.npz", allow_pickle=False)
    sentences = [str(s) for s in ref["sentences"]]
    ids, mask = tok(sentences)
    assert ids.shape == ref["input_ids"].shape
    assert np.array_equal(ids.numpy(), ref["input_ids"]) and np.array_equal(mask.numpy(),
                                                                            ref["attention_mask"])
    with torch.inference_mode():
        states = model.encode(model.embeddings(ids), mask, all_layers=True)
        got = {"cls": states[-1][:, 0], "mean": common.pool(states, mask, "avg"),
               "avg_first_last": masked_mean((states[0] + states[-1]) / 2, mask)}  # embeddings
    diffs = {k: float((v - torch.from_numpy(ref[k])).abs().max()) for k, v in got.items()}
    print("\nMiniLM vs Hugging Face, max abs diff: " + ", ".join(f"{k} {v:.2e}" for k, v
                                                                 in diffs.items()))
    assert all(d <= 1e-4 for d in diffs.values()), diffs


def test_minilm_padding_invariance(minilm):
    tok, model = minilm
    sentences = ["A man is playing a guitar.", "hi", "The quick brown fox jumps over the lazy dog."]
    with torch.inference_mode():
        ids, mask = tok(sentences)
        batched = model(ids, mask)
        for i, s in enumerate(sentences):
            alone_ids, alone_mask = tok([s])
            n = alone_ids.shape[1]
            torch.testing.assert_close(batched[i, :n], model(alone_ids, alone_mask)[0], atol=1e-5,
                                       rtol=0)
