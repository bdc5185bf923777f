"""The training file tokenized as a stream into flat arrays [issue 54]: the same ids as one
sentence at a time (and as the code before, recorded), in this process or a pool of workers; the
file read a chunk at a time; nothing kept per sentence but its ids. The oracles: the ids of one
sentence at a time, and the arrays recorded from the code before."""
import hashlib
import tracemalloc

import numpy as np
import pytest

import common
from tiny_world import tokenizer


def sha256(data):  # the arrays as the cache file holds them
    return hashlib.sha256(data.flat.astype("<i4").tobytes()
                          + data.offsets.astype("<i8").tobytes()).hexdigest()[:16]


# tokenize_file(MiniLM's vocab, wiki1m_head.txt, 32) at 04d782b, before the stream [issue 54]
HEAD_SHA256 = "428cce80b60e5c58"


@pytest.mark.parametrize("pool", [False, True])
def test_the_head_gives_the_arrays_it_gave_before(model_dir, wiki_path, tmp_path, monkeypatch,
                                                  pool):
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    if pool:
        monkeypatch.setattr(common, "TOKENIZE_POOL_BYTES", 0)
        monkeypatch.setattr(common.os, "cpu_count", lambda: 2)
        monkeypatch.setattr(common, "TOKENIZE_CHUNK", 1000)  # 12 chunks: 3 waves of 4
    data, _, hit = common.tokenize_file(common.Tokenizer.from_pretrained(model_dir), wiki_path, 32)
    tok = common.Tokenizer.from_pretrained(model_dir)
    one_by_one = [tok.encode(s, 32) for s in common.read_lines(wiki_path)]
    assert not hit and len(data) == len(one_by_one) == 11_914
    assert all(list(data[i][0]) == ids for i, ids in enumerate(one_by_one))
    assert data.flat.dtype == np.int32 and sha256(data) == HEAD_SHA256


def test_a_pool_skips_and_counts_the_rows_one_process_does(tmp_path, monkeypatch, capsys):
    path = tmp_path / "pairs.csv"
    rows = [f"a man {i} .,\u200b\u200d,no" if i % 7 == 3 else f"a man {i} .,he runs {i} .,no"
            for i in range(50)]
    path.write_text("\n".join(rows) + "\n")
    got = []
    for pool in (0, 1 << 40):
        monkeypatch.setattr(common, "CACHE", tmp_path / f"cache{pool}")
        monkeypatch.setattr(common, "TOKENIZE_POOL_BYTES", pool)
        monkeypatch.setattr(common.os, "cpu_count", lambda: 2)
        monkeypatch.setattr(common, "TOKENIZE_CHUNK", 8)
        got.append(common.tokenize_file(tokenizer(), path, 32)[0])
        assert "7 row(s)" in capsys.readouterr().err  # i = 3, 10, ..., 45
    assert len(got[0]) == 43 and got[0].cols == 3 and sha256(got[0]) == sha256(got[1])


def test_the_file_is_read_as_a_stream(tmp_path):
    """The first rows arrive before the rest is read: a bad byte near the end is not met yet."""
    path = tmp_path / "data.txt"
    path.write_bytes(b"a first line .\n" + b"more words here .\n" * 200_000 + b"\xff\n")
    rows = common.training_rows(path)
    assert next(rows) == ("a first line .",)
    with pytest.raises(common.UserError, match=r"not UTF-8 \(line 200002, byte 3600015\)"):
        list(rows)


def test_lines_end_where_the_whole_text_split_ended_them(tmp_path):
    """\\r, \\r\\n, \\v, \\x1c, \\x85, \\u2028 end a line, as str.splitlines did on the file."""
    path = tmp_path / "data.txt"
    path.write_bytes("\ufeffone\rtwo\r\nthree\x0bfour\x1cfive\x85six\u2028 seven \n\n".encode())
    assert [r[0] for r in common.training_rows(path)] == common.read_lines(path) == [
        "one", "two", "three", "four", "five", "six", "seven"]


def test_memory_is_the_arrays_not_a_list_per_sentence():
    """30,000 sentences of 32 tokens: 3.8 MB of int32 ids; as id lists they took ~35 MB."""
    tok = tokenizer()
    sentence = "the large number of sentences is long enough ."
    n = len(tok.encode(sentence, 32))  # its words cached before
    rows = ((sentence,) for _ in range(30_000))
    tracemalloc.start()
    flat, lengths, skipped = common.tokenize_rows(tok, rows, 32, workers=1)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(flat) == 30_000 * n and lengths.shape == (30_000, 1) and skipped == 0
    assert peak < 3 * flat.nbytes + 4e6, f"{peak / 1e6:.1f} MB at the peak"


def test_progress_is_said_in_megabytes_and_other_ranks_stay_quiet(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(common, "PROGRESS_EVERY", 0.0)
    path = tmp_path / "data.txt"
    path.write_text("a man is playing a guitar on the stage tonight .\n" * 75_000)  # 3.7 MB: the
    # line 70,000's progress is past 3 MB, not yet the end
    list(common.training_rows(path, common.Progress("corpus", "MB tokenized")))
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("corpus: 0/3 MB tokenized"), err
    assert [line.endswith("done") for line in err].count(True) == 1, err
    assert err[-1].startswith("corpus: 3/3 MB tokenized") and err[-1].endswith("done"), err
    monkeypatch.setattr(common, "world", lambda: (1, 2))
    list(common.training_rows(path, common.Progress("corpus", "MB tokenized")))
    assert capsys.readouterr().err == ""
