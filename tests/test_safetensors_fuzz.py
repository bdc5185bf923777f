"""Mutation test of the safetensors reader: thousands of randomly corrupted headers, size fields and
truncations of a valid file give a clean result or our CheckpointError, never another exception,
never a hang, and never an allocation beyond the file's size (measured with tracemalloc: the
reader's buffers are Python allocations). The oracle: the safetensors format as its specification
writes it (the file built by hand)."""
import json
import random
import time
import tracemalloc

import pytest
import torch

import common


def valid_file(path):
    tensors = {"w": torch.randn(3, 4), "scalar": torch.tensor(2.5), "ids": torch.arange(5),
               "rng": torch.arange(7,
               dtype=torch.uint8), "half": torch.randn(2, dtype=torch.bfloat16),
               "empty": torch.zeros(0, 3)}
    common.write_safetensors(path, tensors)
    return tensors


def test_round_trip_with_0_dim_and_u8(tmp_path):
    tensors = valid_file(tmp_path / "a.safetensors")
    back = common.read_safetensors(tmp_path / "a.safetensors")
    assert back.keys() == tensors.keys()
    assert all(back[k].shape == t.shape and back[k].dtype == t.dtype and torch.equal(back[k], t)
               for k, t in tensors.items())


HOSTILE = [1, -1, 0, 2**40, 2**63, -2**63, 1.5, "F32", None, True, [], {}, [0], [0, 2**62], [2**62]
           * 64,
           [2**31] * 3, [-1, 4], "x" * 300, [[0]], {"dtype": "F32"}]


def mutate_header(header, rng):
    """One structured corruption: a field of a tensor entry (or the entry, or the metadata)
    replaced."""
    header = json.loads(json.dumps(header))
    name = rng.choice(list(header))
    kind = rng.random()
    if kind < 0.2:
        header[name] = rng.choice(HOSTILE)
    elif kind < 0.8 and name != "__metadata__":
        header[name][rng.choice(["dtype", "shape", "data_offsets"])] = rng.choice(
            HOSTILE + ["U8", "I64", "BF16", "F64", "Q4"])
    elif kind < 0.9 and name != "__metadata__":
        offsets = header[name]["data_offsets"]
        header[name]["data_offsets"] = [
            offsets[0] + rng.randint(-9, 9),
            offsets[1] + rng.randint(-9, 9),
        ]
    else:
        header[rng.choice(["__metadata__", "extra", name])] = rng.choice(HOSTILE)
    return header


def corrupt(blob, rng):
    n = int.from_bytes(blob[:8], "little")
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    kind = rng.random()
    if kind < 0.4:
        text = json.dumps(mutate_header(header, rng)).encode()
        return len(text).to_bytes(8, "little") + text + data
    if kind < 0.55:
        return blob[:rng.randrange(len(blob))]  # truncated anywhere
    if kind < 0.7:
        return (
            rng.choice([0, 1, n - 1, n + 1, len(blob), 2**63, 2**64 - 1, 10**8]).to_bytes(
                8, "little"
            )
            + blob[8:]
        )
    raw = bytearray(blob)
    for _ in range(rng.randint(1, 4)):  # random bytes flipped, mostly in the header
        raw[rng.randrange(min(len(raw), 8 + n + 8))] = rng.randrange(256)
    return bytes(raw)


def test_thousands_of_corruptions_give_only_checkpoint_errors(tmp_path):
    source = tmp_path / "valid.safetensors"
    valid_file(source)
    blob, rng, path = source.read_bytes(), random.Random(0), tmp_path / "bad.safetensors"
    outcomes, slowest, peak = {"ok": 0, "CheckpointError": 0}, 0.0, 0
    tracemalloc.start()
    try:
        for i in range(2500):
            bad = corrupt(blob, rng)
            path.write_bytes(bad)
            tracemalloc.reset_peak()
            before, start = tracemalloc.get_traced_memory()[0], time.perf_counter()
            try:
                tensors = common.read_safetensors(path)
                assert sum(t.numel() * t.element_size() for t in tensors.values()) <= len(bad)
                outcomes["ok"] += 1
            except common.CheckpointError as e:
                assert "\n" not in str(e) and len(str(e)) < 600, str(e)
                outcomes["CheckpointError"] += 1
            slowest = max(slowest, time.perf_counter() - start)
            peak = max(peak, tracemalloc.get_traced_memory()[1] - before - 16 * len(bad))
    finally:
        tracemalloc.stop()
    assert outcomes["CheckpointError"] > 1500, outcomes
    assert slowest < 0.5, slowest
    # JSON objects, messages
    assert peak < 2**20, f"the reader allocated {peak} bytes beyond 16 x the file's size"


@pytest.mark.parametrize("header", [
    # a huge shape over a few bytes
    {"t": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}},
    {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "u": {"dtype": "F32",
                                                                         "shape": [4],
                                                                          # overlap
                                                                          "data_offsets": [8, 24]}},
    {"t": {"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]}},  # an unhashable dtype
    {"__metadata__": [1], "t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
    [1, 2, 3],
])
def test_hostile_headers(tmp_path, header):
    text = json.dumps(header).encode()
    (tmp_path / "h.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + bytes(24))
    with pytest.raises(common.CheckpointError, match="not a valid safetensors file"):
        common.read_safetensors(tmp_path / "h.safetensors")


def test_a_directory_or_missing_file(tmp_path, capsys):
    """main_guard's one line naming the file (a model folder's files: folder_problem, first)."""
    for path in (tmp_path, tmp_path / "missing.safetensors"):
        with pytest.raises(SystemExit) as e:
            common.main_guard(common.read_safetensors, path)
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.startswith(f"error: cannot read or write {path} "), err
