"""The caches: a model in the Hugging Face cache is used in place, wherever huggingface_hub's
variables put it (symlinked snapshots, refs/main, as huggingface_hub writes them); a name with glob
characters matches only itself; SIMCSE_CACHE that is a file or unwritable is one line; wiki1m.txt
is fetched once into the cache from the stand-in hub (its bytes the hub's), and a failed download
leaves no empty folder and names the flag."""
import hashlib
import os

import pytest

import common
from conftest import nowhere


def hf_cache_snapshot(hub_cache, name, files):
    """A snapshot as huggingface_hub writes it [hub_facts, cache]: blobs/<etag>,
    snapshots/<commit>/<file> a relative symlink to ../../blobs/<etag>, refs/main holding the commit
    without a newline."""
    repo, commit = hub_cache / ("models--" + name.replace("/", "--")), "a" * 40
    for f, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (repo / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.join("..", "..", "blobs", blob.name), repo / "snapshots" / commit / f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


@pytest.mark.parametrize("variable", ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME",
                                      "XDG_CACHE_HOME"])
def test_a_model_in_the_hugging_face_cache_is_used_in_place(variable, hub, tmp_path, monkeypatch):
    """Where huggingface_hub would have put it, for each way its location is set; nothing is
    downloaded."""
    monkeypatch.delenv("HF_HUB_CACHE")
    base = tmp_path / variable
    monkeypatch.setenv(variable, str(base))
    hub_dir = {"HF_HOME": base / "hub",
               "XDG_CACHE_HOME": base / "huggingface" / "hub"}.get(variable, base)
    files = {f: hub.files[f"google-bert/bert-base-uncased/{f}"] for f
             in common.KNOWN_MODELS["bert-base-uncased"]}
    snapshot = hf_cache_snapshot(hub_dir, "bert-base-uncased", files)
    assert common.resolve_model("bert-base-uncased") == snapshot
    common.Bert.from_pretrained("bert-base-uncased")
    assert hub.requests == [] and not common.CACHE.exists()


def test_a_name_with_glob_characters_matches_only_itself(hub, tmp_path):
    files = {f: hub.files[f"google-bert/bert-base-uncased/{f}"] for f
             in common.KNOWN_MODELS["bert-base-uncased"]}
    hf_cache_snapshot(common.hub_cache(), "bert-base-uncased", files)
    for name in ("bert-*", "bert-base-uncase?", "[b]ert-base-uncased"):
        with pytest.raises(common.UserError, match="neither a folder nor a known name"):
            common.resolve_model(name)
    assert hub.requests == []


@pytest.mark.parametrize("where", ["a file", "/sys/simcse-cache"], ids=["file", "unwritable"])
def test_simcse_cache_that_is_a_file_or_unwritable_is_one_line(where, hub, tmp_path, monkeypatch):
    """/sys refuses a new folder even to root (chmod does not stop root, and CI runs as root)."""
    (tmp_path / "a file").write_text("")
    monkeypatch.setattr(common, "CACHE", tmp_path / where)
    with pytest.raises(common.UserError, match="SIMCSE_CACHE .* must name a writable folder"):
        common.resolve_model("bert-base-uncased")
    with pytest.raises(common.UserError, match="SIMCSE_CACHE"):
        common.download_senteval()
    assert (tmp_path / "a file").read_text() == "" and not os.path.exists("/sys/simcse-cache")


def test_wiki1m_resolves_to_the_simcse_corpus_once(hub, tmp_path, monkeypatch, capsys):
    corpus = hub.files["datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"]
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    common.check_file("wiki1m.txt")  # absent, yet known: no problem
    path = common.resolve_data("wiki1m.txt")
    assert path == tmp_path / "cache" / "data" / "wiki1m_for_simcse.txt"
    assert path.read_bytes() == corpus
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "wiki1m_for_simcse.txt" in notes[0], notes
    # a large file: the hub, then its CDN
    assert [host for _, host, _, _ in hub.requests] == ["hub", "cdn"]
    assert common.resolve_data("wiki1m.txt") == path  # cached now: the server is not asked again
    assert len(hub.requests) == 2 and not (tmp_path / "cwd" / "wiki1m.txt").exists()


@pytest.mark.parametrize("name, flag", [("bert-base-uncased", "--model"),
                                        ("distilbert-base-uncased", "--generator")])
def test_failed_download_leaves_no_empty_cache_folder(name, flag, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "HF_ENDPOINT", nowhere())
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    # no snapshot of a real download either
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(common.UserError) as e:
        # --model: the default
        common.resolve_model(*(name,) if flag == "--model" else (name, flag))
    assert "offline" in str(e.value) and flag in str(e.value), str(e.value)
    assert not (common.CACHE / "models" / name).exists()
