"""Checkpoints: legacy Hugging Face names, DistilBERT, the saved folder (parsed independently),
loader errors, the command line's one-line errors, and the import purity of common.py."""
import json
from pathlib import Path

import pytest
import torch

import common
from common import Bert, BertConfig, CheckpointError

# Hugging Face sub-module of one layer -> ours (written out here, independently of common.py's
# tables)
LAYER = {"attention.self.query": "query", "attention.self.key": "key",
         "attention.self.value": "value",
         "attention.output.dense": "attn_out", "attention.output.LayerNorm": "attn_norm",
         "intermediate.dense": "ffn_in", "output.dense": "ffn_out", "output.LayerNorm": "ffn_norm"}
DISTIL_LAYER = {"attention.q_lin": "query", "attention.k_lin": "key", "attention.v_lin": "value",
                "attention.out_lin": "attn_out", "sa_layer_norm": "attn_norm", "ffn.lin1": "ffn_in",
                "ffn.lin2": "ffn_out", "output_layer_norm": "ffn_norm"}
CFG = BertConfig.tiny()
HF_CONFIG = {"architectures": ["BertForPreTraining"], "model_type": "bert",
             "vocab_size": CFG.vocab_size,
             "hidden_size": CFG.hidden_size, "num_hidden_layers": CFG.num_hidden_layers,
             "num_attention_heads": CFG.num_attention_heads,
             "intermediate_size": CFG.intermediate_size,
             "max_position_embeddings": CFG.max_position_embeddings, "type_vocab_size": 2,
             "layer_norm_eps": 1e-12,
             "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
             "pad_token_id": 0, "initializer_range": 0.02}
NSP = {"cls.seq_relationship.weight", "cls.seq_relationship.bias"}  # the pooler is loaded
MLM_KEYS = {"cls.predictions.bias", "cls.predictions.transform.dense.weight",
            "cls.predictions.transform.dense.bias",
            "cls.predictions.transform.LayerNorm.gamma", "cls.predictions.transform.LayerNorm.beta"}


def layer_shapes(c):
    H, I = c.hidden_size, c.intermediate_size
    return {"query": (H, H), "key": (H, H), "value": (H, H), "attn_out": (H, H), "attn_norm": (H,),
            "ffn_in": (I, H), "ffn_out": (H, I), "ffn_norm": (H,)}


def legacy_checkpoint(c=CFG, mlm=True, seed=0):
    """A BertForPreTraining-style state dict with legacy names, every tensor distinct random
    numbers.

    Returns (tensors, ours) where ours maps each of our parameter names to the tensor it must
    receive.
    """
    g = torch.Generator().manual_seed(seed)
    H, V = c.hidden_size, c.vocab_size
    t, ours = {}, {}

    def put(hf, our, shape):
        t[hf] = torch.randn(*shape, generator=g)
        if our:
            ours[our] = t[hf]

    put("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight", (V, H))
    put("bert.embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight",
        (c.max_position_embeddings, H))
    put("bert.embeddings.token_type_embeddings.weight", "embeddings.token_type_embeddings.weight",
        (2, H))
    put("bert.embeddings.LayerNorm.gamma", "embeddings.LayerNorm.weight", (H,))
    put("bert.embeddings.LayerNorm.beta", "embeddings.LayerNorm.bias", (H,))
    t["bert.embeddings.position_ids"] = torch.arange(c.max_position_embeddings)[None]
    for i in range(c.num_hidden_layers):
        for hf, our in LAYER.items():
            shape = layer_shapes(c)[our]
            w, b = ("gamma", "beta") if hf.endswith("LayerNorm") else ("weight", "bias")
            put(f"bert.encoder.layer.{i}.{hf}.{w}", f"layers.{i}.{our}.weight", shape)
            put(f"bert.encoder.layer.{i}.{hf}.{b}", f"layers.{i}.{our}.bias", shape[:1])
    put("bert.pooler.dense.weight", "pooler.dense.weight", (H, H))  # --pooler cls
    put("bert.pooler.dense.bias", "pooler.dense.bias", (H,))
    if mlm:
        put("cls.predictions.bias", "mlm.bias", (V,))
        put("cls.predictions.transform.dense.weight", "mlm.dense.weight", (H, H))
        put("cls.predictions.transform.dense.bias", "mlm.dense.bias", (H,))
        put("cls.predictions.transform.LayerNorm.gamma", "mlm.norm.weight", (H,))
        put("cls.predictions.transform.LayerNorm.beta", "mlm.norm.bias", (H,))
        # tied
        t["cls.predictions.decoder.weight"] = t["bert.embeddings.word_embeddings.weight"].clone()
        # an alias in old checkpoints
        t["cls.predictions.decoder.bias"] = t["cls.predictions.bias"].clone()
    put("cls.seq_relationship.weight", None, (2, H))
    put("cls.seq_relationship.bias", None, (2,))
    return t, ours


def write_folder(folder, tensors, config=HF_CONFIG, fmt="bin", vocab=True):
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    if vocab:
        specials = list(common.SPECIAL_TOKENS)
        size = config.get("vocab_size", CFG.vocab_size) if config else CFG.vocab_size
        (folder / "vocab.txt").write_text("".join(w + "\n" for w in specials + [f"w{i}" for i
                                                                                in range(size
                                                                                         - 5)]))
    if fmt == "bin":
        torch.save(dict(tensors), folder / "pytorch_model.bin")
    elif fmt == "safetensors":
        common.write_safetensors(folder / "model.safetensors", tensors)
    return folder


def unused_line(err):
    lines = [line for line in err.splitlines() if "not used from the checkpoint:" in line]
    assert len(lines) <= 1, err
    return set(lines[0].split("not used from the checkpoint:",
                              1)[1].strip().split(", ")) if lines else set()


def assert_filled(model, ours):
    state = model.state_dict()
    assert set(state) == set(ours), set(state) ^ set(ours)
    for name, want in ours.items():
        assert torch.equal(state[name], want), name


# ---- legacy BERT and DistilBERT checkpoints ------------------------------------------------------

@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
@pytest.mark.parametrize("mlm_head", [False, True])
def test_legacy_names_fill_every_tensor(tmp_path, capsys, fmt, mlm_head):
    tensors, ours = legacy_checkpoint()
    folder = write_folder(tmp_path / "legacy", tensors, fmt=fmt)
    model = Bert.from_pretrained(folder, mlm_head=mlm_head)
    assert_filled(model, ours if mlm_head else {k: v for k, v in ours.items() if
                                                not k.startswith("mlm.")})
    assert (model.mlm is not None) == mlm_head
    assert unused_line(capsys.readouterr().err) == (NSP if mlm_head else NSP
                                                    | MLM_KEYS)


def test_quiet_and_dropout_override(tmp_path, capsys):
    folder = write_folder(tmp_path / "legacy", legacy_checkpoint()[0])
    model = Bert.from_pretrained(folder, quiet=True, dropout=0.0)
    assert "not used" not in capsys.readouterr().err
    assert model.cfg.hidden_dropout_prob == model.cfg.attention_probs_dropout_prob == 0.0
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))


def test_untied_decoder_is_refused(tmp_path):
    tensors, _ = legacy_checkpoint()
    tensors["cls.predictions.decoder.weight"] = tensors["cls.predictions.decoder.weight"] + 1
    folder = write_folder(tmp_path / "untied", tensors)
    with pytest.raises(CheckpointError, match="tied"):
        Bert.from_pretrained(folder, mlm_head=True)


def distilbert_checkpoint(c=CFG, seed=0):
    g = torch.Generator().manual_seed(seed)
    H, V = c.hidden_size, c.vocab_size
    t, ours = {}, {}

    def put(hf, our, shape):
        t[hf] = torch.randn(*shape, generator=g)
        ours[our] = t[hf]

    put("distilbert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight", (V, H))
    put("distilbert.embeddings.position_embeddings.weight", "embeddings.position_embeddings.weight",
        (c.max_position_embeddings, H))
    put("distilbert.embeddings.LayerNorm.weight", "embeddings.LayerNorm.weight", (H,))
    put("distilbert.embeddings.LayerNorm.bias", "embeddings.LayerNorm.bias", (H,))
    for i in range(c.num_hidden_layers):
        for hf, our in DISTIL_LAYER.items():
            shape = layer_shapes(c)[our]
            put(f"distilbert.transformer.layer.{i}.{hf}.weight", f"layers.{i}.{our}.weight", shape)
            put(f"distilbert.transformer.layer.{i}.{hf}.bias", f"layers.{i}.{our}.bias", shape[:1])
    put("vocab_transform.weight", "mlm.dense.weight", (H, H))
    put("vocab_transform.bias", "mlm.dense.bias", (H,))
    put("vocab_layer_norm.weight", "mlm.norm.weight", (H,))
    put("vocab_layer_norm.bias", "mlm.norm.bias", (H,))
    put("vocab_projector.bias", "mlm.bias", (V,))
    t["vocab_projector.weight"] = t["distilbert.embeddings.word_embeddings.weight"].clone()  # tied
    config = {"architectures": ["DistilBertForMaskedLM"], "model_type": "distilbert",
              "vocab_size": V, "dim": H,
              "n_layers": c.num_hidden_layers, "n_heads": c.num_attention_heads,
              "hidden_dim": c.intermediate_size,
              "max_position_embeddings": c.max_position_embeddings, "dropout": 0.1,
              "attention_dropout": 0.1,
              "activation": "gelu", "sinusoidal_pos_embds": False, "pad_token_id": 0}
    return t, ours, config


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_distilbert_loads_with_mlm_head(tmp_path, capsys, fmt):
    tensors, ours, config = distilbert_checkpoint()
    folder = write_folder(tmp_path / "distil", tensors, config=config, fmt=fmt)
    model = Bert.from_pretrained(folder, mlm_head=True)
    assert model.embeddings.token_type_embeddings is None and model.cfg.type_vocab_size == 0
    assert_filled(model, ours)
    assert unused_line(capsys.readouterr().err) == set()
    ids = torch.tensor([[2, 10, 11, 3]])
    assert model.eval().mlm_logits(model(ids, torch.ones_like(ids))).shape == (1, 4, CFG.vocab_size)
