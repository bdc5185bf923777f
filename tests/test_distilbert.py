"""DiffCSE's generator is DistilBERT run in train mode (its dropout on [official code]): it must
compute as Hugging Face's DistilBertForMaskedLM in eval mode, and drop out where DistilBERT does in
train mode, which is not where BERT does (no dropout after the attention output). Reference:
tests/fixtures/distilbert_ref.npz, made by make_distilbert_fixtures.py with transformers 4.46.3
(weights regenerated here from numpy's RandomState)."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import common
from conftest import FIXTURES
from fixtures.make_distilbert_fixtures import CONFIG
from fixtures.make_roberta_fixtures import random_weights

REF = np.load(FIXTURES / "distilbert_ref.npz")


@pytest.fixture(scope="module")
def distilbert(tmp_path_factory):
    """The reference DistilBertForMaskedLM as a Hugging Face folder (config.json, model.safetensors,
    vocab.txt)."""
    folder = tmp_path_factory.mktemp("distilbert")
    weights = random_weights({k: tuple(v) for k, v in json.loads(str(REF["shapes"])).items()}, 3)
    # tied
    weights["vocab_projector.weight"] = weights["distilbert.embeddings.word_embeddings.weight"]
    common.write_safetensors(folder / "model.safetensors", {k: torch.from_numpy(v) for k, v
                                                            in weights.items()})
    (folder / "config.json").write_text(json.dumps({"model_type": "distilbert", **CONFIG}))
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (folder / "vocab.txt").write_text("\n".join(specials + [f"w{i}" for i
                                                            in range(CONFIG["vocab_size"] - 5)])
                                      + "\n")
    return folder


def test_generator_logits_equal_hugging_face_distilbert_in_eval_mode(distilbert):
    model = common.Bert.from_pretrained(distilbert, mlm_head=True).eval()
    ids, mask = torch.from_numpy(REF["ids"]), torch.from_numpy(REF["mask"])
    with torch.no_grad():
        logits = model.mlm_logits(model(ids, mask))
    real = mask.bool()  # padded rows: Hugging Face computes them too, but nothing reads them
    torch.testing.assert_close(logits[real], torch.from_numpy(REF["logits"])[real], rtol=0,
                               atol=1e-5)


def our_dropout_sites(model, ids, mask, monkeypatch):
    """One train-mode forward pass -> [[kind, p], ...]: nn.Dropout calls ('hidden') and the
    attention-probability dropout that scaled_dot_product_attention applies ('probs', when its
    dropout_p > 0)."""
    sites, real_sdpa = [], F.scaled_dot_product_attention

    def sdpa(*args, dropout_p=0.0, **kw):
        if dropout_p > 0:
            sites.append(["probs", dropout_p])
        return real_sdpa(*args, dropout_p=dropout_p, **kw)
    monkeypatch.setattr(F, "scaled_dot_product_attention", sdpa)
    hooks = [m.register_forward_hook(lambda m, i, o: sites.append(["hidden", m.p])) for m
             in model.modules()
             if isinstance(m, torch.nn.Dropout)]
    model.train()(ids, mask)
    for h in hooks:
        h.remove()
    monkeypatch.undo()
    return [[kind, pytest.approx(p)] for kind, p in sites]


def test_dropout_sites_are_distilberts_in_train_mode_and_berts_for_bert(distilbert, monkeypatch):
    ids, mask = torch.from_numpy(REF["ids"]), torch.from_numpy(REF["mask"])
    generator = common.Bert.from_pretrained(distilbert, mlm_head=True)
    assert our_dropout_sites(generator, ids, mask,
                             monkeypatch) == json.loads(str(REF["sites_distilbert"]))
    bert = common.Bert(common.BertConfig.tiny(vocab_size=320, hidden_dropout_prob=0.1,
                                              attention_probs_dropout_prob=0.2))
    assert our_dropout_sites(bert, ids, mask, monkeypatch) == json.loads(str(REF["sites_bert"]))
