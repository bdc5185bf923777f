"""Downloads that mislead [issue 40], against the stand-in hub's hostile modes: a redirect is
followed to http or https only, at most 10 times, by one rule for the hub and the CDN; a trickle
is cut with one line saying to run again, and resumes; a stated size that lies never reaches the
cache and leaves no .part that fails forever; size headers are ASCII digits or nothing."""
import email.message
import http.server
import threading

import pytest

import common
from conftest import one_file_hub, same_bytes, url

BLOB = bytes(range(256)) * 400  # 102,400 bytes


@pytest.fixture
def hub():
    with one_file_hub(BLOB) as h:
        yield h


@pytest.mark.parametrize("location", ["file:///etc/passwd", "data:,not-a-model",
                                      "ftp://127.0.0.1/model.safetensors"])
def test_a_redirect_to_anything_but_http_is_refused_and_nothing_is_saved(hub, tmp_path, location):
    hub.location = location  # before: a file: or data: Location was copied into the cache, exit 0
    with pytest.raises(common.UserError, match="only http and https are followed"):
        common.download(url(hub), tmp_path / "sub" / "model.safetensors")
    assert not (tmp_path / "sub").exists()


def test_the_cdns_own_redirect_follows_the_same_rule(hub, tmp_path, monkeypatch):
    real = common.open_url
    seen = []

    def spy(address, *args, **kw):
        seen.append(kw.get("follow"))
        return real(address, *args, **kw)
    monkeypatch.setattr(common, "open_url", spy)
    assert common.download(url(hub), tmp_path / "m").read_bytes() == BLOB
    assert seen == [common.same_host, None]  # the hub's HEAD, then the CDN's GET: one function


def test_a_redirect_loop_is_one_line(hub, tmp_path):
    hub.location = url(hub)  # the hub sends the file to itself (before: 'cut at 0 of ?')
    with pytest.raises(common.UserError, match="redirected more than 10 times"):
        common.download(url(hub), tmp_path / "model.safetensors")
    assert not list(tmp_path.iterdir())


def test_a_trickle_is_cut_with_one_line_and_the_rerun_resumes(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "LOW_SPEED", (1024, 0.5))  # curl's rule, its time shortened
    hub.slow = (16, 0.05)  # 320 bytes/s: never given up on before, and no progress shown
    dest, part = tmp_path / "model.safetensors", tmp_path / "model.safetensors.part"
    with pytest.raises(common.UserError, match="stalled.*run the same command again to resume"):
        common.download(url(hub), dest)
    have = part.stat().st_size
    assert 0 < have < 1024 and not dest.exists()
    hub.slow = None
    assert same_bytes(common.download(url(hub), dest).read_bytes(), BLOB)
    assert hub.requests[-1][3] == f"bytes={have}-"  # resumed where the trickle stopped
    assert not part.exists()


def test_nothing_new_for_the_limit_is_a_cut_too(hub, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "LOW_SPEED", (1, 0.3))  # 1 byte/s passes; a silent 0.3 s does not
    hub.slow = (50_000, 1.0)  # a piece, then a second of silence
    with pytest.raises(common.UserError, match=r"cut at 50000 of 102400 bytes \(timed out\); run"):
        common.download(url(hub), tmp_path / "model.safetensors")


def test_more_bytes_than_the_stated_size_are_never_cached(hub, tmp_path):
    hub.stated_size = 1000  # the hub's size lies low: the CDN sends 102,400
    with pytest.raises(common.UserError, match="bytes where the hub states 1000; deleted it"):
        common.download(url(hub), tmp_path / "model.safetensors")
    assert not list(tmp_path.iterdir())  # no file, and no .part that fails the same way again


def test_a_part_that_can_never_reach_the_stated_size_is_removed(hub, tmp_path):
    hub.stated_size = len(BLOB) + 10  # the hub's size lies high: the file is always short
    dest, part = tmp_path / "model.safetensors", tmp_path / "model.safetensors.part"
    with pytest.raises(common.UserError, match="cut at 102400 of 102410"):
        common.download(url(hub), dest)
    assert not dest.exists()  # a size that differs is never renamed into the cache
    with pytest.raises(common.UserError, match="HTTP 416"):
        common.download(url(hub), dest)  # the .part reaches the real end: it can never match
    assert not list(tmp_path.iterdir())
    part.write_bytes(BLOB + b"more")  # longer than stated: removed, fetched afresh
    hub.stated_size = None
    assert same_bytes(common.download(url(hub), dest).read_bytes(), BLOB)


@pytest.mark.parametrize("value, size", [("²", None), ("١٢", None), ("12a", None), ("", None),
                                         (" 12 ", 12), ("102400", 102400)])
def test_size_headers_are_ascii_digits_or_nothing(value, size):
    headers = email.message.Message()
    headers["Content-Length"] = value  # '²'.isdigit() is True, int('²') a ValueError
    assert common.header_int(headers, "Content-Length") == size


def test_a_stated_size_in_odd_digits_is_no_traceback(hub, tmp_path):
    hub.stated_size = "²"  # before: a ValueError traceback in int()
    assert same_bytes(common.download(url(hub), tmp_path / "m").read_bytes(), BLOB)


def test_a_file_of_no_stated_size_is_read_to_its_end(tmp_path):
    """No Content-Length (HTTP/1.0, the body ends when the connection closes [RFC 9112 §6.3]: a
    mirror may answer so): the whole body is the file (before: its first 64 KiB, kept as whole)."""
    class NoSize(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(200)
            self.end_headers()

        def do_GET(self):
            self.do_HEAD()
            for i in range(0, len(BLOB), 1000):
                self.wfile.write(BLOB[i:i + 1000])

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NoSize)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        got = common.download(f"http://127.0.0.1:{server.server_port}/f", tmp_path / "f")
    finally:
        server.shutdown()
    assert same_bytes(got.read_bytes(), BLOB)
