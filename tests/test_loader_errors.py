"""Loader errors, each a CheckpointError with a clear message; the command line's one-line error for
a broken checkpoint; the import purity of common.py. The oracle: broken folders written by hand,
each naming its cause."""
import collections
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

import common
from common import Bert, CheckpointError
from conftest import ROOT
from test_checkpoints import CFG, legacy_checkpoint, write_folder
from tiny_world import make_model


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
                                              r".*span \d+ data bytes but the file holds \d+ "
                                              r"\(truncated\?\)"):
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


def test_a_truncated_pytorch_model_bin_says_so(tmp_path):
    """A cut download is no unsafe pickle: it is named truncated, with the fix [issue 63]."""
    folder = write_folder(tmp_path / "t", {}, fmt=None)
    torch.save(legacy_checkpoint()[0], folder / "pytorch_model.bin")
    whole = (folder / "pytorch_model.bin").read_bytes()
    (folder / "pytorch_model.bin").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt .*download it again"):
        Bert.from_pretrained(folder)


def test_a_model_file_that_is_a_folder_is_named_so(tmp_path):
    """Not "pass a text file with one sentence per line": that is the data's fix [issue 63]."""
    folder = write_folder(tmp_path / "d", legacy_checkpoint()[0])
    (folder / "config.json").unlink()
    (folder / "config.json").mkdir()
    with pytest.raises(common.UserError, match=r"its config\.json is a directory$"):
        common.check_model(str(folder), "--model")


def test_unused_pretraining_heads_are_noted_once_with_the_reason(tmp_path, capsys):
    """DiffCSE loads its model twice (encoder and discriminator): BERT's NSP head is noted once, and
    why (its pooler is loaded: --pooler cls)."""
    import torch
    folder = make_model(tmp_path / "m")
    tensors = common.read_safetensors(folder / "model.safetensors")
    tensors |= {"cls.seq_relationship.weight": torch.zeros(2, 32),
                "cls.seq_relationship.bias": torch.zeros(2)}
    common.write_safetensors(folder / "model.safetensors", tensors)
    common.Bert.from_pretrained(folder), common.Bert.from_pretrained(folder)
    err = [x for x in capsys.readouterr().err.splitlines() if "not used from the checkpoint" in x]
    assert len(err) == 1 and "pretraining heads" in err[0], err
    assert "seq_relationship.bias" in err[0], err
