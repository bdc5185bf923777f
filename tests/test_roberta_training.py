"""A saved RoBERTa folder keeps Hugging Face's names and reloads, --max_len counts RoBERTa's
position offset, and every method trains on a tiny RoBERTa."""
import dataclasses
import importlib
import json
import math

import numpy as np
import pytest
import torch

import common
from fixtures.make_roberta_fixtures import CONFIG_BASE, CONFIG_MLM, bpe_vocab, read_merges
from test_roberta import MODEL_REF, roberta_folders  # noqa: F401 (a fixture)
from tiny_world import make_senteval, sentence


@pytest.mark.parametrize("which", [0, 1])
def test_saved_folder_has_hugging_face_names_and_reloads(roberta_folders, which, tmp_path):
    """Our folder holds the tensors of Hugging Face's (its pooler too), and config/tokenizer files
    it reads."""
    src = roberta_folders[which]
    merges = read_merges()[:50]
    tok = common.BPETokenizer(bpe_vocab(merges), merges)
    model = common.Bert.from_pretrained(src, mlm_head=bool(which), quiet=True).eval()
    common.save_pretrained(model, tmp_path / "ours", tok)
    theirs, ours = (common.read_safetensors(f / "model.safetensors") for f in (src,
                                                                               tmp_path / "ours"))
    saved_by_hf = set(json.loads(str(MODEL_REF["saved_mlm" if which else "saved_base"])))
    # for transformers 4.x, which ties from it
    decoder_bias = {"lm_head.decoder.bias"} if which else set()
    assert set(ours) == saved_by_hf | decoder_bias  # the pooler too: --pooler cls reads it
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["model_type"] == "roberta" and config["architectures"] == [
        "RobertaForMaskedLM" if which else "RobertaModel"]
    # RobertaConfig's defaults, 0 and 2, as in the fixture
    unwritten = ("bos_token_id", "eos_token_id")
    assert all(config[k] == v for k, v in (CONFIG_MLM if which else CONFIG_BASE).items() if k not
               in unwritten)
    again = common.Tokenizer.from_pretrained(tmp_path / "ours")
    assert (again.vocab, again.merges) == (tok.vocab, tok.merges)
    tokenizer_config = json.loads((tmp_path / "ours" / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "RobertaTokenizer"
    assert tokenizer_config["model_max_length"] == 38
    reloaded = common.Bert.from_pretrained(tmp_path / "ours", mlm_head=bool(which)).eval()
    ids, mask = torch.from_numpy(MODEL_REF["ids"]), torch.from_numpy(MODEL_REF["mask"])
    with torch.no_grad():
        assert torch.equal(reloaded(ids, mask), model(ids, mask))


def test_max_len_counts_the_position_offset(roberta_folders):
    model = common.Bert.from_pretrained(roberta_folders[0], quiet=True)
    assert model.cfg.max_tokens == CONFIG_BASE["max_position_embeddings"] - 2
    common.check_positions(model, 38)
    with pytest.raises(common.UserError, match="exceeds the 38 positions of the model"):
        common.check_positions(model, 39)


def roberta_world(tmp):
    """The tiny world of tiny_world.make_world with a 2-layer RoBERTa, a BPE of GPT-2's first 300
    merges and a DistilRoBERTa-shaped generator with an MLM head."""
    import random
    merges = read_merges()[:300]
    tok = common.BPETokenizer(bpe_vocab(merges), merges)
    for name, mlm_head in [("model", False), ("generator", True)]:
        torch.manual_seed(len(name))
        cfg = common.BertConfig.tiny(vocab_size=len(tok.vocab), model_type="roberta",
                                     pad_token_id=1,
                                     type_vocab_size=1, max_position_embeddings=66,
                                     layer_norm_eps=1e-5)
        common.save_pretrained(common.Bert(cfg, mlm_head=mlm_head), tmp / name, tok)
    rng = random.Random(1)
    # 12 steps
    (tmp / "train.txt").write_text("".join(sentence(rng).capitalize() + "\n" for _ in range(192)))
    return dict(model=str(tmp / "model"), generator=str(tmp / "generator"),
                data=str(tmp / "train.txt"),
                senteval=str(make_senteval(tmp / "senteval")))


@pytest.mark.parametrize("method", ["simcse", "esimcse", "simcsepp", "diffcse"])
def test_each_method_trains_on_a_tiny_roberta(method, tmp_path):
    module = importlib.import_module(f"{method}_min")
    world = roberta_world(tmp_path)
    fields = {f.name for f in dataclasses.fields(module.Config)}
    values = dict(world, device="cpu", batch_size=16, max_steps=12, eval_every=1, lr=1e-3,
                  out_dir=str(tmp_path / "out"))
    results = module.train(module.Config(**{k: v for k, v in values.items() if k in fields}))
    losses = [s["loss"] for _, s in results["stats_history"][1:]]
    assert all(map(math.isfinite, losses)) and np.mean(losses[-3:]) < np.mean(losses[:3]), losses
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "roberta"
    assert isinstance(common.Tokenizer.from_pretrained(tmp_path / "out"), common.BPETokenizer)


@pytest.mark.parametrize("method", ["simcse", "esimcse", "simcsepp"])
def test_do_mlm_trains_a_tiny_roberta_with_its_lm_head(method, tmp_path):
    """--do_mlm on RoBERTa: its LM head (lm_head.*) from the checkpoint, as the official
    RobertaForCL loads it; the masked-LM loss falls and the saved folder keeps the head."""
    module = importlib.import_module(f"{method}_min")
    world = roberta_world(tmp_path)
    out = tmp_path / "out"
    results = module.train(module.Config(
        model=world["generator"], data=world["data"], senteval=world["senteval"], device="cpu",
        batch_size=16, max_steps=12, eval_every=4, lr=1e-3, do_mlm=True, out_dir=str(out)))
    mlm = [s["mlm"] for _, s in results["stats_history"][1:]]
    assert all(map(math.isfinite, mlm)) and mlm[-1] < mlm[0], mlm
    assert "lm_head.dense.weight" in common.read_safetensors(out / "model.safetensors")
