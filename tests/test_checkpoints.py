"""Checkpoints: legacy Hugging Face names, DistilBERT, the saved folder (parsed independently),
loader errors,
the command line's one-line errors, and the import purity of common.py."""
import collections
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import common
from common import Bert, BertConfig, CheckpointError
from conftest import ROOT

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
POOLER_NSP = {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
              "cls.seq_relationship.bias"}
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
    put("bert.pooler.dense.weight", None, (H, H))
    put("bert.pooler.dense.bias", None, (H,))
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
    assert unused_line(capsys.readouterr().err) == (POOLER_NSP if mlm_head else POOLER_NSP
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


# ---- saving: round trip on MiniLM, the files parsed independently --------------------------------

def parse_safetensors(path):
    """Independent reader (struct + json + numpy): {name: float32/int64 array}, metadata, header
    size."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    spans = sorted(tuple(info["data_offsets"]) for info in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        dt = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8"}[info["dtype"]]
        arr = np.frombuffer(data[a:b], dtype=dt).reshape(info["shape"])
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        out[name] = arr
    return out, meta, n, {name: info["dtype"] for name, info in header.items()}


def bert_model_keys(layers):
    keys = {"embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight",
            "embeddings.token_type_embeddings.weight", "embeddings.LayerNorm.weight",
            "embeddings.LayerNorm.bias"}
    return keys | {f"encoder.layer.{i}.{m}.{p}" for i in range(layers) for m in LAYER for p
                   in ("weight", "bias")}


@pytest.fixture(scope="module")
def saved(minilm, tmp_path_factory):
    tok, model = minilm
    folder = tmp_path_factory.mktemp("saved") / "minilm"
    model.save_pretrained(folder, tok)
    return folder


def test_round_trip_is_bit_identical(minilm, saved, capsys):
    _, model = minilm
    again = Bert.from_pretrained(saved)
    assert "not used" not in capsys.readouterr().err
    a, b = model.state_dict(), again.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert again.cfg == model.cfg


def test_saved_safetensors_has_hugging_face_names(minilm, model_dir, saved):
    _, model = minilm
    got, meta, n, dtypes = parse_safetensors(saved / "model.safetensors")
    assert meta.get("format") == "pt" and n % 8 == 0
    assert set(got) == bert_model_keys(model.cfg.num_hidden_layers)
    assert set(dtypes.values()) == {"F32"}
    original = parse_safetensors(model_dir / "model.safetensors")[0]
    for name, arr in got.items():
        assert np.array_equal(arr, original[name]), name
    state = model.state_dict()
    assert np.array_equal(got["encoder.layer.0.attention.self.query.weight"],
                          state["layers.0.query.weight"].numpy())
    assert np.array_equal(got["embeddings.word_embeddings.weight"],
                          state["embeddings.word_embeddings.weight"].numpy())


def test_saved_config_and_sentence_transformers_files(minilm, model_dir, saved):
    tok, model = minilm
    config = json.loads((saved / "config.json").read_text())
    original = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"]
    assert config["hidden_act"] == "gelu"
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id"):
        assert config[key] == original[key], key
    pooling = json.loads((saved / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_cls_token"] is True and pooling["word_embedding_dimension"] == 384
    assert not any(v for k, v in pooling.items() if k.startswith("pooling_mode_")
                   and k != "pooling_mode_cls_token")
    modules = json.loads((saved / "modules.json").read_text())
    assert [m["path"] for m in modules] == ["", "1_Pooling"]
    assert (saved / "sentence_bert_config.json").exists()
    assert (saved / "special_tokens_map.json").exists()
    assert json.loads((saved / "tokenizer_config.json").read_text())["do_lower_case"] is True
    tok2 = common.Tokenizer.from_pretrained(saved)
    assert tok2.vocab == tok.vocab
    assert tok2.lower == tok.lower
    assert tok2.strip_accents == tok.strip_accents
    assert not list(saved.glob(".*.tmp")), "a temporary file was left behind"


def test_bf16_save_is_half_the_size_and_loads(minilm, saved, tmp_path):
    tok, model = minilm
    folder = tmp_path / "bf16"
    model.save_pretrained(folder, tok, dtype=torch.bfloat16)
    full, half = (saved / "model.safetensors").stat().st_size, (
        folder / "model.safetensors"
    ).stat().st_size
    assert 0.49 < half / full < 0.51, (half, full)
    got, _, _, dtypes = parse_safetensors(folder / "model.safetensors")
    assert set(dtypes.values()) == {"BF16"}
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    again = Bert.from_pretrained(folder)
    a, b = model.state_dict(), again.state_dict()
    for k in a:
        assert b[k].dtype == torch.float32 and torch.equal(b[k], a[k].bfloat16().float()), k
    assert np.array_equal(got["embeddings.word_embeddings.weight"],
                          b["embeddings.word_embeddings.weight"].numpy())


def test_mlm_model_round_trip(tmp_path, capsys):
    torch.manual_seed(0)
    model = Bert(CFG, mlm_head=True)
    tok = common.Tokenizer(
        {w: i for i, w in enumerate(list(common.SPECIAL_TOKENS) + [f"w{i}" for i in range(123)])}
    )
    model.save_pretrained(tmp_path / "mlm", tok)
    got = parse_safetensors(tmp_path / "mlm" / "model.safetensors")[0]
    assert "bert.embeddings.word_embeddings.weight" in got
    assert "cls.predictions.transform.dense.weight" in got
    assert json.loads((tmp_path / "mlm" / "config.json").read_text())["architectures"] == [
        "BertForMaskedLM"
    ]
    again = Bert.from_pretrained(tmp_path / "mlm", mlm_head=True)
    assert unused_line(capsys.readouterr().err) == set()
    a, b = model.state_dict(), again.state_dict()
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


# ---- loader errors: each a CheckpointError with a clear message ----------------------------------

def test_missing_tensor(tmp_path):
    tensors, _ = legacy_checkpoint()
    del tensors["bert.encoder.layer.1.output.dense.weight"]
    folder = write_folder(tmp_path / "m", tensors, fmt="safetensors")
    with pytest.raises(CheckpointError, match=r"missing 1 tensors.*layers\.1\.ffn_out\.weight"):
        Bert.from_pretrained(folder)


def test_wrong_shape(tmp_path):
    tensors, _ = legacy_checkpoint()
    tensors["bert.encoder.layer.0.intermediate.dense.weight"] = torch.zeros(CFG.intermediate_size
                                                                            + 1, 32)
    folder = write_folder(tmp_path / "w", tensors)
    with pytest.raises(
        CheckpointError,
        match=r"do not match " r"config\.json.*layers\.0\.ffn_in\.weight \(65, 32\)",
    ):
        Bert.from_pretrained(folder)


def test_truncated_safetensors(tmp_path):
    folder = write_folder(tmp_path / "t", legacy_checkpoint()[0], fmt="safetensors")
    path = folder / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[:len(raw) - 1000])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: not a valid safetensors file: "
                                              r".*outside"):
        Bert.from_pretrained(folder)
    path.write_bytes(raw[:5])
    with pytest.raises(CheckpointError, match="too short.*truncated"):
        Bert.from_pretrained(folder)


def test_header_claims_more_bytes_than_the_file_has(tmp_path):
    folder = write_folder(tmp_path / "h", {}, fmt=None)
    header = json.dumps({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10**6) + header + bytes(8))
    with pytest.raises(CheckpointError, match=r"header claims 1000000 bytes but the file has \d+"):
        Bert.from_pretrained(folder)
    # absurd size
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**63) + header + bytes(8))
    with pytest.raises(CheckpointError, match="header claims"):
        Bert.from_pretrained(folder)


class FancyDict(collections.OrderedDict):
    """A harmless-looking container class: still not something weights_only may construct."""


class Payload:
    """Unpickling this would create a marker folder: proof that code in the file ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


@pytest.mark.parametrize("kind", ["payload", "dict_subclass"])
def test_pickle_with_code_is_refused_and_never_runs(tmp_path, kind):
    tensors, _ = legacy_checkpoint()
    marker = tmp_path / "pwned"
    obj = {**tensors, "extra": Payload(marker)} if kind == "payload" else FancyDict(tensors)
    folder = write_folder(tmp_path / "p", {}, fmt=None)
    torch.save(obj, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin cannot be loaded safely "
                                              r"\(weights only") as e:
        Bert.from_pretrained(folder)
    assert not marker.exists()
    assert "weights_only=False" not in str(e.value)
    assert "trust" not in str(e.value)
    if kind == "payload":  # the payload is real: an unsafe load would have run it
        torch.load(folder / "pytorch_model.bin", weights_only=False)
        assert marker.exists()


def test_no_config_json(tmp_path):
    folder = write_folder(tmp_path / "c", legacy_checkpoint()[0], config=None)
    with pytest.raises(CheckpointError, match="no config.json"):
        Bert.from_pretrained(folder)


def test_no_weights_file(tmp_path):
    folder = write_folder(tmp_path / "n", {}, fmt=None)
    with pytest.raises(CheckpointError, match="neither model.safetensors nor pytorch_model.bin"):
        Bert.from_pretrained(folder)


def test_no_vocab_txt(tmp_path):
    folder = write_folder(tmp_path / "v", legacy_checkpoint()[0], vocab=False)
    with pytest.raises(CheckpointError, match="vocab.txt"):
        common.Tokenizer.from_pretrained(folder)


def test_mlm_request_without_mlm_head(tmp_path):
    folder = write_folder(tmp_path / "nomlm", legacy_checkpoint(mlm=False)[0])
    with pytest.raises(CheckpointError, match="masked-LM head"):
        Bert.from_pretrained(folder, mlm_head=True)


# ---- the command line and the import rule --------------------------------------------------------

def test_cli_eval_reports_a_broken_checkpoint_in_one_line(tmp_path, senteval_dir):
    tensors, _ = legacy_checkpoint()
    del tensors["bert.encoder.layer.0.attention.self.key.bias"]
    folder = write_folder(tmp_path / "broken", tensors)
    proc = subprocess.run([sys.executable, "common.py", "eval", "--model", str(folder),
                           "--senteval",
                           str(senteval_dir), "--device", "cpu"], cwd=ROOT, capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    assert "layers.0.key.bias" in lines[0], proc.stderr


IMPORT_CHECK = """
import json, sys
import torch, numpy, scipy.stats
before = set(sys.modules)
import common
new = sorted({m.split(".")[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names) -
{"common"})
print(json.dumps({"new": new, "all": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def test_common_imports_only_stdlib_torch_numpy_scipy():
    proc = subprocess.run([sys.executable, "-c", IMPORT_CHECK], cwd=ROOT, capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (
        result["new"] == []
    ), f"common.py imports modules beyond stdlib/torch/numpy/scipy: {result['new']}"
    forbidden = {"transformers", "safetensors", "tokenizers", "sentence_transformers", "tqdm"}
    assert not forbidden & set(result["all"])
