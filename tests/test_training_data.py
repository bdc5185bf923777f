"""Nothing lost, nothing silently wrong (issue 17), beyond the command-line table of
tests/tools/bad_inputs.py: a dev score that is not a number never selects the model, every JSON is
strict, a saved vocab.txt tokenizes as its source did, a corrupt token cache is rebuilt, CSV is
parsed as CSV, rows without a token are skipped and counted, and written files get the user's usual
permissions."""
import json
import math

import pytest

import common
from tiny_world import make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return {k: v for k, v in make_world(tmp_path_factory.mktemp("hostile")).items()
            if k != "generator"}


def strict_json(path):
    def refuse(token):
        raise ValueError(f"{path} holds {token}, which strict JSON does not have")
    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("scores", [[math.nan, 5.0, math.nan, 4.0, math.nan], [math.nan] * 5])
def test_a_dev_score_that_is_not_a_number_is_never_best(scores, world, tmp_path, monkeypatch):
    import simcse_min
    given = iter(scores)
    monkeypatch.setattr(simcse_min, "evaluate_dev", lambda model, dev, pooler, progress=None: {
        "stsb_dev": next(given), "align": 0.5, "uniform": -2.0})
    out = tmp_path / "out"
    simcse_min.train(simcse_min.Config(**world, device="cpu", batch_size=8, max_steps=4,
                                       eval_every=1,
                                       out_dir=str(out)))
    results = strict_json(out / "results.json")  # NaN and -inf written as null
    finite = [(s, d) for s, d in enumerate(scores) if math.isfinite(d)]
    best_step, best_dev = max(finite, key=lambda x: x[1]) if finite else (0, None)
    assert (results["best_step"], results["best_dev"]) == (best_step, best_dev)
    assert [d for _, d in results["dev_history"]] == [d if math.isfinite(d) else None for d
                                                      in scores]


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


def test_a_corrupt_token_cache_is_rebuilt_with_a_note(world, tmp_path, monkeypatch, capsys):
    import numpy as np
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    tok = common.Tokenizer.from_pretrained(world["model"])
    first, _, hit = common.tokenize_file(tok, world["data"], 32)
    cached, = (tmp_path / "cache" / "tokens").iterdir()
    rows = [first[i] for i in range(len(first))]
    # an id past the vocab
    bad_arrays = dict(flat=np.array([10**6], np.int32), offsets=np.array([0, 1]), cols=1)
    for corrupt in (lambda: cached.write_bytes(b"PK\x03\x04 cut"), lambda: np.savez(cached,
                                                                                    **bad_arrays)):
        corrupt()
        capsys.readouterr()
        data, _, hit = common.tokenize_file(tok, world["data"], 32)
        assert not hit and [data[i] for i in range(len(data))] == rows
        assert "is unreadable" in capsys.readouterr().err
        assert common.tokenize_file(tok, world["data"], 32)[2]  # rebuilt: the next run reads it


def test_csv_is_parsed_as_csv(tmp_path):
    # capitals; a BOM; a header; quoted commas, quotes and a newline; a blank row
    path = tmp_path / "NLI.CSV"
    path.write_bytes("\ufeffsent0,sent1,hard_neg\r\n".encode() + b'"a man, sitting","he '
                                                                 b'""sits""\nthere",no\r\n\r\n'
                     b"x,y,z\r\n")
    assert list(common.training_rows(path)) == [("a man, sitting", 'he "sits"\nthere', "no"),
                                                ("x", "y", "z")]


def test_rows_without_a_token_are_skipped_and_counted(world, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    path = tmp_path / "data.txt"
    path.write_text("a man .\n\u200b\u200d\n\x07\x1b\na dog .\n")
    data, _, _ = common.tokenize_file(common.Tokenizer.from_pretrained(world["model"]), path, 32)
    assert len(data) == 2 and "2 row(s)" in capsys.readouterr().err


def test_written_files_get_the_usual_permissions(world, tmp_path):
    import simcse_min
    out = tmp_path / "out"
    simcse_min.train(simcse_min.Config(**world, device="cpu", batch_size=8, max_steps=2,
                                       out_dir=str(out)))
    want = 0o666 & ~common.UMASK
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert modes and all(m == want for m in modes.values()), (oct(want), modes)
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_data_file_past_the_memory_bound_is_refused(world, monkeypatch):
    monkeypatch.setattr(common, "MAX_DATA_BYTES", 100)
    with pytest.raises(common.UserError, match="read into memory; split it"):
        common.check_data(world["data"])


def test_a_queue_entry_of_another_width_is_refused():
    import collections
    import torch
    model, queue = common.Bert(common.BertConfig.tiny()), collections.deque()
    common.restore_state(queue, [torch.zeros(32)], "cpu", model, 0)  # the model's width: restored
    assert len(queue) == 1
    with pytest.raises(ValueError, match="width"):
        common.restore_state(queue, [torch.zeros(31)], "cpu", model, 0)


def test_a_resumed_optimizer_keeps_this_devices_fused_choice():
    """A checkpoint saved on the CPU (fused off) resumed on CUDA, where make_optimizer turns fused
    AdamW on: the live optimizer's choice stays, the saved one does not replace it [issue 30]."""
    import torch
    model = common.Bert(common.BertConfig.tiny())
    saved_on_cpu, _ = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
    state = saved_on_cpu.state_dict()
    assert not state["param_groups"][0]["fused"]
    live, _ = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
    live.param_groups[0]["fused"] = True  # as make_optimizer sets it on CUDA
    assert common.restore_state(live, state, "cpu", model, 0) == ""
    assert live.param_groups[0]["fused"] is True
