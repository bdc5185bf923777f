"""The resume check at a real scale: MiniLM (a real 6-layer BERT) on the Wikipedia head, through the
command line. A run is killed with SIGKILL at a random moment after a random checkpoint, resumed
with --resume, and compared with the same run uninterrupted: model.safetensors byte for byte
(SHA-256) and results.json without its timings.

    python tests/tools/bench/check_resume.py --method esimcse --steps 40 --save_every 7
(reads SIMCSE_TEST_MODEL, SIMCSE_TEST_DATA, SIMCSE_SENTEVAL; a few minutes on a CPU; exit status 1
on a mismatch)"""
import argparse
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]


def cli(method, flags, **kw):
    return subprocess.Popen([sys.executable, f"{method}_min.py", *flags], cwd=ROOT,
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def step_of(out):
    try:
        return torch.load(out / "checkpoint.pt", weights_only=True)["step"]
    except (OSError, RuntimeError, EOFError):
        return 0


def comparable(out):
    r = json.loads((out / "results.json").read_text())
    r.pop("train_seconds"), r["test_details"].pop("seconds")
    for k in ("out_dir", "resume"):
        r["config"].pop(k)
    return r


def main():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--method", default="simcse", choices=["simcse", "esimcse", "simcsepp",
                                                          "diffcse"])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--save_every", type=int, default=7)
    p.add_argument("--batch_size", type=int, default=32)
    p.add_argument("--seed", type=int, default=None, help="of the kill's timing (default: random, "
                                                          "printed)")
    args = p.parse_args()
    seed = random.randrange(10**6) if args.seed is None else args.seed
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="check-resume-"))
    flags = ["--model", os.environ["SIMCSE_TEST_MODEL"], "--data", os.environ["SIMCSE_TEST_DATA"],
             "--senteval", os.environ["SIMCSE_SENTEVAL"], "--device", "cpu", "--batch_size",
             str(args.batch_size),
             "--max_steps", str(args.steps), "--eval_every", "10", "--save_every",
             str(args.save_every)]
    start = time.time()
    a = cli(args.method, flags + ["--out_dir", str(tmp / "a")])
    assert a.wait() == 0, a.stderr.read()
    seconds = time.time() - start
    b = cli(args.method, flags + ["--out_dir", str(tmp / "b")])
    wait_for = rng.choice(range(args.save_every, args.steps - 1, args.save_every))
    while step_of(tmp / "b") < wait_for and b.poll() is None:
        time.sleep(0.01)
    # up to about two steps later: mid-step or mid-write
    time.sleep(rng.uniform(0, 2 * seconds / args.steps))
    os.kill(b.pid, signal.SIGKILL)
    assert b.wait() == -signal.SIGKILL, "the run ended before the kill"
    killed = step_of(tmp / "b")
    c = cli(args.method, ["--resume", str(tmp / "b")])
    assert c.wait() == 0, c.stderr.read()
    sha = {d: hashlib.sha256((tmp / d / "model.safetensors").read_bytes()).hexdigest() for d
           in "ab"}
    same_results = comparable(tmp / "a") == comparable(tmp / "b")
    print(f"{args.method}: {args.steps} steps of batch {args.batch_size}, checkpoints every "
          f"{args.save_every}; "
          f"SIGKILL after the step-{wait_for} checkpoint (kill seed {seed}), resumed from step "
          f"{killed}")
    print(f"  model.safetensors sha256 uninterrupted {sha['a'][:16]}, resumed {sha['b'][:16]}: "
          f"{'identical' if sha['a'] == sha['b'] else 'DIFFERENT'}")
    print(f"  results.json (without timings): {'identical' if same_results else 'DIFFERENT'}; "
          f"best_dev "
          f"{comparable(tmp / 'a')['best_dev']} @ {comparable(tmp / 'a')['best_step']}, "
          f"uninterrupted run {seconds:.0f}s")
    return 0 if sha["a"] == sha["b"] and same_results else 1


if __name__ == "__main__":
    sys.exit(main())
