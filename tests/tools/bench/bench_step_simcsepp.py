"""Median ms per training step (train_step + backward) of SimCSE, SimCSE + DCL and SimCSE++ on one
model and batch.

    python tests/tools/bench/bench_step_simcsepp.py --model ../shared/models/all-MiniLM-L6-v2 --data
    ../shared/data/wiki1m_head.txt

Not collected by pytest. The variants take turns step by step, so drift in machine load hits all of
them alike.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root
import common  # noqa: E402
import simcse_min  # noqa: E402
import simcsepp_min  # noqa: E402


def step_ms(module, model, head, ids, mask, cfg, device):
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    # as a run
    with common.MixedPrecision(common.choose_precision("auto", device)[0], device).autocast():
        loss, _ = module.train_step(model, head, ids, mask, cfg)
    loss.backward()
    sync()
    model.zero_grad(set_to_none=True), head.zero_grad(set_to_none=True)
    return 1000 * (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch_size", type=int, default=64)
    args = p.parse_args()
    device = common.resolve_device(args.device)
    torch.manual_seed(0)
    tok, model = common.Tokenizer.from_pretrained(args.model), common.Bert.from_pretrained(
        args.model, quiet=True
    )
    model = model.to(device).train()
    head = simcse_min.MLPHead(model.cfg.hidden_size).to(device)
    ids, mask = (t[:, None].to(device) for t in tok(common.read_lines(args.data)[:args.batch_size],
                                                    max_len=32))
    variants = {"simcse": (simcse_min, simcse_min.Config()),
                "simcse+dcl (--off_dropout 0)": (simcsepp_min,
                                                 simcsepp_min.Config(off_dropout=False)),
                "simcse++": (simcsepp_min, simcsepp_min.Config())}
    times = {name: [] for name in variants}
    for i in range(args.steps + 2):  # 2 warm-up rounds
        for name, (module, cfg) in variants.items():
            ms = step_ms(module, model, head, ids, mask, cfg, device)
            if i >= 2:
                times[name].append(ms)
    base = statistics.median(times["simcse"])
    print(f"{device} | batch {args.batch_size} x L {ids.size(-1)} | {args.steps} steps each, "
          f"median")
    for name, t in times.items():
        print(f"{name:30s} {statistics.median(t):8.1f} ms/step  x{statistics.median(t) / base:.2f}")


if __name__ == "__main__":
    main()
