"""Speed benchmark (not collected by pytest): one run, the same inputs for every contender.

    python tests/tools/bench/bench.py --threads 2                           # CPU, MiniLM from
    SIMCSE_TEST_MODEL
    python tests/tools/bench/bench.py --model bert-base --device cuda --compile   # GPU:
    bert-base-uncased shape, random weights

Times (a) one full training step (forward, backward, clipping, AdamW) of each of the four methods
at the paper's shape (batch 64, max length 32), (b) STS-B dev encoding (3,000 sentences, [CLS]), (c)
the full 7-task test table, (d) the tokenizer (sentences/s from a cold word cache, extrapolated
to the 1M-sentence corpus). When `transformers` imports (a scratch
environment: never a dependency), the same SimCSE step and dev encoding through Hugging Face's
BertModel (eager and sdpa attention; on CUDA also fp16 autocast + eager, the official setup),
printed as ratios ours / theirs. Contenders take turns repetition by repetition, so a change in
machine load hits all of them alike; medians are reported. On CUDA: model FLOPs utilisation and the
projected wall time of one wiki1m epoch (15,625 steps + 126 dev evaluations) per method.

Inputs: the wiki sample (SIMCSE_TEST_DATA) and SentEval (SIMCSE_SENTEVAL) when found; otherwise
random token ids of the same lengths (max length for training, STS-B dev-like lengths for encoding),
and parts (c), (d) skipped.
"""
import argparse
import collections
import copy
import dataclasses
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import common  # noqa: E402
import diffcse_min  # noqa: E402
import esimcse_min  # noqa: E402
import simcse_min  # noqa: E402
import simcsepp_min  # noqa: E402

POOLER = "cls_before_pooler"  # the raw [CLS], the unsupervised test vector
EPOCH_STEPS = 15_625  # wiki1m: 1,000,000 sentences // 64 (the last partial batch dropped)
# Dense tensor-core peaks in TFLOPS, no sparsity [vendor datasheets]: (name, bf16, fp16); first
# match wins. GPUs before Ampere have no bf16 tensor cores (None): --precision auto trains them in
# fp16, measured against fp16's peak.
PEAK_TFLOPS = [("H100 PCIe", 756, 756), ("H100", 989, 989), ("H200", 989, 989), ("GH200", 989, 989),
               ("B200", 2250, 2250), ("A100", 312, 312), ("A10G", 70, 70), ("A10", 125, 125),
               ("L40S", 362, 362),
               ("L4", 121, 121), ("RTX 4090", 165, 165), ("RTX 3090", 71, 71), ("V100", None, 125),
               ("T4", None, 65), ("P100", None, 18.7)]
METHODS = ["simcse", "esimcse", "simcsepp", "diffcse"]


# ---- Arithmetic (unit-tested in tests/test_bench_arithmetic.py)

def peak_tflops(gpu_name, precision="bf16"):
    """The dense tensor-core peak of a GPU in bf16 or fp16 from its name; None when unknown (use
    --peak_tflops), and
    fp32 has none here (TF32 peaks are another figure)."""
    column = {"bf16": 1, "fp16": 2}.get(precision)
    row = next((r for r in PEAK_TFLOPS if r[0].lower() in gpu_name.lower()), None)
    return row[column] if row and column else None


def train_flops(params, tokens_with_grad, tokens_forward_only=0):
    """6·N·T for tokens through forward + backward, 2·N·T for forward-only tokens [Kaplan et al.
    2020, §2.1]."""
    return 6 * params * tokens_with_grad + 2 * params * tokens_forward_only


def mfu(flops_per_step, step_seconds, peak_tflops_value):
    """Model FLOPs utilisation: achieved model FLOP/s over the peak."""
    return flops_per_step / step_seconds / (peak_tflops_value * 1e12)


def epoch_seconds(step_s, dev_s, steps=EPOCH_STEPS, eval_every=125, test_s=0.0):
    """Wall time of one epoch: the steps, STS-B dev at step 0, every eval_every steps and at the
    last step (as Run.evaluate does), and the final test table."""
    evals = 1 + steps // eval_every + (steps % eval_every != 0)
    return steps * step_s + evals * dev_s + test_s


def matmul_params(model):
    """Parameters that multiply every token (the embedding tables are lookups, not matmuls)."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("embeddings."))


# ---- Inputs

def load_encoder(args, device):
    """(tokenizer, our Bert) on device: a model folder, or 'bert-base' = bert-base-uncased's config
    with random weights (timing only; the vocabulary from SIMCSE_TEST_MODEL when there is one)."""
    if args.model == "bert-base":
        torch.manual_seed(0)
        model = common.Bert(common.BertConfig())
        vocab = os.environ.get("SIMCSE_TEST_MODEL", "")
        tok = (
            common.Tokenizer.from_pretrained(vocab)
            if vocab and Path(vocab, "vocab.txt").is_file()
            else IdsOnly(model.cfg.vocab_size)
        )
    else:
        tok, model = common.Tokenizer.from_pretrained(args.model), common.Bert.from_pretrained(
            args.model, quiet=True, dropout=0.1
        )  # bert-base's own config: dropout 0.1
    return tok, model.to(device)


def training_batch(tok, args, vocab_size):
    """ids, mask [B, 1, max_len]: the first B wiki sentences, padded to max_len (what a compiled run
    trains on)."""
    if isinstance(tok, common.Tokenizer) and args.data and Path(args.data).is_file():
        id_lists = [tok.encode(s, args.max_len) for s
                    in common.read_lines(args.data)[:args.batch_size]]
    else:
        rng = random.Random(0)
        id_lists = [[101] + [rng.randrange(1000, vocab_size) for _ in range(args.max_len - 2)]
                    + [102]
                    for _ in range(args.batch_size)]
    ids, mask = common.pad_ids(id_lists, 0, args.max_len)  # [B, max_len] each
    return ids[:, None], mask[:, None]  # [B, 1, max_len]


def dev_id_lists(tok, senteval, vocab_size):
    """STS-B dev as id lists (3,000 sentences), or random ids with lengths like theirs (10-40
    tokens)."""
    if isinstance(tok, common.Tokenizer) and senteval:
        a, b, _ = common.load_sts_split(senteval, "STSBenchmark", "dev")
        return [tok.encode(s, 512) for s in a + b], "STS-B dev"
    rng = random.Random(0)
    return [[101] + [rng.randrange(1000, vocab_size) for _ in range(rng.randint(8, 38))] + [102]
            for _ in range(3000)], "random ids, STS-B dev-like lengths"


# ---- Contenders: each a function doing one full training step

def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def our_steps(base, ids, mask, args, device, tok):
    """{method: step function}: each method on its own copy of the encoder, with its own heads and
    optimizer."""
    H, steps = base.cfg.hidden_size, {}
    big = 10 ** 9  # the learning-rate schedule never reaches 0 here

    def make(module, cfg, extra_modules=(), before=None, after=None):
        model = copy.deepcopy(base).train()
        head = (diffcse_min.BNProjector if module is diffcse_min
                else simcse_min.MLPHead)(H).to(device).train()
        extras = [m(model) for m in extra_modules]
        opt, sched = common.make_optimizer([*model.parameters(), *head.parameters(),
                                            *(p for e in extras if e is not None for p
                                              in e.parameters())],
                                           1e-5, big, device)
        if args.compile:
            # as Run.compile
            model.compile(mode="reduce-overhead" if device.type == "cuda" else None, dynamic=False)

        amp = common.MixedPrecision(args.precision, device)  # a fresh loss scaler per method (fp16)

        def step():
            with amp.autocast():
                loss, _ = module.train_step(model, head, ids, mask, cfg, *(before(model, extras)
                                                                           if before else ()))
            common.optimizer_step(loss, opt, sched, amp)
            if after:
                after(model, extras)
        return step

    steps["simcse"] = make(simcse_min, simcse_min.Config(compile=args.compile))
    # a full queue: steady state
    queue = collections.deque(torch.randn(160, H, device=device).unbind(), maxlen=160)
    rng = random.Random(0)
    steps["esimcse"] = make(esimcse_min, esimcse_min.Config(compile=args.compile),  # fixed width
                            [esimcse_min.momentum_encoder], before=lambda m, e: (e[0], queue, rng),
                            after=lambda m, e: esimcse_min.momentum_update(e[0], m, 0.995))
    steps["simcsepp"] = make(simcsepp_min, simcsepp_min.Config(compile=args.compile))
    generator = make_generator(base, args, tok, device)
    gen = torch.Generator(device).manual_seed(0)
    steps["diffcse"] = make(
        diffcse_min,
        diffcse_min.Config(compile=args.compile),
        [lambda m: diffcse_min.Discriminator(copy.deepcopy(base)).to(device).train()],
        before=lambda m, e: (e[0], generator, tok, gen),
    )
    return steps, generator


class IdsOnly:
    """What the benchmark reads of a tokenizer (BERT-uncased's special ids), for runs without a
    vocabulary file."""
    pad_id, unk_id, cls_id, sep_id, mask_id = 0, 100, 101, 102, 103

    def __init__(self, vocab_size):
        self.vocab = range(vocab_size)

    def pad(self, id_lists, width=None):
        return common.pad_ids(id_lists, self.pad_id, width)


def make_generator(base, args, tok, device):
    """DiffCSE's frozen MLM: --generator, or a random one of half the encoder's depth (bert-base ->
    the shape of distilbert-base-uncased, the official generator)."""
    if args.generator:
        return diffcse_min.load_generator(args.generator, tok).to(device).train()
    torch.manual_seed(1)
    cfg = dataclasses.replace(base.cfg, num_hidden_layers=max(1, base.cfg.num_hidden_layers // 2))
    return common.Bert(cfg, mlm_head=True).requires_grad_(False).to(device).train()


def hf_models(base, device):
    """{attention implementation: transformers.BertModel} with our weights (saved and loaded the HF
    way), or {}."""
    try:
        import transformers
    except ImportError:
        return {}, None
    folder = tempfile.mkdtemp(prefix="bench-hf-")
    common.save_pretrained(base, folder, _VocabOnly())
    models = {}
    for impl in ("eager", "sdpa"):
        models[impl] = transformers.BertModel.from_pretrained(folder, add_pooling_layer=False,
                                                              attn_implementation=impl).to(device)
    return models, transformers.__version__


class _VocabOnly:
    """save_pretrained writes vocab.txt from a tokenizer; HF loading here needs the weights and
    config only."""
    vocab = {t: i for i, t in enumerate(common.SPECIAL_TOKENS)}
    lower = strip_accents = True


def hf_step(hf, ids, mask, device, amp_dtype, scaler=None, fused=None):
    """SimCSE's step through transformers.BertModel: the same views, head, loss, clipping and
    AdamW."""
    hf = copy.deepcopy(hf).train()
    head = simcse_min.MLPHead(hf.config.hidden_size).to(device).train()
    params = [*hf.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=1e-5, eps=1e-8, weight_decay=0.0,
                            fused=device.type == "cuda" if fused is None else fused)
    cfg = simcse_min.Config()

    def step():
        v_ids, v_mask = simcse_min.make_views(ids, mask)  # [2B, L]
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            cls = hf(input_ids=v_ids, attention_mask=v_mask).last_hidden_state[:, 0]  # [2B, H]
            h = head(cls).view(2, ids.size(0), -1)  # [2, B, H]
        loss, _ = simcse_min.loss_fn(h.float(), cfg.temp)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
    return step


def hf_encode(hf, id_lists, device, amp_dtype, batch_size=256):
    """[CLS] vectors [N, H] through transformers.BertModel with our batching (length-sorted) and
    inference_mode."""
    order = sorted(range(len(id_lists)), key=lambda i: -len(id_lists[i]))
    out = torch.empty(len(id_lists), hf.config.hidden_size)
    hf.eval()
    with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is
                                                not None):
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            ids, mask = (t.to(device) for t in common.pad_ids([id_lists[i] for i
                                                                              in idx], 0))
            out[idx] = hf(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0].float().cpu()
    return out


# ---- Measurements

def compile_conflict(methods, compile, device_type):
    """'' or why these methods cannot be compiled in one process: SimCSE's and SimCSE++'s
    encoders compiled with CUDA graphs end in a segmentation fault in the backward (torch
    2.11.0+cu130, 7 of 7 runs on an H100 and an H200; SimCSE alone, and beside ESimCSE or DiffCSE,
    ran: docs/speed.md)."""
    if compile and device_type == "cuda" and "simcsepp" in methods:
        return ("--compile on CUDA: SimCSE's and SimCSE++'s compiled encoders in one process end "
                "in a segmentation fault in torch's CUDA-graph backward (docs/speed.md); pass "
                "--methods esimcse,diffcse, and read SimCSE++'s compiled ms/step from a training "
                "run's log")
    return ""


def take_turns(contenders, reps, warmup, device):
    """{name: [seconds, ...]}: every contender once per round, rounds after the warm-up timed."""
    times = {name: [] for name in contenders}
    for r in range(warmup + reps):
        for name, fn in contenders.items():
            t = timed(fn, device)
            if r >= warmup:
                times[name].append(t)
    return {name: statistics.median(t) for name, t in times.items()}, times


def tokenizer_rate(tok, lines, max_len):
    """Sentences/s from a cold word cache: a fresh copy of the tokenizer."""
    fresh = copy.copy(tok)
    fresh._cache = {}
    start = time.perf_counter()
    common.tokenize_rows(fresh, ((t,) for t in lines), max_len, workers=1)
    return len(lines) / (time.perf_counter() - start)


def fmt_ms(s):
    return f"{1000 * s:8.1f} ms"


def main(argv=None):
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", default=os.environ.get("SIMCSE_TEST_MODEL") or "bert-base",
                   help="model folder, or bert-base (bert-base-uncased config, random weights)")
    p.add_argument("--data", default=os.environ.get("SIMCSE_TEST_DATA", ""), help="sentences, one "
                                                                                  "per line")
    p.add_argument("--senteval", default=os.environ.get("SIMCSE_SENTEVAL", ""),
                   help="SentEval folder")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=None, help="timed training steps per contender "
                                                           "(default 10; CPU 5)")
    p.add_argument("--methods", default=",".join(METHODS), help="our methods to time (SimCSE is "
                                                                "always timed)")
    p.add_argument("--warmup", type=int, default=None, help="untimed rounds first (default 2; 5 "
                                                            "with --compile)")
    p.add_argument("--eval_reps", type=int, default=3, help="timed dev encodings per contender")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--max_len", type=int, default=32)
    p.add_argument("--compile", action="store_true", help="torch.compile our encoders (as "
                                                          "--compile 1 in training)")
    p.add_argument("--generator", default="", help="DiffCSE generator folder (default: random, "
                                                   "half the depth)")
    p.add_argument("--precision", default="auto", choices=common.PRECISIONS,
                   help="training precision, as the runs' --precision (auto: bf16 where native, "
                        "else fp16)")
    p.add_argument("--peak_tflops", type=float, default=0,
                   help="the GPU's dense peak in the training precision (default: by its name)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: "
                                              "steps,dev,test,tokenizer,hf")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    warmup = args.warmup if args.warmup is not None else 5 if args.compile else 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = common.resolve_device(args.device)
    methods = ["simcse", *(m for m in METHODS[1:] if m in args.methods.split(","))]
    if conflict := compile_conflict(methods, args.compile, device.type):
        p.error(conflict)
    args.precision, why = common.choose_precision(args.precision, device)
    args.steps = args.steps or (10 if device.type == "cuda" else 5)
    senteval = ""
    if args.senteval and Path(args.senteval).exists():
        senteval = common.resolve_senteval(args.senteval)
    tok, base = load_encoder(args, device)
    V = base.cfg.vocab_size
    batch = training_batch(tok, args, V)  # on the CPU, as epoch_batches gives it to train_step
    ids, mask = (t.to(device) for t in batch)  # for Hugging Face's steps
    hf, hf_version = ({}, None) if "hf" in skip else hf_models(base, device)
    name = (
        torch.cuda.get_device_name()
        if device.type == "cuda"
        else f"CPU, {torch.get_num_threads()} threads"
    )
    print(f"# bench: {Path(args.model).name} ({matmul_params(base) / 1e6:.1f}M matmul parameters) "
          f"on {device} "
          f"({name}); torch {torch.__version__}; transformers {hf_version or 'not importable'}; "
          f"batch {args.batch_size} x {ids.size(-1)} tokens; compile {args.compile}; {warmup} "
          f"warm-up + "
          f"{args.steps} timed rounds, medians; precision {args.precision} ({why})", flush=True)
    # HF's steps: the same autocast
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)

    step_s = {}
    if "steps" not in skip:
        contenders, generator = our_steps(base, *batch, args, device, tok)
        contenders = {f"ours {m}": contenders[m] for m in methods}
        for impl, model in hf.items():
            contenders[f"HF {impl} {args.precision}"] = hf_step(
                model,
                ids,
                mask,
                device,
                amp,
                torch.amp.GradScaler(device.type, enabled=amp is torch.float16),
            )
        # the official setup: fp16 autocast + GradScaler, eager attention
        if hf and device.type == "cuda":
            contenders["HF eager fp16 (official)"] = hf_step(hf["eager"], ids, mask, device,
                                                             torch.float16,
                                                            # torch>=2.3
                                                            torch.amp.GradScaler("cuda"),
                                                             fused=False)
        step_s, _ = take_turns(contenders, args.steps, warmup, device)
        print("\n## (a) one training step (forward, backward, clip, AdamW)\n")
        for n, s in step_s.items():
            print(f"{n:28s} {fmt_ms(s)}   {1 / s:7.2f} steps/s")
        for n in step_s:
            if n.startswith("HF"):
                print(f"ratio ours simcse / {n}: {step_s['ours simcse'] / step_s[n]:.3f}")
        del contenders
    dev_ids, dev_what = dev_id_lists(tok, senteval, V)
    dev_s = None
    if "dev" not in skip:
        encoders = {"ours": lambda: common.encode_sentences(base, tok, None, POOLER, 256,
                                                            id_lists=dev_ids)}
        for impl, model in hf.items():
            # fp32, as ours
            encoders[f"HF {impl}"] = lambda model=model: hf_encode(model, dev_ids, device, None)
        enc_s, _ = take_turns(encoders, args.eval_reps, 1, device)
        dev_s = enc_s["ours"]
        print(f"\n## (b) dev encoding: {len(dev_ids)} sentences ({dev_what}), [CLS], batch 256, "
              f"length-sorted; "
              f"fp32 on both sides (TF32 matmuls on CUDA), as every evaluation of a run\n")
        for n, s in enc_s.items():
            print(f"{n:28s} {s:8.2f} s   {len(dev_ids) / s:8.0f} sentences/s")
        for n in enc_s:
            if n.startswith("HF"):
                print(f"ratio ours / {n}: {dev_s / enc_s[n]:.3f}")
        if hf:
            ours = common.encode_sentences(base, tok, None, POOLER, 256, id_lists=dev_ids[:256])
            theirs = hf_encode(hf["sdpa"], dev_ids[:256], device, None)
            print(f"max |ours - HF| on [CLS] of 256 dev sentences: "
                  f"{(ours - theirs).abs().max():.2e}")
    test_s = 0.0
    if "test" not in skip and senteval and isinstance(tok, common.Tokenizer):
        start = time.perf_counter()
        test = common.evaluate_sts(base, tok, senteval, "test", POOLER)
        test_s = time.perf_counter() - start
        print(f"\n## (c) the 7-task test table ({test['details']['sentences_encoded']} sentences): "
              f"{test_s:.1f} s, "
              f"Avg {test['Avg']:.2f}")
    if (
        "tokenizer" not in skip
        and isinstance(tok, common.Tokenizer)
        and args.data
        and Path(args.data).is_file()
    ):
        lines = common.read_lines(args.data)
        rate = tokenizer_rate(tok, lines, args.max_len)
        print(f"\n## (d) tokenizer, {len(lines)} sentences, max_len {args.max_len}, cold word "
              f"cache\n")
        print(f"{rate:9.0f} sentences/s -> 1M sentences in {1e6 / rate:6.1f} s")
    if device.type == "cuda" and step_s:
        report_gpu(args, base, step_s, dev_s, test_s, generator, ids.size(-1))
    return 0


def report_gpu(args, base, step_s, dev_s, test_s, generator, L):
    """MFU per contender and the projected epoch per method."""
    peak = args.peak_tflops or peak_tflops(torch.cuda.get_device_name(), args.precision)
    N, T = matmul_params(base), args.batch_size * L
    flops = {"simcse": train_flops(N, 2 * T), "esimcse": train_flops(N, 2 * T, T),
             "simcsepp": train_flops(N, 3 * T), "diffcse": train_flops(N, 4 * T) + 2
             * matmul_params(generator) * 2 * T}
    print(f"\n## GPU: MFU (6·N·T, N = {N / 1e6:.1f}M matmul parameters, vs {peak} TFLOPS dense "
          f"{args.precision}) "
          f"and one wiki1m epoch ({EPOCH_STEPS} steps + dev every 125)\n")
    for n, s in step_s.items():
        method = n.split()[1] if n.startswith("ours") else "simcse"
        util = (
            f"MFU {100 * mfu(flops[method], s, peak):5.1f}%"
            if peak
            else "MFU ? (pass --peak_tflops)"
        )
        epoch = (
            f" | epoch {epoch_seconds(s, dev_s or 0, test_s=test_s) / 60:6.1f} min" if dev_s else ""
        )
        print(f"{n:28s} {util}{epoch}")
    for n in step_s:
        if n.startswith("HF") and "official" in n:
            print(f"speed-up ours simcse vs {n}: {step_s[n] / step_s['ours simcse']:.2f}x steps/s")


if __name__ == "__main__":
    sys.exit(common.main_guard(main))
