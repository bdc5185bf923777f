"""Saving: a round trip on MiniLM, the files parsed independently of common.py (struct, json and
numpy: the oracle), bf16, the MLM head; a saved vocab.txt tokenizes as its source did, and a run's
files get the user's usual permissions with no temporary left."""
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import common
from common import Bert
from conftest import tiny_config
from test_checkpoints import CFG, LAYER, unused_line


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
    common.save_pretrained(model, folder, tok)
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
    pooler = {"pooler.dense.weight", "pooler.dense.bias"}  # MiniLM's, kept: --pooler cls
    assert set(got) == bert_model_keys(model.cfg.num_hidden_layers) | pooler
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
    common.save_pretrained(model, folder, tok, dtype=torch.bfloat16)
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
    common.save_pretrained(model, tmp_path / "mlm", tok)
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


def test_a_saved_vocab_tokenizes_as_its_source(tmp_path):
    """vocab.txt with a token twice, a blank line and CRLF endings: ids are line numbers, so the
    saved folder keeps every line where it was (the shadowed duplicate as a blank line)."""
    from tiny_world import make_vocab
    words = make_vocab()
    lines = words[:10] + ["man", ""] + words[10:]  # "man" again (WORDS has it), then a blank line
    src = tmp_path / "src"
    src.mkdir()
    (src / "vocab.txt").write_bytes("".join(t + "\r\n" for t in lines).encode())
    tok = common.Tokenizer.from_pretrained(src)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(lines)))
    common.save_pretrained(model, tmp_path / "dst", tok)
    again = common.Tokenizer.from_pretrained(tmp_path / "dst")
    sentences = ["a man is playing a guitar .", "the woman , a dog", "zebra ##s and the man"]
    assert [again.encode(s) for s in sentences] == [tok.encode(s) for s in sentences]
    assert len((tmp_path / "dst" / "vocab.txt").read_text().splitlines()) == len(lines)
    # the saved folder loads: vocab.txt fits its embedding rows
    common.Bert.from_pretrained(tmp_path / "dst")


def test_written_files_get_the_usual_permissions(world, tmp_path):
    import simcse_min
    out = tmp_path / "out"
    simcse_min.train(tiny_config(simcse_min, world, out, eval_every=2))
    umask = os.umask(0o022)  # read it (the only way is to set it) and put it back
    os.umask(umask)
    want = 0o666 & ~umask
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert modes and all(m == want for m in modes.values()), (oct(want), modes)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left
