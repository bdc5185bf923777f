"""Downloads against the stand-in hub (stand_in_hub.py), which answers as the real hub is recorded
to answer (fixtures/hub_facts.py): a large file is a 302 to a CDN on another host, its SHA-256 and
size stated in the hub's own answer only; the CDN's ETag is no SHA-256; a renamed repository
redirects relatively; errors carry X-Error-Code. Every known model name fetches files its repository
really holds, and the Hugging Face cache is used in place."""
import re

import pytest

import common
from conftest import LARGE, nowhere, one_file_hub, same_bytes, url
from fixtures import hub_facts as facts
from stand_in_hub import StandInHub

BLOB = bytes(range(256)) * 4000  # 1,024,000 bytes: more than one 1 MiB read chunk
TAR = "datasets/princeton-nlp/datasets-for-simcse/senteval.tar"


@pytest.fixture
def blob_hub():
    """The stand-in hub holding one large (LFS) file, org/model/model.safetensors, and a small
    one."""
    with one_file_hub(BLOB, {"org/model/config.json": b'{"a": 1}'}) as h:
        yield h


def test_large_file_via_the_cdn_checked_against_the_hubs_sha256(blob_hub, tmp_path, capsys,
                                                               monkeypatch):
    monkeypatch.setattr(common, "PROGRESS_EVERY", 0)  # every piece's line: the progress shown
    dest = common.download(url(blob_hub), tmp_path / "sub" / "model.safetensors")
    assert same_bytes(dest.read_bytes(), BLOB)
    assert not (tmp_path / "sub" / "model.safetensors.part").exists()
    assert [(m, host, r) for m, host, _, r in blob_hub.requests] == [("HEAD", "hub", None), ("GET",
                                                                                             "cdn",
                                                                                             None)]
    err = capsys.readouterr().err
    assert "model.safetensors: 1,024,000/1,024,000 bytes" in err  # through Progress [issue 40]


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
def test_resume_after_a_cut_verifies_the_whole_file(blob_hub, tmp_path, reset):
    blob_hub.cut_after, blob_hub.reset = 300_000, reset
    dest, part = tmp_path / "model.safetensors", tmp_path / "model.safetensors.part"
    with pytest.raises(common.UserError, match="cut") as e:
        common.download(url(blob_hub), dest)
    assert "again" in str(e.value)  # tells the user what to do
    assert not dest.exists() and part.exists() and part.stat().st_size <= 300_000
    have = part.stat().st_size  # after a reset, what was in flight may be lost: 0 is fine then
    assert BLOB.startswith(part.read_bytes()) and (have > 0 or reset)
    common.download(url(blob_hub), dest)
    assert same_bytes(dest.read_bytes(), BLOB) and not part.exists()
    # the hub asked again (its CDN address may expire), then a Range
    head, get = blob_hub.requests[-2:]
    assert (head[:2], get[:2], get[3]) == (("HEAD", "hub"), ("GET", "cdn"), f"bytes={have}-" if have
                                           else None)


def test_a_resumed_part_that_does_not_match_is_caught(blob_hub, tmp_path):
    (tmp_path / "model.safetensors.part").write_bytes(b"garbage")  # not the file's first bytes
    with pytest.raises(common.UserError, match="corrupt.*SHA-256"):
        common.download(url(blob_hub), tmp_path / "model.safetensors")
    assert not (tmp_path / "model.safetensors.part").exists()
    common.download(url(blob_hub), tmp_path / "model.safetensors")  # and the next try starts over
    assert same_bytes((tmp_path / "model.safetensors").read_bytes(), BLOB)


def test_cdn_ignoring_range_starts_over(blob_hub, tmp_path):
    (tmp_path / "model.safetensors.part").write_bytes(BLOB[:1000])
    blob_hub.ignore_range = True
    common.download(url(blob_hub), tmp_path / "model.safetensors")
    assert same_bytes((tmp_path / "model.safetensors").read_bytes(), BLOB)


def test_a_whole_part_file_is_finished_without_fetching(blob_hub, tmp_path):
    (tmp_path / "model.safetensors.part").write_bytes(BLOB)
    common.download(url(blob_hub), tmp_path / "model.safetensors")
    assert same_bytes((tmp_path / "model.safetensors").read_bytes(), BLOB)
    # the size the hub states: nothing left
    assert [host for _, host, _, _ in blob_hub.requests] == ["hub"]


def test_bytes_that_differ_from_the_stated_sha256_are_deleted(blob_hub, tmp_path):
    blob_hub.corrupt = True
    with pytest.raises(common.UserError, match="corrupt.*SHA-256"):
        common.download(url(blob_hub), tmp_path / "model.safetensors")
    assert not list(tmp_path.iterdir())


def test_the_cdns_etag_is_never_taken_for_a_sha256(blob_hub, tmp_path):
    """The CDN's ETag is 64 hex digits (the Xet hash) but not the SHA-256 [hub_facts.CDN_FILE];
    where the hub states no X-Linked-Etag there is nothing to check, and the file is not called
    corrupt."""
    blob_hub.unstated.add(LARGE)
    dest = common.download(url(blob_hub), tmp_path / "model.safetensors")
    assert same_bytes(dest.read_bytes(), BLOB)


def test_a_small_files_git_sha1_etag_is_not_a_checksum(blob_hub, tmp_path):
    assert common.download(url(blob_hub, "config.json"),
                           tmp_path / "c.json").read_bytes() == b'{"a": 1}'
    assert [(m, host) for m, host, _, _ in blob_hub.requests] == [("HEAD", "hub"), ("GET", "hub")]


@pytest.mark.parametrize("path, expected", [
    ("org/model/resolve/main/nope.bin", "HTTP 404.*EntryNotFound"),
    ("org/model/resolve/v9/config.json", "HTTP 404.*RevisionNotFound"),
    ("org/missing/resolve/main/config.json", "HTTP 401.*RepoNotFound"),
    ("org/gated/resolve/main/config.json", "HTTP 403.*GatedRepo.*huggingface-cli download")])
def test_hub_errors_are_one_line_naming_the_cause(path, expected, tmp_path):
    with StandInHub({LARGE: BLOB, "org/model/config.json": b"{}"}, gated={"org/gated"}) as hub:
        with pytest.raises(common.UserError, match=expected):
            common.download(f"{hub.url}/{path}", tmp_path / "x" / "f")
    assert not (tmp_path / "x").exists()


def test_offline_message(tmp_path):
    with pytest.raises(common.UserError, match="offline"):
        common.download(f"{nowhere()}/m/resolve/main/config.json", tmp_path / "config.json")


@pytest.mark.parametrize("name", list(common.KNOWN_MODELS))
def test_every_known_name_fetches_files_its_repository_holds(name, hub):
    """Through the renamed repository's redirect where the name is an old one; each file one the
    recorded repository holds; the model and tokenizer load from what arrived, and a second load
    asks nothing."""
    repo = facts.RENAMED.get(name, name)
    held = [f.removesuffix(":L") for f in facts.MODEL_FILES[repo]]
    assert set(common.KNOWN_MODELS[name]) <= set(held), "a file the repository does not hold"
    kind = "distilbert" if name == "distilbert-base-uncased" else None
    model = common.Bert.from_pretrained(name, mlm_head=kind is not None)
    tok = common.Tokenizer.from_pretrained(name)
    got = [p.rsplit("/", 1)[1] for m, host, p, _ in hub.requests if m == "HEAD"
           and p.startswith(f"/{name}/")]
    assert got == common.KNOWN_MODELS[name]
    folder = common.CACHE / "models" / name
    # no .part left
    assert sorted(p.name for p in folder.iterdir()) == sorted(common.KNOWN_MODELS[name])
    assert all((folder / f).read_bytes() == hub.files[f"{repo}/{f}"] for f
               in common.KNOWN_MODELS[name])
    assert model.cfg.model_type == ("roberta" if "roberta" in name else kind or "bert")
    if repo in facts.LEGACY_BERT_NAMES:  # loaded from bert-base-uncased's own tensor names
        names = common.read_safetensors(folder / "model.safetensors")
        assert "bert.embeddings.LayerNorm.gamma" in names
    assert len(tok.vocab) == model.cfg.vocab_size or "roberta" in name
    n = len(hub.requests)
    common.Bert.from_pretrained(name, mlm_head=kind is not None)
    assert len(hub.requests) == n


@pytest.mark.parametrize("what", ["wiki1m_for_simcse.txt", "senteval", "bert-base-uncased"])
def test_download_offline_names_no_flag_it_does_not_have(what, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(common, "CACHE", tmp_path / "c")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(common.UserError) as e:
        common.cli(["download", what])
    err = str(e.value)
    assert "offline" in err and not re.search(r"\s--[a-z]",
                                              err) and f"put it at {tmp_path / 'c'}" in err, err
