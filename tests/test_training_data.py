"""The training file as training reads it [issue 17]: CSV parsed as CSV (a BOM, a header, quoted
commas, quotes and newlines, capitals in the name), rows without a token skipped and counted, a
file past the memory bound refused, and a corrupt token cache rebuilt with a note. The oracle:
the rows written into each file, and the ids the tokenizer gives them afresh."""
import pytest

import common


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


def test_a_data_file_past_the_memory_bound_is_refused(world, monkeypatch):
    monkeypatch.setattr(common, "MAX_DATA_BYTES", 100)
    with pytest.raises(common.UserError, match="read into memory; split it"):
        common.check_file(world["data"])
