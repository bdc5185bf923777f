"""A stand-in for huggingface.co on 127.0.0.1, built from the recorded facts in
fixtures/hub_facts.py (each with its source there), never from what common.py expects:

- the hub answers HEAD and GET on /{repo_id}/resolve/{revision}/{filename} (datasets:
/datasets/...):
  a file stored in git with 200 and its git-SHA1 as ETag; a file stored in LFS with 302 to the CDN
  (another host: its own port), X-Linked-Etag (its SHA-256), X-Linked-Size and a text body; a
  renamed
  repository with a relative redirect to its new name; a missing file with 404 EntryNotFound,
  another
  revision with 404 RevisionNotFound, an unknown repository with 401 RepoNotFound, a gated one with
  403 GatedRepo; every answer carries X-Repo-Commit;
- the CDN serves the bytes with Range (206, 416 past the end) and its own ETag, the Xet hash, which
  is not the SHA-256.

The files are cut small: every file a repository holds is there, with tiny content: a 2-layer model
in the real files' format (bert-base-uncased's legacy tensor names included), a few hundred
sentences, senteval.tar with all 132 recorded members in their order and a few rows in each file
SentEval reads. Not recorded, so chosen here: the redirect status of a renamed repository (307),
tokenizer_config.json's content (only its size is recorded), the CDN's path and the commit hashes.
Chosen, not recorded, too: the hostile modes a test turns on (a slowed or trickling CDN, the hub's
Location for a large file as given: file:, data:, a loop; a stated size that lies) [issue 40].
"""
import hashlib
import http.server
import io
import json
import random
import re
import socket
import struct
import tarfile
import threading
import time
import urllib.parse

import torch

import common
from fixtures import hub_facts as facts
from fixtures.make_roberta_fixtures import bpe_vocab, read_merges
from tiny_world import senteval_text, sentence, sentence_pairs, tokenizer


def git_sha1(data):
    """The ETag of a file stored in git: git's blob hash [huggingface_hub hf_hub_url docstring]."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class StandInHub:
    """Two servers on 127.0.0.1, the hub and its CDN, serving `files` {"repo_id/filename":
    bytes}."""

    def __init__(self, files, lfs=(), gated=()):
        self.files, self.gated, self.requests = dict(files), set(gated), []
        self.repos = {name.rsplit("/", 1)[0] for name in self.files} | self.gated
        self.lfs = {name for name in self.files if name in lfs or is_lfs(name)}
        self.unstated = set()  # LFS files whose hub answer states no X-Linked-Etag
        self.cut_after, self.reset = None, False  # the CDN's next answer stops after N bytes
        self.ignore_range = self.corrupt = False  # the CDN answers 200 to a Range / flips a byte
        self.slow = None  # (bytes, seconds): the CDN sends so many bytes, then waits so long
        self.location = None  # the hub's Location for a large file instead of the CDN's address
        self.stated_size = None  # the X-Linked-Size the hub states instead of the true size
        self.hub, self.cdn = serve(HubHandler, self), serve(CDNHandler, self)
        self.url = f"http://127.0.0.1:{self.hub.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def close(self):
        for server in (self.hub, self.cdn):
            server.shutdown()
            server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def is_lfs(name):
    """Stored in LFS: marked so in the facts ("name:L")."""
    repo, _, file = name.rpartition("/")
    return f"{file}:L" in {**facts.MODEL_FILES, **facts.DATASET_FILES}.get(repo, [])


def serve(handler, hub):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads, server.hub = True, hub
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    return server


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.hub.requests.append((self.command, self.host(), self.path,
                                         self.headers.get("Range")))
        self.answer(body=True)

    def do_HEAD(self):
        self.server.hub.requests.append((self.command, self.host(), self.path,
                                         self.headers.get("Range")))
        self.answer(body=False)

    def host(self):
        return "hub" if isinstance(self, HubHandler) else "cdn"

    def send(self, status, headers, body=b"", send_body=True):
        self.send_response(status)
        for k, v in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(k, v)
        self.end_headers()
        if send_body:
            self.wfile.write(body)


class HubHandler(Handler):
    def answer(self, body):
        hub = self.server.hub
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        m = re.fullmatch(r"/(.+?)/resolve/([^/]+)/(.+)", path)
        if not m:
            return self.send(404, {}, b"Not Found", body)
        repo, revision, file = m.groups()
        commit = hashlib.sha1(repo.encode()).hexdigest()
        if repo in facts.RENAMED:  # a renamed repository: a relative redirect to the new name
            # (its status is not recorded: any 3xx with a host-less Location is followed alike)
            return self.send(307, {"Location": f"/{facts.RENAMED[repo]}/resolve/{revision}/{file}"},
                             b"Temporary Redirect", body)
        for code in ("GatedRepo", "RepoNotFound", "RevisionNotFound", "EntryNotFound"):
            if {"GatedRepo": repo in hub.gated, "RepoNotFound": repo not in hub.repos,
                    "RevisionNotFound": revision != "main",
                    "EntryNotFound": f"{repo}/{file}" not in hub.files}[code]:
                return self.send(facts.ERRORS[code], {"X-Error-Code": code, "X-Repo-Commit": commit,
                                                      "X-Error-Message": code}, code.encode(), body)
        data = hub.files[f"{repo}/{file}"]
        if f"{repo}/{file}" in hub.lfs:
            sha256 = hashlib.sha256(data).hexdigest()
            location = hub.location or f"{hub.cdn_url}/repos/{sha256}?X-Xet-Cas-Uid=public"
            stated = {} if f"{repo}/{file}" in hub.unstated else {"X-Linked-Etag": f'"{sha256}"'}
            size = str(hub.stated_size or len(data))
            return self.send(302, {"Location": location, **stated, "X-Linked-Size": size,
                                   "X-Repo-Commit": commit,
                                   "Content-Type": "text/plain; charset=utf-8"},
                             f"Found. Redirecting to {location}".encode(), body)
        self.send(200, {"ETag": f'"{git_sha1(data)}"', "X-Repo-Commit": commit}, data, body)


class CDNHandler(Handler):
    def answer(self, body):
        hub = self.server.hub
        m = re.fullmatch(r"/repos/([0-9a-f]{64})(\?.*)?", self.path)
        data = next((hub.files[n] for n in hub.lfs
                     if m and hashlib.sha256(hub.files[n]).hexdigest() == m[1]), None)
        if data is None:
            return self.send(404, {}, b"Not Found", body)
        xet_hash = hashlib.sha256(b"xet merkle " + data).hexdigest()  # 64 hex, not the SHA-256
        headers = {"ETag": f'"{xet_hash}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if hub.corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        start, status = 0, 200
        r = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or "")
        if r and not hub.ignore_range:
            start, status = int(r[1]), 206
            if start >= len(data):
                return self.send(416, {"Content-Range": f"bytes */{len(data)}"}, b"", body)
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        chunk = data[start:]
        if hub.slow and body:
            return self.send_slowly(status, headers, chunk)
        if hub.cut_after is None or not body:
            return self.send(status, headers, chunk, body)
        self.send(status, headers | {"Content-Length": str(len(chunk))}, send_body=False)
        self.wfile.write(chunk[:hub.cut_after])  # fewer bytes than Content-Length says: a cut
        self.wfile.flush()
        hub.cut_after, self.close_connection = None, True
        if hub.reset:  # an abortive close (RST), as a dropped connection looks to the client
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()


    def send_slowly(self, status, headers, chunk):
        self.send(status, headers | {"Content-Length": str(len(chunk))}, send_body=False)
        step, pause = self.server.hub.slow
        try:
            for i in range(0, len(chunk), step):
                self.wfile.write(chunk[i:i + step])
                self.wfile.flush()
                time.sleep(pause)
        except OSError:  # the client gave up (a stalled download is cut)
            self.close_connection = True


# --- The files, cut small -------------------------------------------------------------------------

def placeholder(name):
    return f"stand-in for {name}: not read by simcse-min\n".encode()


def folder_files(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*")
            if p.is_file()}


def tiny_bert(tmp, name, mlm_head=False, seed=0):
    """A 2-layer BERT in the files Hugging Face's BERT repositories use (config.json, vocab.txt,
    model.safetensors) and pytorch_model.bin (a state_dict, as torch.save writes it)."""
    torch.manual_seed(seed)
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)), mlm_head=mlm_head)
    common.save_pretrained(model, tmp / name, tok)
    files = folder_files(tmp / name)
    buffer = io.BytesIO()
    torch.save({"bert." + common.hf_name(k): v for k, v in model.state_dict().items()}, buffer)
    return files | {"pytorch_model.bin": buffer.getvalue(),
                    "tokenizer_config.json": b'{"do_lower_case": true}'}


def legacy_bert(tmp, seed=0):
    """bert-base-uncased's own naming [hub_facts.LEGACY_BERT_NAMES]: a "bert." prefix, LayerNorm
    gamma/beta, the MLM head as cls.predictions.* with its tied decoder; BertForPreTraining."""
    torch.manual_seed(seed)
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)), mlm_head=True)
    common.save_pretrained(model, tmp / "legacy", tok)
    tensors = {}
    for k, v in model.state_dict().items():
        name = ("" if k.startswith("mlm") else "bert.") + common.hf_name(k)
        name = re.sub(r"LayerNorm\.weight$", "LayerNorm.gamma", name)
        tensors[re.sub(r"LayerNorm\.bias$", "LayerNorm.beta", name)] = v.clone()
    words = tensors["bert.embeddings.word_embeddings.weight"]
    tensors["cls.predictions.decoder.weight"] = words.clone()  # tied to the word embeddings
    common.write_safetensors(tmp / "legacy.safetensors", tensors)
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    config = json.loads((tmp / "legacy" / "config.json").read_text())
    return folder_files(tmp / "legacy") | {
        "config.json": json.dumps(config | {"architectures": ["BertForPreTraining"]}).encode(),
        "model.safetensors": (tmp / "legacy.safetensors").read_bytes(),
        "pytorch_model.bin": buffer.getvalue(), "tokenizer_config.json": b'{"do_lower_case": true}'}


def tiny_distilbert(tmp, seed=1):
    """A 2-layer DistilBertForMaskedLM: DistilBERT's config keys and tensor names, BERT's vocab."""
    torch.manual_seed(seed)
    tok = tokenizer()
    cfg = common.BertConfig.tiny(vocab_size=len(tok.vocab), type_vocab_size=0)
    model = common.Bert(cfg, mlm_head=True)
    tensors = {("" if k.startswith("mlm") else "distilbert.") + common.hf_name(k, "distilbert"): v
               for k, v in model.state_dict().items()}
    tensors["vocab_projector.weight"] = tensors["distilbert.embeddings.word_embeddings.weight"]
    keys = {v: k for k, v in common.DISTILBERT_CONFIG.items()}
    config = {"model_type": "distilbert", "architectures": ["DistilBertForMaskedLM"],
              "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
              **{keys[k]: getattr(cfg, k) for k in keys if hasattr(cfg, k)},
              "activation": "gelu", "sinusoidal_pos_embds": False, "pad_token_id": 0}
    common.write_safetensors(tmp / "distilbert.safetensors", tensors)
    vocab = "".join(t + "\n" for t in tok.vocab)
    return {"config.json": json.dumps(config).encode(), "vocab.txt": vocab.encode(),
            "model.safetensors": (tmp / "distilbert.safetensors").read_bytes(),
            "tokenizer_config.json": b'{"do_lower_case": true}'}


def tiny_roberta(tmp, name, seed=2):
    merges = read_merges()[:40]
    tok = common.BPETokenizer(bpe_vocab(merges), merges)
    torch.manual_seed(seed)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab), model_type="roberta",
                                               pad_token_id=1))
    common.save_pretrained(model, tmp / name, tok)
    return folder_files(tmp / name) | {"tokenizer_config.json": b'{"model_max_length": 512}'}


def tiny_release(tmp, name, roberta, seed):
    """A 2-layer model with an MLM head and a pooler -> (config and tokenizer files, its tensors in
    our names, the position_ids buffer transformers 4.2.1 saved beside them)."""
    merges = read_merges()[:40]
    tok = common.BPETokenizer(bpe_vocab(merges), merges) if roberta else tokenizer()
    cfg = common.BertConfig.tiny(vocab_size=len(tok.vocab))
    if roberta:
        cfg = common.BertConfig.tiny(vocab_size=len(tok.vocab), model_type="roberta",
                                     pad_token_id=1)
    torch.manual_seed(seed)
    model = common.Bert(cfg, mlm_head=True, pooler=True)
    common.save_pretrained(model, tmp / name, tok)
    positions = torch.arange(cfg.max_position_embeddings)[None]  # [1, max positions]
    return folder_files(tmp / name), model.state_dict(), positions


def saved_bin(tensors):
    buffer = io.BytesIO()
    torch.save(tensors, buffer)
    return buffer.getvalue()


def released_simcse(tmp, roberta=False):
    """As simcse_to_huggingface.py wrote it [hub_facts.SIMCSE_RELEASED]: BertModel's (or
    RobertaModel's) names without the model prefix, the trained MLP as pooler.dense.*, in
    pytorch_model.bin."""
    kind = "roberta" if roberta else "bert"
    files, ours, positions = tiny_release(tmp, f"simcse-{kind}", roberta, seed=4)
    state = {common.hf_name(k, kind): v for k, v in ours.items() if not k.startswith("mlm.")}
    state["embeddings.position_ids"] = positions
    return files | {"pytorch_model.bin": saved_bin(state)}


def released_diffcse(tmp, roberta=False):
    """DiffCSE's whole training model [hub_facts.DIFFCSE_RELEASED]: the encoder under bert.
    (roberta.), no pooler, beside the parts eval does not use: discriminator (a second encoder),
    lm_head, mlp.net (the BN projector), generator (a masked LM) and electra_head."""
    kind = "roberta" if roberta else "bert"
    files, ours, positions = tiny_release(tmp, f"diffcse-{kind}", roberta, seed=5)
    H = ours["embeddings.word_embeddings.weight"].shape[1]
    encoder = {common.hf_name(k, kind): v for k, v in ours.items()
               if not k.startswith(("mlm.", "pooler."))}
    encoder["embeddings.position_ids"] = positions
    state = {f"{kind}.{k}": v for k, v in encoder.items()}
    state |= {f"discriminator.{k}": v.clone() for k, v in encoder.items()}
    for k, v in ours.items():
        if k.startswith("mlm."):  # BertLMPredictionHead's (RobertaLMHead's) names under lm_head.
            state[re.sub(r"^(cls\.predictions|lm_head)\.", "lm_head.", common.hf_name(k, kind))] = v
    state["lm_head.decoder.weight"] = ours["embeddings.word_embeddings.weight"].clone()
    # decoder.bias is bias itself: `self.decoder.bias = self.bias` in BertLMPredictionHead and
    # RobertaLMHead [transformers modeling_bert.py, modeling_roberta.py: "Need a link between the
    # two variables ..."], and a state_dict names a shared tensor under both names
    state["lm_head.decoder.bias"] = state["lm_head.bias"]
    generator = "roberta" if roberta else "distilbert"  # distilroberta-base, distilbert-base-...
    state |= {f"generator.{generator}.{common.hf_name(k, generator)}": v.clone()
              for k, v in encoder.items()}
    state |= {"mlp.net.0.weight": torch.randn(2 * H, H), "mlp.net.3.weight": torch.randn(H, 2 * H),
              "electra_head.weight": torch.randn(2, H), "electra_head.bias": torch.zeros(2)}
    for i, width in ((1, 2 * H), (4, H)):  # BatchNorm1d(2H), BatchNorm1d(H, affine=False)
        state |= {f"mlp.net.{i}.running_mean": torch.zeros(width),
                  f"mlp.net.{i}.running_var": torch.ones(width),
                  f"mlp.net.{i}.num_batches_tracked": torch.tensor(7)}
    state |= {"mlp.net.1.weight": torch.ones(2 * H), "mlp.net.1.bias": torch.zeros(2 * H)}
    config = json.loads(files["config.json"]) | {"architectures": [f"{kind.title()}ForCL"]}
    return files | {"pytorch_model.bin": saved_bin(state),
                    "config.json": json.dumps(config).encode()}


def senteval_tar(rows=6, seed=0):
    """senteval.tar with every recorded member, in the recorded order: a few rows in each file
    SentEval reads (STS, SICK), a placeholder in the others."""
    rng, out = random.Random(seed), io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name in facts.SENTEVAL_MEMBERS:
            info = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
                continue
            text = senteval_text(name, sentence_pairs(rng, rows))
            data = text.encode() if text is not None else placeholder(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def hub_files(tmp, sentences=300):
    """Every recorded repository's files, cut small -> {"repo_id/filename": bytes}."""
    rng = random.Random(3)
    made = {"bert": tiny_bert(tmp, "bert"), "legacy": legacy_bert(tmp),
            "distilbert": tiny_distilbert(tmp), "roberta": tiny_roberta(tmp, "roberta")}
    kind = {"google-bert/bert-base-uncased": "legacy", "google-bert/bert-large-uncased": "legacy",
            "sentence-transformers/all-MiniLM-L6-v2": "bert",
            "google/bert_uncased_L-4_H-256_A-4": "bert",
            "distilbert/distilbert-base-uncased": "distilbert",
            "FacebookAI/roberta-base": "roberta",
            "FacebookAI/roberta-large": "roberta", "distilbert/distilroberta-base": "roberta"}
    for name in facts.SIMCSE_RELEASED + facts.DIFFCSE_RELEASED:
        method = "simcse" if name in facts.SIMCSE_RELEASED else "diffcse"
        kind[name] = f"{method}-roberta" if "roberta" in name else method
    made |= {"simcse": released_simcse(tmp), "simcse-roberta": released_simcse(tmp, True),
             "diffcse": released_diffcse(tmp), "diffcse-roberta": released_diffcse(tmp, True)}
    files = {}
    for repo, listed in facts.MODEL_FILES.items():
        for entry in listed:
            name = entry.removesuffix(":L")
            files[f"{repo}/{name}"] = made[kind[repo]].get(name) or placeholder(f"{repo}/{name}")
    lines = [sentence(rng) for _ in range(sentences)]
    nli = ["sent0,sent1,hard_neg"] + [f"{a},{b},{c}" for a, b, c in zip(lines, lines[1:],
                                                                        lines[2:])]
    data = {"wiki1m_for_simcse.txt": "".join(s + "\n" for s in lines).encode(),
            "nli_for_simcse.csv": "".join(s + "\n" for s in nli).encode(),
            "senteval.tar": senteval_tar()}
    for repo, names in facts.DATASET_FILES.items():
        files |= {f"{repo}/{n.removesuffix(':L')}": data[n.removesuffix(':L')] for n in names}
    return files
