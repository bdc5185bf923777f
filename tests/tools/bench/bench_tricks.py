"""Ablation benchmark of common.py's speed tricks (not collected by pytest): each trick on vs off.

    python tests/tools/bench/bench_tricks.py                  # about 4-5 minutes on 2 CPU cores
    python tests/tools/bench/bench_tricks.py --reps 5 --threads 4 --model DIR --senteval DIR \
        --data FILE

Defaults: the model folder $SIMCSE_TEST_MODEL (else ../shared/models/all-MiniLM-L6-v2 beside the
repository, as CI lays it out), $SIMCSE_SENTEVAL (../shared/data/senteval), the training lines
$SIMCSE_TEST_DATA (../shared/data/wiki1m_head.txt), 2 torch threads, the CPU. Prints each part's
time as it goes, then a markdown table: trick | what it belongs to | time on | time off | gain (%
of that whole) | verdict. Pool rows: the training lines once, and repeated --pool_copies times.

KEPT tricks (on: the current common.py; off: a plain contender written here, by subclassing or
patching, never by editing common.py): 1 cls_only (the last layer computes the [CLS] row alone), in
the SimCSE training step and in the dev evaluation; 2 the ASCII fast path of basic_clean; 3 the
word cache of Tokenizer.encode_word; 4 tokenize_file's .npz token cache; 5 length-sorted batches
in encode_sentences. DROPPED tricks (on: their old implementation, copied here from the older
common.py; off: the current code): 6 numpy pad_ids, 7 encode's inlined cache lookup, 8 encode's
early stop at max_len, 9 tokenize_rows's process pool (2 workers vs 1), 10 pinned memory (CUDA
only: not measurable on a CPU). Contenders are checked to give the same output before timing.

Contenders take turns repetition by repetition (a change in machine load hits all of them alike);
medians are reported. gain = (off - on) / whole, the whole as the current code runs it: a SimCSE
training step (train_step + optimizer_step, batch 64, max_len 32), the STS-B dev evaluation
(evaluate_dev), or a run's set-up (model load + tokenize_file, cache missed + DevSet; for the token
cache a repeat run's, cache hit). Set-up rows also give "1M": the training file's part scaled to
1,000,000 lines (wiki1m), for information. Verdict: keep if the measured gain is >= 5 %, else
drop [issue 28: "at least 5 % of a step, an evaluation or a run's set-up on the benchmark's model"].
SIMCSE_CACHE points at a temporary folder (set before common is imported, removed at the end).
"""
import argparse
import contextlib
import copy
import gc
import itertools
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import numpy as np
import torch

_CACHE_DIR = tempfile.mkdtemp(prefix="bench-tricks-cache-")
os.environ["SIMCSE_CACHE"] = _CACHE_DIR  # read by common at import: an empty token cache
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import common  # noqa: E402
import simcse_min  # noqa: E402

EPOCH_SENTENCES = 1_000_000  # wiki1m
_SHARED = Path(__file__).resolve().parents[4] / "shared"  # beside the repository, as in CI
DEFAULTS = {"SIMCSE_TEST_MODEL": str(_SHARED / "models/all-MiniLM-L6-v2"),
            "SIMCSE_SENTEVAL": str(_SHARED / "data/senteval"),
            "SIMCSE_TEST_DATA": str(_SHARED / "data/wiki1m_head.txt")}


# ---- OFF versions of the kept tricks: the plain code each one replaces

class FullLastLayer(common.Bert):
    """1 off: the last layer computes every row; the [CLS] row is taken afterwards."""

    def encode(self, x, mask, all_layers=False, cls_only=False):
        states = super().encode(x, mask, all_layers)  # cls_only ignored
        return states[:, 0] if cls_only and not all_layers else states


def basic_clean_general(text):
    """2 off: common.basic_clean without the ASCII fast path (the general loop for every text)."""
    out = []
    for ch in text:
        cat = unicodedata.category(ch)
        if ch in "\t\n\r " or cat == "Zs":
            out.append(" ")
        elif ch not in "\x00\ufffd" and not cat.startswith("C"):
            out.append(f" {ch} " if any(lo <= ord(ch) <= hi for lo, hi in common._CJK) else ch)
    return unicodedata.normalize("NFC", "".join(out))


class NoWordCache(common.Tokenizer):
    """3 off: encode_word recomputes every word (nothing cached)."""

    def encode_word(self, word):
        text = word.lower() if self.lower else word
        if self.strip_accents and not text.isascii():
            text = "".join(c for c in unicodedata.normalize("NFD", text)
                           if unicodedata.category(c) != "Mn")
        return [i for piece in common.split_punctuation(text) for i in self.wordpiece(piece)]


def encode_unsorted(model, tok, sentences, pooler="cls_before_pooler", batch_size=128,
                    id_lists=None, progress=None):
    """5 off: common.encode_sentences with the batches in the given order (no length sort)."""
    id_lists = id_lists or [tok.encode(s, model.cfg.max_tokens) for s in sentences]
    order = list(range(len(id_lists)))
    device, was_training = next(model.parameters()).device, model.training
    model.eval()
    out = torch.empty(len(id_lists), model.cfg.hidden_size)
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = (t.to(device) for t in tok.pad([id_lists[i] for i in idx]))
            if pooler == "cls_before_pooler":
                out[idx] = model(ids, mask, cls_only=True).float().cpu()
            else:
                states = model.encode(model.embeddings(ids), mask, all_layers=True)
                out[idx] = common.pool(states, mask, pooler).float().cpu()
    model.train(was_training)
    return out


# ---- ON versions of the dropped tricks: their old implementation (the older common.py)

def numpy_pad_ids(id_lists, pad_id, width=None):
    """6 on: (ids [B, L], mask [B, L]) by one numpy scatter."""
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))  # [B]
    mask = np.arange(max(width or 0, int(lengths.max()))) < lengths[:, None]  # [B, L] bool
    ids = np.full(mask.shape, pad_id, dtype=np.int64)  # [B, L]
    ids[mask] = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64,
                            count=int(lengths.sum()))
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))


class OldEncode(common.Tokenizer):
    """7 on (inline) and 8 on (stop): the old Tokenizer.encode with either trick."""
    inline = stop = False

    def encode(self, text, max_len=None):
        ids, limit = [self.cls_id], math.inf if max_len is None else max_len - 1
        for chunk in common._SPECIAL_SPLIT.split(text) if "[" in text else (text,):
            if chunk in common.SPECIAL_TOKENS:
                ids.append(self.vocab[chunk])
                continue
            for word in common.basic_clean(chunk).split():
                if self.stop and len(ids) >= limit:
                    break  # the rest would be truncated away
                known = self._cache.get(word) if self.inline else None
                ids += known if known is not None else self.encode_word(word)
        return ids[:limit] + [self.sep_id] if len(ids) > limit else ids + [self.sep_id]


Inlined = type("Inlined", (OldEncode,), {"inline": True})  # 7 on
EarlyStop = type("EarlyStop", (OldEncode,), {"stop": True})  # 8 on


@contextlib.contextmanager
def patched(obj, name, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def with_patch(fn, obj, name, value):
    def run():
        with patched(obj, name, value):
            return fn()
    return run


# ---- Timing

def take_turns(contenders, reps, warmup=0):
    """{name: median seconds}: every contender once per round, rounds after the warm-up timed.
    The cyclic garbage collector is off while a contender runs (as in timeit)."""
    times = {name: [] for name in contenders}
    for r in range(warmup + reps):
        gc.collect()
        for name, fn in contenders.items():
            gc.disable()
            try:
                start = time.perf_counter()
                fn()
                seconds = time.perf_counter() - start
            finally:
                gc.enable()
            if r >= warmup:
                times[name].append(seconds)
    return {name: statistics.median(t) for name, t in times.items()}


def fresh(cls, tok):
    """A tokenizer of class cls with tok's vocabulary and a cold word cache."""
    return cls(tok.vocab, tok.lower, tok.strip_accents)


def warm_copy(cls, tok):
    """A tokenizer of class cls holding a copy of tok's word cache."""
    t = fresh(cls, tok)
    t._cache = dict(tok._cache)
    return t


def fmt_s(s):
    return f"{1000 * s:.3f} ms" if s < 0.01 else f"{1000 * s:.1f} ms" if s < 1 else f"{s:.2f} s"


def fmt_pct(x):
    return f"{100 * x:.2f} %" if abs(x) < 0.01 else f"{100 * x:.1f} %"


# ---- The parts

def step_contenders(base, ids, mask):
    """1: SimCSE's step (train_step + optimizer_step): cls_only vs the full last layer."""
    out, cfg = {}, simcse_min.Config()
    for name, cls in (("on", common.Bert), ("off", FullLastLayer)):
        model = copy.deepcopy(base).train()
        model.__class__ = cls
        torch.manual_seed(0)
        head = simcse_min.MLPHead(model.cfg.hidden_size).train()
        opt, sched = common.make_optimizer([*model.parameters(), *head.parameters()], 3e-5,
                                           10 ** 9, torch.device("cpu"))
        amp = common.MixedPrecision("fp32", torch.device("cpu"))

        def step(model=model, head=head, opt=opt, sched=sched, amp=amp):
            loss, _ = simcse_min.train_step(model, head, ids, mask, cfg)
            common.optimizer_step(loss, opt, sched, amp)
        out[name] = step
    return out


def off_model(base, dev_ids):
    """A FullLastLayer copy of base, checked to give the same [CLS] vectors."""
    on, off = copy.deepcopy(base).eval(), copy.deepcopy(base).eval()
    off.__class__ = FullLastLayer
    ids, mask = common.pad_ids(dev_ids[:64], 0)
    with torch.inference_mode():
        a, b = on(ids, mask, cls_only=True), off(ids, mask, cls_only=True)
    assert a.shape == b.shape == (64, base.cfg.hidden_size), "[CLS] vectors: wrong shape"
    assert torch.allclose(a, b, atol=1e-5), "cls_only changes the [CLS] vector"
    return off


def tokenizer_contenders(tok, texts, max_len, warm):
    """2, 3, 7, 8: the current tokenizer, each kept trick off, each dropped trick on. warm: every
    contender starts from tok's word cache (DevSet after the training file), else a cold one."""
    def run(cls):
        return lambda: [t.encode(s, max_len) for t in [(warm_copy if warm else fresh)(cls, tok)]
                        for s in texts]
    now = run(common.Tokenizer)
    contenders = {"now": now, "ascii": with_patch(now, common, "basic_clean", basic_clean_general),
                  "cache": run(NoWordCache), "inline": run(Inlined), "stop": run(EarlyStop)}
    want = now()
    for name, fn in contenders.items():  # every contender tokenizes identically
        assert fn() == want, f"tokenizer contender {name} differs"
    return contenders


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    env = {k: os.environ.get(k) or v for k, v in DEFAULTS.items()}
    p.add_argument("--model", default=env["SIMCSE_TEST_MODEL"], help="a model folder")
    p.add_argument("--senteval", default=env["SIMCSE_SENTEVAL"])
    p.add_argument("--data", default=env["SIMCSE_TEST_DATA"], help="training lines")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--reps", type=int, default=3,
                   help="timed repetitions per contender (tokenizer: 4x; pool, step: 2x)")
    p.add_argument("--pool_copies", type=int, default=4,
                   help="the pool is also timed on the training lines repeated this many times")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    R, started, rows = args.reps, time.perf_counter(), []
    cfg = simcse_min.Config(batch_size=64, max_len=32)
    senteval = common.resolve_senteval(args.senteval)
    lines = common.read_lines(args.data)
    n, scale = len(lines), EPOCH_SENTENCES / len(lines)
    tok = common.Tokenizer.from_pretrained(args.model)
    base = common.Bert.from_pretrained(args.model, quiet=True, dropout=cfg.dropout)
    print(f"# bench_tricks: {Path(args.model).name}, CPU, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; {n} training lines; {R} reps, medians", flush=True)

    # -- the set-up (current code): load, tokenize_file (miss; 4: hit), DevSet
    def load():
        common.Tokenizer.from_pretrained(args.model)
        common.Bert.from_pretrained(args.model, quiet=True)

    def tokenize_file(hit):
        if not hit:
            shutil.rmtree(common.CACHE / "tokens", ignore_errors=True)
        data, _, was_hit = common.tokenize_file(fresh(common.Tokenizer, tok), args.data,
                                                cfg.max_len)
        assert was_hit == hit and len(data) == n, "token cache: unexpected hit or miss"
        return data

    warm = fresh(common.Tokenizer, tok)
    wiki_ids = [warm.encode(s, cfg.max_len) for s in lines]  # warm: as the training file left it
    missed, data = tokenize_file(False), tokenize_file(True)
    assert (missed.flat == data.flat).all() and (missed.offsets == data.offsets).all()
    assert [data[i][0] for i in range(n)] == wiki_ids, "tokenize_file differs from encode"
    parts = take_turns({"load": load, "miss": lambda: tokenize_file(False),
                        "hit": lambda: tokenize_file(True),
                        "devset": lambda: common.DevSet(
                            warm_copy(common.Tokenizer, warm),
                            common.load_sts(senteval, "dev")["STSBenchmark"]["dev"], 512)}, R, 1)
    rest = parts["load"] + parts["devset"]
    setup, setup_1m = rest + parts["miss"], rest + scale * parts["miss"]
    print(f"set-up {fmt_s(setup)} = load {fmt_s(parts['load'])} + tokenize_file "
          f"{fmt_s(parts['miss'])} (hit: {fmt_s(parts['hit'])}) + DevSet "
          f"{fmt_s(parts['devset'])}; 1M lines: {fmt_s(setup_1m)}", flush=True)
    dev_pairs = common.load_sts(senteval, "dev")["STSBenchmark"]["dev"]
    dev = common.DevSet(warm_copy(common.Tokenizer, warm), dev_pairs, 512)

    # -- 2, 3, 7, 8: the tokenizer, on the training lines (cold cache) and the dev sentences (warm)
    a, b, _ = dev_pairs
    tok_train = take_turns(tokenizer_contenders(tok, lines, cfg.max_len, False), 4 * R, 1)
    tok_dev = take_turns(tokenizer_contenders(warm, a + b, 512, True), 4 * R, 1)
    print(f"tokenizer: {n} training lines {fmt_s(tok_train['now'])}, {len(a + b)} dev sentences "
          f"{fmt_s(tok_dev['now'])}", flush=True)
    for key, trick, kept in (("ascii", "2 ASCII basic_clean", True),
                             ("cache", "3 word cache", True),
                             ("inline", "7 inlined cache lookup", False),
                             ("stop", "8 early stop at max_len", False)):
        d_train, d_dev = tok_train[key] - tok_train["now"], tok_dev[key] - tok_dev["now"]
        now, sign = tok_train["now"] + tok_dev["now"], 1 if kept else -1  # contender off / on
        on, off = (now, now + d_train + d_dev) if kept else (now + d_train + d_dev, now)
        rows.append((trick, kept, f"set-up: tokenizing {n} lines + DevSet", on, off,
                     sign * (d_train + d_dev) / setup, sign * (scale * d_train + d_dev) / setup_1m))

    # -- 4: the token cache (a repeat run's set-up: hit vs miss)
    hit_setup = rest + parts["hit"]
    rows.append(("4 token cache", True, f"set-up (repeat run): tokenize_file {n} lines",
                 parts["hit"], parts["miss"], (parts["miss"] - parts["hit"]) / hit_setup,
                 scale * (parts["miss"] - parts["hit"]) / (rest + scale * parts["hit"])))

    # -- 9: the process pool (tokenize_rows: 2 workers vs 1; tokenize_file uses it past 8 MiB)
    for copies in sorted({1, args.pool_copies}):
        texts = lines * copies
        contenders = {"on": lambda: common.tokenize_rows(fresh(common.Tokenizer, tok), (
                          (t,) for t in texts), cfg.max_len, 2)[0].tolist(),
                      "off": lambda: common.tokenize_rows(fresh(common.Tokenizer, tok), (
                          (t,) for t in texts), cfg.max_len, 1)[0].tolist()}
        assert contenders["on"]() == contenders["off"](), "the pool tokenizes differently"
        pool = take_turns(contenders, 2 * R)
        gain = pool["off"] - pool["on"]
        rows.append(("9 process pool", False, f"set-up: tokenize_rows {len(texts)} lines, 2 vs 1",
                     pool["on"], pool["off"], gain / (setup + (copies - 1) * parts["miss"]),
                     scale / copies * gain / setup_1m))
    print("tokenizer, token cache and pool timed", flush=True)

    # -- 1 (step), 6 (step): the SimCSE training step and its batches
    def batches(k):
        return [tuple(b) for b in common.epoch_batches(data, tok, cfg, 0, k)]
    ids, mask = batches(1)[0]  # [64, 1, L]
    off = off_model(base, dev.ids)
    step = take_turns(step_contenders(base, ids, mask), 2 * R, 1)
    print(f"step: batch {cfg.batch_size} x {ids.size(-1)} tokens, {fmt_s(step['on'])}", flush=True)
    rows.append(("1 cls_only", True, "step: train_step + optimizer_step", step["on"], step["off"],
                 (step["off"] - step["on"]) / step["on"], None))
    with patched(common, "pad_ids", numpy_pad_ids):
        old = batches(20)
    assert all((x == y).all() for u, v in zip(old, batches(20)) for x, y in zip(u, v))
    k = 100
    pad = take_turns({"on": with_patch(lambda: batches(k), common, "pad_ids", numpy_pad_ids),
                      "off": lambda: batches(k)}, R, 1)
    pad = {key: v / k for key, v in pad.items()}
    rows.append(("6 numpy pad_ids", False, "step: its epoch_batches batch", pad["on"],
                 pad["off"], (pad["off"] - pad["on"]) / step["on"], None))

    # -- 1 (evaluation), 5, 6 (evaluation): the STS-B dev evaluation
    results = [common.evaluate_dev(m, dev) for m in (base, off)]  # also warms up
    with patched(common, "encode_sentences", encode_unsorted):
        results.append(common.evaluate_dev(base, dev))
    assert all(abs(r[m] - results[0][m]) < 1e-3 for r in results for m in results[0]), results
    vecs = [f(base, dev.tok, None, "cls_before_pooler", 256, dev.ids[:512])
            for f in (common.encode_sentences, encode_unsorted)]
    assert torch.allclose(*vecs, atol=1e-4), "length sorting changes the vectors"
    ev = take_turns({"on": lambda: common.evaluate_dev(base, dev),
                     "cls": lambda: common.evaluate_dev(off, dev),
                     "sort": with_patch(lambda: common.evaluate_dev(base, dev), common,
                                        "encode_sentences", encode_unsorted)}, R)
    print(f"dev evaluation: {len(dev.ids)} sentences, {fmt_s(ev['on'])}", flush=True)
    for trick, key in (("1 cls_only", "cls"), ("5 length-sorted batches", "sort")):
        rows.append((trick, True, "evaluation: evaluate_dev (STS-B dev)", ev["on"], ev[key],
                     (ev[key] - ev["on"]) / ev["on"], None))
    order = sorted(range(len(dev.ids)), key=lambda i: -len(dev.ids[i]))  # as encode_sentences
    dev_batches = [[dev.ids[i] for i in order[s:s + 256]] for s in range(0, len(order), 256)]
    for x in dev_batches:
        assert all((u == v).all() for u, v in zip(numpy_pad_ids(x, 0), common.pad_ids(x, 0)))
    pads = take_turns({name: lambda f=f: [f(x, 0) for _ in range(20) for x in dev_batches]
                       for name, f in (("on", numpy_pad_ids), ("off", common.pad_ids))}, R, 1)
    pads = {key: v / 20 for key, v in pads.items()}
    rows.append(("6 numpy pad_ids", False, f"evaluation: padding its {len(dev_batches)} batches",
                 pads["on"], pads["off"], (pads["off"] - pads["on"]) / ev["on"], None))

    # -- the table
    print(f"\nWholes (current code): step {fmt_s(step['on'])}, evaluation {fmt_s(ev['on'])}, "
          f"set-up {fmt_s(setup)} (1M lines: {fmt_s(setup_1m)}), repeat run's set-up "
          f"{fmt_s(hit_setup)}.\nKept tricks: on = current code, off = the plain contender; "
          f"dropped tricks: on = the old implementation, off = current code.\n"
          f"gain = (off - on) / whole; 1M: the training file's part x {scale:.0f}. "
          f"Verdict: keep if the measured gain is >= 5 % (for a dropped trick: worth restoring), "
          f"else drop; the 1M figure is a projection, for information.\n")
    print("| trick | what it belongs to | time on | time off | gain (% of that whole) | verdict |")
    print("|---|---|--:|--:|--:|---|")
    for trick, kept, what, on, off_s, gain, gain_1m in rows:
        big = gain >= 0.05
        cell = fmt_pct(gain) + (f" (1M: {fmt_pct(gain_1m)})" if gain_1m is not None else "")
        status = "kept" if kept else "dropped"
        print(f"| {trick} ({status}) | {what} | {fmt_s(on)} | {fmt_s(off_s)} | {cell} | "
              f"{'keep' if big else 'drop'} |")
    print("| 10 pinned memory (dropped) | step: host-to-device copy | - | - | CUDA only: cannot "
          "be measured on a CPU | - |")
    print(f"\n({time.perf_counter() - started:.0f} s in all)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(common.main_guard(main))
    finally:
        shutil.rmtree(_CACHE_DIR, ignore_errors=True)
