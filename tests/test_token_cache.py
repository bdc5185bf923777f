"""The token cache holds what its key says [issue 63]: a training file that changes between its
hash and the tokenizing read leaves no entry holding other tokens under the old bytes' key; SIGTERM
while a pool of workers tokenizes stops the set-up as Ctrl-C does (one line, no worker traceback,
no cache entry)."""
import contextlib
import hashlib
import signal
import subprocess
import sys
import textwrap

import common
from tiny_world import tokenizer

ORIGINAL = "a man is playing a guitar .\n" * 20
OTHER = "a dog runs in the park .\n" * 20


def test_a_file_changed_while_read_is_cached_as_it_was_read(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    path, tok, real = tmp_path / "data.txt", tokenizer(), common.sha256_file
    path.write_text(ORIGINAL)

    def hash_then_change(p):  # the file is rewritten between the hash and the tokenizing read
        digest = real(p)
        path.write_text(OTHER)
        return digest
    monkeypatch.setattr(common, "sha256_file", hash_then_change)
    data, _, hit = common.tokenize_file(tok, path, 32)
    assert not hit and list(data[0][0]) == tok.encode(OTHER.splitlines()[0], 32)
    assert data.sha256 == hashlib.sha256(OTHER.encode()).hexdigest()  # what was tokenized
    monkeypatch.setattr(common, "sha256_file", real)
    path.write_text(ORIGINAL)  # the original again: its tokens, never the other's
    data, _, hit = common.tokenize_file(tok, path, 32)
    assert list(data[0][0]) == tok.encode(ORIGINAL.splitlines()[0], 32)
    assert data.sha256 == hashlib.sha256(ORIGINAL.encode()).hexdigest()
    assert common.tokenize_file(tok, path, 32)[2]  # cached now, as read


def test_sigterm_while_the_pool_tokenizes_is_one_line(tmp_path):
    """The parent gets SIGTERM (`kill PID`) while its workers tokenize, one of them not yet started:
    exit as Ctrl-C does, and no worker's traceback (its signals wait till it has started)."""
    path = tmp_path / "data.txt"
    path.write_text("".join(f"sentence number {i} is here .\n" for i in range(400)))
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path[:0] = [{str(common.PROJECT)!r}, {str(common.PROJECT / "tests")!r}]
        import common
        from tiny_world import tokenizer
        common.TOKENIZE_POOL_BYTES, common.TOKENIZE_CHUNK = 0, 10
        common.os.cpu_count = lambda: 2
        real = common.tokenize_chunk

        def chunk_then_sigterm(rows):
            if rows[0] == ("sentence number 0 is here .",):
                os.kill(os.getppid(), signal.SIGTERM)
                time.sleep(1)  # the parent has gone on: this worker's result finds no reader
            return real(rows)
        common.tokenize_chunk = chunk_then_sigterm
        forks = []  # the second worker lingers after its fork, before start_tokenizing
        os.register_at_fork(after_in_parent=lambda: forks.append(1),
                            after_in_child=lambda: time.sleep(2 * len(forks)))
        common.main_guard(common.tokenize_file, tokenizer(), {str(path)!r}, 32)
        print("not stopped")
        """)
    cache = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**common.os.environ, "SIMCSE_CACHE": str(cache)})
    try:
        stderr = proc.communicate(timeout=120)[1]
    finally:  # a pool that never ends (the worker not yet started, unmasked): all of it goes
        with contextlib.suppress(ProcessLookupError):  # the normal case: all ended already
            common.os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGINT and stderr == "interrupted\n", stderr
    assert not list(cache.glob("tokens/*"))  # no cache entry
