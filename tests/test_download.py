"""Downloads against a local HTTP server on 127.0.0.1 that behaves like the Hugging Face hub's file endpoint:
Range requests (206 + Content-Range, 416 past the end), an ETag with the file's SHA-256, and connections cut
after N bytes (a clean close or a reset)."""
import hashlib
import http.server
import re
import socket
import struct
import threading

import pytest
import torch

import common

BLOB = bytes(range(256)) * 4000  # 1,024,000 bytes: more than one 1 MiB read chunk


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        data = srv.files.get(self.path)
        srv.requests.append((self.path, self.headers.get("Range")))
        if data is None:
            self.send_error(404)
            return
        start, status = 0, 200
        m = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if m and not srv.ignore_range:
            start, status = int(m[1]), 206
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        body = data[start:]
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        etag = srv.etags.get(self.path, hashlib.sha256(data).hexdigest())
        if etag:
            self.send_header("ETag", f'"{etag}"')
        self.end_headers()
        if srv.cut_after is None:
            self.wfile.write(body)
            return
        self.wfile.write(body[:srv.cut_after])
        self.wfile.flush()
        srv.cut_after = None  # only the first response is cut
        self.close_connection = True
        if srv.reset:  # an abortive close (RST), as a dropped network connection looks to the client
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()


@pytest.fixture
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    srv.files, srv.etags, srv.requests = {}, {}, []
    srv.cut_after, srv.reset, srv.ignore_range = None, False, False
    srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
    thread = threading.Thread(target=srv.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def serve(srv, path, data):
    srv.files[path] = data
    return srv.url + path


def test_full_download_with_progress(server, tmp_path, capsys):
    url = serve(server, "/m/resolve/main/model.safetensors", BLOB)
    dest = common.download(url, tmp_path / "sub" / "model.safetensors")
    assert dest == tmp_path / "sub" / "model.safetensors" and dest.read_bytes() == BLOB
    assert not (tmp_path / "sub" / "model.safetensors.part").exists()
    err = capsys.readouterr().err
    assert "model.safetensors:" in err and "MB" in err
    assert server.requests == [("/m/resolve/main/model.safetensors", None)]


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_resume_after_a_cut(server, tmp_path, reset):
    url = serve(server, "/m/resolve/main/model.safetensors", BLOB)
    server.cut_after, server.reset = 300_000, reset
    dest = tmp_path / "model.safetensors"
    part = tmp_path / "model.safetensors.part"
    with pytest.raises(common.UserError, match="cut") as e:
        common.download(url, dest)
    assert "again" in str(e.value)  # tells the user what to do
    assert not dest.exists() and part.exists() and part.stat().st_size <= 300_000
    have = part.stat().st_size  # after a reset, what was in flight may be lost: 0 is fine then
    assert BLOB.startswith(part.read_bytes()) and (have > 0 or reset)
    common.download(url, dest)
    assert dest.read_bytes() == BLOB and not part.exists()
    assert server.requests[-1] == ("/m/resolve/main/model.safetensors", f"bytes={have}-" if have else None)


def test_server_ignoring_range_starts_over(server, tmp_path):
    url = serve(server, "/m/resolve/main/model.safetensors", BLOB)
    (tmp_path / "model.safetensors.part").write_bytes(b"garbage")
    server.ignore_range = True
    common.download(url, tmp_path / "model.safetensors")
    assert (tmp_path / "model.safetensors").read_bytes() == BLOB


def test_complete_part_file_is_finished_on_416(server, tmp_path):
    url = serve(server, "/m/resolve/main/model.safetensors", BLOB)
    (tmp_path / "model.safetensors.part").write_bytes(BLOB)
    common.download(url, tmp_path / "model.safetensors")
    assert (tmp_path / "model.safetensors").read_bytes() == BLOB
    assert server.requests[-1][1] == f"bytes={len(BLOB)}-"


def test_wrong_sha256_is_detected_and_the_part_deleted(server, tmp_path):
    path = "/m/resolve/main/model.safetensors"
    url = serve(server, path, BLOB)
    server.etags[path] = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(common.UserError, match="corrupt.*SHA-256"):
        common.download(url, tmp_path / "model.safetensors")
    assert not (tmp_path / "model.safetensors").exists() and not (tmp_path / "model.safetensors.part").exists()
    with pytest.raises(common.UserError, match="corrupt"):  # an explicit expected hash is checked too
        common.download(url, tmp_path / "x.bin", expected_sha256="0" * 64)


def test_non_sha256_etag_is_not_a_checksum(server, tmp_path):
    path = "/m/resolve/main/config.json"
    url = serve(server, path, b'{"a": 1}')
    server.etags[path] = "0123456789abcdef0123456789abcdef01234567"  # a git blob sha1, as for small files
    assert common.download(url, tmp_path / "config.json").read_bytes() == b'{"a": 1}'


def test_http_error_is_a_user_error(server, tmp_path):
    with pytest.raises(common.UserError, match="HTTP 404"):
        common.download(server.url + "/nope/resolve/main/config.json", tmp_path / "config.json")


def test_offline_message(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(common.UserError, match="offline"):
        common.download(f"http://127.0.0.1:{port}/m/resolve/main/config.json", tmp_path / "config.json")


def test_resolve_model_downloads_a_known_name(server, tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny())
    vocab = list(common.SPECIAL_TOKENS) + [f"w{i}" for i in range(123)]
    tok = common.Tokenizer({w: i for i, w in enumerate(vocab)})
    source = tmp_path / "source"
    model.save_pretrained(source, tok)
    files = ["config.json", "vocab.txt", "tokenizer_config.json", "model.safetensors"]
    for f in files:
        serve(server, f"/fake/tiny-bert/resolve/main/{f}", (source / f).read_bytes())
    monkeypatch.setattr(common, "HF_ENDPOINT", server.url)
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    monkeypatch.setitem(common.KNOWN_MODELS, "fake/tiny-bert", files)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))

    folder = common.resolve_model("fake/tiny-bert")
    assert folder == tmp_path / "cache" / "models" / "fake" / "tiny-bert"
    assert [p for p, _ in server.requests] == [f"/fake/tiny-bert/resolve/main/{f}" for f in files]
    assert all((folder / f).read_bytes() == (source / f).read_bytes() for f in files)
    loaded = common.Bert.from_pretrained("fake/tiny-bert")  # from the cache now: no new request
    assert len(server.requests) == len(files)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    assert common.Tokenizer.from_pretrained("fake/tiny-bert").vocab == tok.vocab
    with pytest.raises(common.UserError, match="neither a folder nor a known name"):
        common.resolve_model("fake/unknown-model")


@pytest.mark.parametrize("name", ["roberta-base", "roberta-large", "distilroberta-base"])
def test_roberta_names_download_their_bpe_files(name, server, tmp_path, monkeypatch):
    """The known RoBERTa names fetch config.json, vocab.json, merges.txt and the weights (served here by a tiny
    RoBERTa under the real name), and load as RoBERTa with its byte-level BPE."""
    from fixtures.make_roberta_fixtures import bpe_vocab, read_merges
    merges = read_merges()[:40]
    tok = common.BPETokenizer(bpe_vocab(merges), merges)
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab), model_type="roberta", pad_token_id=1))
    model.save_pretrained(tmp_path / "source", tok)
    for f in common.KNOWN_MODELS[name]:
        serve(server, f"/{name}/resolve/main/{f}", (tmp_path / "source" / f).read_bytes())
    monkeypatch.setattr(common, "HF_ENDPOINT", server.url)
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert common.KNOWN_MODELS[name] == ["config.json", "vocab.json", "merges.txt", "model.safetensors"]
    loaded, again = common.Bert.from_pretrained(name), common.Tokenizer.from_pretrained(name)
    assert loaded.cfg.model_type == "roberta" and (again.vocab, again.merges) == (tok.vocab, tok.merges)
    assert [p for p, _ in server.requests] == [f"/{name}/resolve/main/{f}" for f in common.KNOWN_MODELS[name]]
