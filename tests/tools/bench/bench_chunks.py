"""Gradient caching, --chunk_size (issue 44; not collected by pytest). Two parts:

1. checks the CPU tests cannot make: on this device each chunk's second pass reproduces its first
   pass exactly (the GPU's generator; SDPA draws the attention dropout itself there), in each
   precision; and chunked steps equal unchunked ones without dropout. The same check compiled
   (torch.compile, no CUDA graphs) failed on an H200: why the trainers refuse --compile with
   --chunk_size (docs/large-batches.md).
2. the cost: peak GPU memory and step time of supervised SimCSE at bert-base shape (random
   weights), batch 512 x 3 sentences x 32 tokens, for each --chunk_size (docs/speed.md).

    python tests/tools/bench/bench_chunks.py --device cuda              # docs/speed.md's numbers
    python tests/tools/bench/bench_chunks.py --device cpu --batch 16 --layers 2 --chunks 0 8 \
        --steps 2
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import common  # noqa: E402
import simcse_min  # noqa: E402


class Recorder(nn.Module):
    """module's outputs, by pass: False, each chunk's first (no graph); True, its second."""

    def __init__(self, module):
        super().__init__()
        self.module, self.passes = module, {False: [], True: []}

    def forward(self, *args, **kw):
        out = self.module(*args, **kw)
        self.passes[torch.is_grad_enabled()].append(out.detach().clone())
        return out


def batch(n, length, columns, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (n, columns, length), generator=g)
    ids[..., 0], ids[..., -1] = 101, 102  # [CLS] ... [SEP]
    mask = torch.ones_like(ids)
    return ids, mask


def second_pass_replays_first(device, precision, compiled, layers=4):
    """A 4-layer BERT-base-wide encoder, dropout 0.1 (hidden and attention), 96 rows by 32."""
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig(num_hidden_layers=layers)).to(device).train()
    if compiled:
        model.compile(dynamic=False)  # as Run.compile with chunks: no CUDA graphs
    recorder = Recorder(model)
    ids, mask = (t[:, 0].to(device) for t in batch(96, 32, 1, device))
    amp = common.MixedPrecision(precision, device)
    for _ in range(2):  # the second time: compiled graphs warm
        recorder.passes = {False: [], True: []}
        with amp.autocast():
            vectors = common.gradient_cache(recorder, 32, ids, mask, cls_only=True)
        amp.scaler.scale((vectors.float() * torch.randn_like(vectors.float())).sum()).backward()
    first, second = recorder.passes[False], recorder.passes[True]
    same = len(first) == len(second) == 3 and all(torch.equal(a, b) for a, b in zip(first, second))
    differ = not torch.equal(first[0], first[1])
    return same, differ


def steps_agree(device, layers=4):
    """Dropout 0, fp32 (TF32 off): 3 chunked SimCSE steps against 3 unchunked -> max differences."""
    torch.backends.cuda.matmul.allow_tf32 = False
    out = []
    for chunk in (0, 32):
        torch.manual_seed(0)
        model = common.Bert(common.BertConfig(num_hidden_layers=layers, hidden_dropout_prob=0.0,
                                              attention_probs_dropout_prob=0.0)).to(device)
        model.pooler = head = simcse_min.MLPHead(768).to(device)
        opt, sched = common.make_optimizer(model.parameters(), 1e-4, 10, device)
        amp = common.MixedPrecision("fp32", device)
        losses = []
        for step in range(3):
            ids, mask = batch(64, 32, 1, device, seed=step)
            loss, _ = simcse_min.train_step(model.train(), head, ids, mask,
                                            simcse_min.Config(chunk_size=chunk))
            common.optimizer_step(loss, opt, sched, amp)
            losses.append(loss.item())
        out.append((losses, [p.detach().clone() for p in model.parameters()]))
    torch.backends.cuda.matmul.allow_tf32 = True
    (l0, p0), (l1, p1) = out
    return max(abs(a - b) for a, b in zip(l0, l1)), max((a - b).abs().max().item()
                                                         for a, b in zip(p0, p1))


def measure(args, device, precision):
    """Median step time (s) and peak memory (GiB) per chunk size, contenders taking turns."""
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig(num_hidden_layers=args.layers)).to(device)
    model.pooler = head = simcse_min.MLPHead(768).to(device)
    if args.compile:  # as Run.compile with chunks (no CUDA graphs)
        model.compile(dynamic=False)
    opt, sched = common.make_optimizer(model.parameters(), 1e-5, 10 ** 6, device)
    amp = common.MixedPrecision(precision, device)
    ids, mask = batch(args.batch, 32, 3, device)  # supervised: sentence, entailment, contradiction
    times, peaks = {c: [] for c in args.chunks}, {}
    for repetition in range(args.steps + 1):  # the first: warm-up
        for chunk in args.chunks:
            sync(device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            with amp.autocast():
                loss, _ = simcse_min.train_step(model.train(), head, ids, mask,
                                                simcse_min.Config(chunk_size=chunk))
            common.optimizer_step(loss, opt, sched, amp)
            sync(device)
            if repetition:
                times[chunk].append(time.perf_counter() - start)
            if device.type == "cuda":
                peaks[chunk] = max(peaks.get(chunk, 0), torch.cuda.max_memory_allocated(device))
    return {c: (statistics.median(times[c]), peaks.get(c, 0) / 2 ** 30) for c in args.chunks}


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 64, 128])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--precisions", nargs="+", default=None)
    parser.add_argument("--skip_checks", action="store_true")
    parser.add_argument("--compiled_checks", nargs="*", default=["bf16"],
                        help="precisions whose check also runs with --compile")
    parser.add_argument("--compile", action="store_true",
                        help="measure compiled chunked steps (not exact on CUDA: see the checks)")
    args = parser.parse_args()
    device = torch.device(args.device)
    precisions = args.precisions or (["bf16", "fp16"] if device.type == "cuda" else ["fp32"])
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__}, {name}", flush=True)
    if not args.skip_checks:
        for precision in dict.fromkeys(["fp32", *precisions]):
            for compiled in (False, True) if precision in args.compiled_checks else (False,):
                same, differ = second_pass_replays_first(device, precision, compiled)
                print(f"check {precision}{' compiled' * compiled}: second pass == first: {same}; "
                      f"views' masks differ: {differ}", flush=True)
        print("check chunked vs unchunked, fp32, dropout 0, 3 steps: |loss|, |param| max diff "
              f"{steps_agree(device)}", flush=True)
    for precision in precisions:
        for chunk, (seconds, gib) in measure(args, device, precision).items():
            print(f"{precision}{' compiled' * args.compile} batch {args.batch} x 3, chunk {chunk}: "
                  f"{seconds * 1000:.0f} ms/step, peak {gib:.2f} GiB", flush=True)


if __name__ == "__main__":
    main()
