"""The papers' run at full scale, timed by phase [issue 54] (a benchmark, not a test): each
method's mission command on the 1M-line stand-in (make_corpus.py), bert-base's shape, default flags,
--max_steps past two checkpoints and several dev evaluations, eager and with --compile; then the
epoch (rows // batch x the method's epochs, DiffCSE's 2) extrapolated from the measured phases.

Phases, from the run's own log (each line timestamped here as it is printed):
- set-up: launch to the step-0 evaluation (imports, the model, tokenizing or the token cache);
- steps: the log's ms/step less the checkpoints in it; "steady" is the median of the 125-step
  intervals after the first, whose excess over it ("warm-up": --compile's compiling) counts once;
- dev evaluations: the log's "eval N s"; checkpoints: "checkpoint saved ... (N s)";
- test table: the last evaluation's line to the run's last line (the 7 STS sets, the model saved);
- other: the rest of the wall time (the process's exit), counted once in the epoch too.
GPU memory: the most nvidia-smi showed for the run's process (allocator reserve and CUDA context
included: what the card must hold); "-" without nvidia-smi.

    python tests/tools/make_corpus.py --out /tmp/wiki1m.txt --model_out /tmp/bert-base \\
        --generator_out /tmp/mlm6
    python tests/tools/bench/gpu_scale.py --data /tmp/wiki1m.txt --model /tmp/bert-base \\
        --generator /tmp/mlm6 --senteval ~/.cache/simcse-min/senteval --device cuda
A tiny CPU run that checks the script itself (its numbers mean nothing for a GPU):
    python tests/tools/bench/gpu_scale.py --data small.txt --model all-MiniLM-L6-v2 \\
        --generator mlm --senteval senteval --device cpu --max_steps 4 \\
        --extra "--batch_size 8 --eval_every 2 --save_every 2" --epoch_rows 1000000
"""
import argparse
import json
import math
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
import common  # noqa: E402
METHODS = ["simcse", "esimcse", "simcsepp", "diffcse"]
DEV = re.compile(r"^step (\d+) \|.*\| (?:start-up [\d.]+ s|(\d+) ms/step) \| eval ([\d.]+) s$")
SAVED = re.compile(r"^step (\d+) \| checkpoint saved in .* \(([\d.]+) s\)$")
SET_HERE = ("--data", "--model", "--device", "--max_steps", "--out_dir", "--compile",
            "--senteval", "--generator")  # run()'s flags: --extra adds others
DATA = re.compile(r"^data .*: (\d+) rows x \d+ column\(s\), (.*) in ([\d.]+)s$")


def gpu_memory(pid, peak, done):
    """Poll nvidia-smi every 0.5 s: the most memory (MiB) the process `pid` held."""
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    while not done.is_set():
        try:
            out = subprocess.run(query, capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return
        for line in out.splitlines():
            p, mib = [x.strip() for x in line.split(",")]
            if p == str(pid):
                peak[0] = max(peak[0], int(mib))
        time.sleep(0.5)


def run(method, args, compiled, out):
    """One run -> [(seconds since launch, log line)], the wall seconds, the GPU peak (MiB)."""
    cmd = [sys.executable, str(ROOT / f"{method}_min.py"), "--data", str(args.data), "--model",
           str(args.model), "--device", args.device, "--max_steps", str(args.max_steps),
           "--out_dir", str(out), "--compile", str(compiled).lower(), *args.extra]
    if args.senteval:
        cmd += ["--senteval", str(args.senteval)]
    if method == "diffcse" and args.generator:
        cmd += ["--generator", str(args.generator)]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak, done = [0], threading.Event()
    threading.Thread(target=gpu_memory, args=(proc.pid, peak, done), daemon=True).start()
    lines = [(time.time() - start, line.rstrip("\n")) for line in proc.stdout]
    done.set()
    if proc.wait():
        sys.exit(f"{method} failed:\n" + "\n".join(line for _, line in lines[-20:]))
    return lines, time.time() - start, peak[0]


def phases(lines, wall, config, epoch_rows):
    """The measured phases and the epoch extrapolated from them (seconds)."""
    devs = [(t, int(m[1]), int(m[2] or 0), float(m[3])) for t, line in lines
            if (m := DEV.match(line))]  # (time, step, cumulative ms/step, eval s)
    saves = [(int(m[1]), float(m[2])) for _, line in lines if (m := SAVED.match(line))]
    rows, how, data_s = next((int(m[1]), m[2], float(m[3])) for _, line in lines
                             if (m := DATA.match(line)))
    setup = devs[0][0] - devs[0][3]  # launch -> the step-0 evaluation began
    trained = [0.0] + [ms * step / 1000 for _, step, ms, _ in devs[1:]]  # cumulative, with saves
    intervals = []
    for k in range(1, len(devs)):
        saved = sum(s for step, s in saves if devs[k - 1][1] < step <= devs[k][1])
        steps = devs[k][1] - devs[k - 1][1]
        intervals.append((trained[k] - trained[k - 1] - saved) / steps)  # s/step, no saves
    steady = statistics.median(intervals[1:] or intervals)
    warm = (intervals[0] - steady) * (devs[1][1] - devs[0][1])
    test = lines[-1][0] - devs[-1][0]
    measured = {"set-up": setup, "steps": trained[-1] - sum(s for _, s in saves),
                "dev evaluations": sum(d[3] for d in devs), "checkpoints": sum(s for _, s in saves),
                "test table": test}
    measured["other"] = wall - sum(measured.values())  # the process's exit, between phases
    E = epoch_rows // config["batch_size"] * config["epochs"]
    n_dev = E // config["eval_every"] + 1 + (E % config["eval_every"] > 0)
    n_save = math.ceil(E / config["save_every"]) if config["save_every"] else 1
    each_save = statistics.mean(s for _, s in saves) if saves else 0.0
    epoch = {"set-up": setup, "steps": warm + E * steady,
             "dev evaluations": n_dev * statistics.mean(d[3] for d in devs),
             "checkpoints": n_save * each_save, "test table": test, "other": measured["other"]}
    facts = {"rows": rows, "data": f"{how} in {data_s:.1f} s", "steps": devs[-1][1],
             "steady ms/step": 1000 * steady, "warm-up s": warm, "evaluations": len(devs),
             "checkpoints": len(saves), "epoch steps": E, "epoch evaluations": n_dev,
             "epoch checkpoints": n_save, "wall": wall}
    return measured, epoch, facts


def table(name, measured, epoch, facts, peak):
    print(f"\n== {name}: {facts['rows']:,} rows ({facts['data']}), {facts['steps']} steps, "
          f"{facts['evaluations']} evaluations, {facts['checkpoints']} checkpoints; "
          f"steady {facts['steady ms/step']:.1f} ms/step, warm-up {facts['warm-up s']:.1f} s; "
          f"GPU peak {peak or '-'} MiB; wall {facts['wall']:.1f} s")
    total = sum(epoch.values())
    print(f"   {'phase':<16} {'measured s':>11} {'epoch s':>9} {'of epoch':>9}  "
          f"(epoch: {facts['epoch steps']:,} steps, {facts['epoch evaluations']} evaluations, "
          f"{facts['epoch checkpoints']} checkpoints)")
    for phase in measured:
        print(f"   {phase:<16} {measured[phase]:>11.1f} {epoch[phase]:>9.1f} "
              f"{100 * epoch[phase] / total:>8.1f}%")
    print(f"   {'total':<16} {sum(measured.values()):>11.1f} {total:>9.1f}   "
          f"= {total / 60:.1f} min")


def extra_flags(text):
    """--extra's quoted flags -> a list; never one this script sets itself."""
    try:
        flags = shlex.split(text)
    except ValueError as e:  # an unclosed quote
        raise argparse.ArgumentTypeError(f"{text!r}: {e}")
    ours = [f for f in flags if f.split("=")[0] in SET_HERE]
    if ours:
        raise argparse.ArgumentTypeError(f"{ours[0]} is set by gpu_scale.py itself (out_dir: a "
                                         f"temporary folder it reads); leave it out of --extra")
    return flags


def main():
    p = common.OneLineErrors(description=__doc__.split("\n\n")[0],
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--generator", type=Path, help="DiffCSE's (make_corpus.py --generator_out)")
    p.add_argument("--senteval", type=Path)
    p.add_argument("--device", default="cuda")
    p.add_argument("--max_steps", type=int, default=1000, help="1000: checkpoints at 500 and "
                   "1000, dev evaluations at 0, 125, ..., 1000")
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--modes", nargs="+", default=["eager", "compile"],
                   choices=["eager", "compile"])
    p.add_argument("--extra", type=extra_flags, default=[],
                   help="more flags for every run, quoted")
    p.add_argument("--epoch_rows", type=int, help="rows of the epoch extrapolated to (default: "
                   "the --data's rows, as the log says them)")
    common.main_guard(measure_all, p.parse_args())


def measure_all(args):
    """Each method in each mode: its run, then its table."""
    common.check_file(args.data, "--data")
    common.check_model(args.model, "--model")
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            for mode in args.modes:
                out = Path(tmp) / f"{method}-{mode}"
                lines, wall, peak = run(method, args, mode == "compile", out)
                config = json.loads((out / "results.json").read_text())["config"]
                rows = int(next(DATA.match(x)[1] for _, x in lines if DATA.match(x)))
                measured, epoch, facts = phases(lines, wall, config, args.epoch_rows or rows)
                table(f"{method} {mode}", measured, epoch, facts, peak)


if __name__ == "__main__":
    main()
