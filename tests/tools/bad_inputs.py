"""Every bad input we know of, through the real command line: prints a markdown table "input | exit
code | message".

    python tests/tools/bad_inputs.py            # builds a tiny world in a temporary folder; about a
    minute on a CPU
    python tests/tools/bad_inputs.py summarize make_corpus   # the rows whose label holds a word

tests/test_bad_inputs.py runs the same cases in-process. Each case: a label, the script ("common":
common.py's command line), its flags, the exit code it must give, whether the run must leave no
out_dir behind (every refusal before training does), and optionally {"env": variables to set,
"fsize": a file-size limit in bytes (a full disk), "lock": a run folder whose lock a live run
holds}."""
import contextlib
import fcntl
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]  # tests/; this file is in tests/tools/
sys.path[:0] = [str(TESTS.parent), str(TESTS)]

import common  # noqa: E402
from tiny_world import make_model, make_senteval, make_world  # noqa: E402


def copy_model(src, dst, edit=None):
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    if edit:
        edit(dst)
    return str(dst)


def set_config(**kw):
    def edit(folder):
        cfg = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**cfg, **kw}))
    return edit


def unfinished_run(tmp, world, name="unfinished", steps=4, **kw):
    """A run of `steps` stopped by SIGTERM at step 2 (checkpoint written), made in-process; kw:
    more of its Config."""
    import signal
    import simcse_min
    out = Path(tmp) / name
    real = simcse_min.optimizer_step
    calls = []

    def step_then_signal(*args):
        real(*args)
        calls.append(1)
        if len(calls) == 2:
            signal.raise_signal(signal.SIGTERM)
    simcse_min.optimizer_step = step_then_signal
    try:
        simcse_min.train(simcse_min.Config(**world, device="cpu", batch_size=8, max_steps=steps,
                                           out_dir=str(out), **kw))
    except SystemExit:
        pass
    finally:
        simcse_min.optimizer_step = real
    return out


def cases(tmp):
    """[(label, script, flags, exit code, leaves no out_dir[, options])]; every file they need is
    made under tmp."""
    tmp = Path(tmp)
    (tmp / "world").mkdir()
    world = make_world(tmp / "world")
    model = Path(world["model"])
    files = {"empty.txt": "\n  \n", "short.txt": "one sentence .\ntwo sentences .\n",
             "bad.csv": "a man ,a woman\nonly one column\n",
             "pairs.csv": "".join(f"a man {i} ,a woman {i}\n" for i in range(16))}
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "latin1.txt").write_bytes(b"a man is playing .\na dog runs .\ncaf\xe9 au lait .\n")
    (tmp / "long.txt").write_text(Path(world["data"]).read_text() + "word " * 5000 + ".\n")
    (tmp / "adir").mkdir()
    (tmp / "a_file").write_text("x")
    os.mkfifo(tmp / "fifo")
    (tmp / "loop").symlink_to(tmp / "loop")
    lines = Path(world["data"]).read_text()
    (tmp / "NLI.CSV").write_bytes("\ufeffsent0,sent1\n".encode() + "".join(
        f'"a man, {i}","a ""woman""\n{i}"\n' for i in range(16)).encode())
    (tmp / "zero_width.txt").write_text(lines + "\u200b\u200b\n\x07\n")
    done = tmp / "done"
    senteval_cut = make_senteval(tmp / "senteval_cut")
    (senteval_cut / "STS/STS12-en-test/STS.gs.MSRpar.txt").unlink()
    flat_dev = make_senteval(tmp / "senteval_flat") / "STS/STSBenchmark/sts-dev.csv"
    # one gold score: Spearman is NaN
    flat_dev.write_text("".join("\t".join(r[:4] + ["3.00"] + r[5:]) + "\n"
                                for r in (line.split("\t") for line
                                          in flat_dev.read_text().splitlines())))
    # its own token cache entry
    (tmp / "cached.txt").write_text(lines + "a dog is running in the park .\n")
    senteval_bad = make_senteval(tmp / "senteval_bad")
    dev = senteval_bad / "STS/STSBenchmark/sts-dev.csv"
    dev.write_text(dev.read_text().replace("\t", " ", 4))  # a row cut short
    models = {
        "no_config": copy_model(model, tmp / "m_noconfig", lambda d: (d / "config.json").unlink()),
        "no_vocab": copy_model(model, tmp / "m_novocab", lambda d: (d / "vocab.txt").unlink()),
        "no_weights": copy_model(model, tmp / "m_noweights",
                                 lambda d: (d / "model.safetensors").unlink()),
        "big_vocab": copy_model(model, tmp / "m_bigvocab", lambda d: (d / "vocab.txt").write_text(
            (d / "vocab.txt").read_text() + "".join(f"extra{i}\n" for i in range(50)))),
        "positions": copy_model(model, tmp / "m_positions", set_config(max_position_embeddings=32)),
        "width": copy_model(model, tmp / "m_width", set_config(intermediate_size=4096)),
        "heads": copy_model(model, tmp / "m_heads", set_config(num_attention_heads=5)),
        "json": copy_model(model, tmp / "m_json",
                           lambda d: (d / "config.json").write_text("{\"vocab_size\": 1")),
        "truncated": copy_model(model, tmp / "m_trunc",
                                lambda d: (d / "model.safetensors").write_bytes(
            (d / "model.safetensors").read_bytes()[:5000])),
        "garbage": copy_model(model, tmp / "m_garbage",
                              lambda d: (d / "model.safetensors").write_bytes(
            (200).to_bytes(8, "little") + b"\xff" * 300)),
        "xlmr": copy_model(model, tmp / "m_xlmr", set_config(model_type="xlm-roberta")),
        "string": copy_model(model, tmp / "m_string", set_config(hidden_size="32")),
        "eps": copy_model(model, tmp / "m_eps", set_config(layer_norm_eps="1e-12")),
        "lower": copy_model(model, tmp / "m_lower",
                            lambda d: (d / "tokenizer_config.json").write_text(
            json.dumps({"do_lower_case": "false"}))),
        "trainer_bin": copy_model(model, tmp / "m_trainer", training_checkpoint),
        "vocab_twice": copy_model(model, tmp / "m_vocab_twice", vocab_with_a_token_twice),
        "bpe_no_vocab": copy_model(roberta_folder(tmp / "roberta"), tmp / "m_bpe_novocab",
                                   lambda d: (d / "vocab.json").unlink()),
        "bpe_bad_merge": copy_model(tmp / "roberta", tmp / "m_bpe_merge",
                                    lambda d: (d / "merges.txt").write_text(
            (d / "merges.txt").read_text() + "Ġzz qq\n")),
        "small_generator": copy_model(Path(world["generator"]), tmp / "g_small",
                                      lambda d: (d / "vocab.txt").write_text(
            (d / "vocab.txt").read_text() + "".join(f"extra{i}\n" for i in range(50)))),
    }
    out = str(tmp / "out")
    base = ["--model", world["model"], "--senteval", world["senteval"], "--device", "cpu",
            "--batch_size", "8",
            "--max_steps", "2", "--out_dir", out]
    data = ["--data", world["data"]]
    c = [
        ("data file missing", "simcse", base + ["--data", str(tmp / "missing.txt")], 2, True),
        ("data file is a directory", "simcse", base + ["--data", str(tmp / "adir")], 2, True),
        (
            "data file empty (blank lines only)",
            "simcse",
            base + ["--data", str(tmp / "empty.txt")],
            2,
            True,
        ),
        (
            "data file not UTF-8 (Latin-1 on line 3)",
            "simcse",
            base + ["--data", str(tmp / "latin1.txt")],
            2,
            True,
        ),
        (
            "data: fewer sentences than one batch",
            "simcse",
            base + ["--data", str(tmp / "short.txt")],
            2,
            True,
        ),
        (
            "data: CSV with a 1-column row",
            "simcse",
            base + ["--data", str(tmp / "bad.csv")],
            2,
            True,
        ),
        (
            "data: sentence pairs (CSV) given to ESimCSE",
            "esimcse",
            base + ["--data", str(tmp / "pairs.csv")],
            2,
            True,
        ),
        (
            "data: a 25,000-character line (cut, not an error)",
            "simcse",
            base[:-1] + [str(tmp / "out_long"), "--data", str(tmp / "long.txt")],
            0,
            False,
        ),
        (
            "SentEval folder incomplete (a gold file missing)",
            "simcse",
            base + data + ["--senteval", str(senteval_cut)],
            2,
            True,
        ),
        (
            "SentEval file malformed (an STS-B dev row cut)",
            "simcse",
            base + data + ["--senteval", str(senteval_bad)],
            2,
            True,
        ),
        (
            "SentEval folder missing",
            "simcse",
            base + data + ["--senteval", str(tmp / "nowhere")],
            2,
            True,
        ),
        (
            "model folder missing",
            "simcse",
            base + data + ["--model", str(tmp / "nomodel")],
            2,
            True,
        ),
        (
            "model: no config.json",
            "simcse",
            base + data + ["--model", models["no_config"]],
            2,
            True,
        ),
        ("model: no vocab.txt", "simcse", base + data + ["--model", models["no_vocab"]], 2, True),
        (
            "model: no weights file",
            "simcse",
            base + data + ["--model", models["no_weights"]],
            2,
            True,
        ),
        (
            "model: vocab.txt larger than the embedding rows",
            "simcse",
            base + data + ["--model", models["big_vocab"]],
            2,
            True,
        ),
        (
            "model: config.json positions disagree with the tensors",
            "simcse",
            base + data + ["--model", models["positions"]],
            2,
            True,
        ),
        (
            "model: config.json sizes bigger than the weights",
            "simcse",
            base + data + ["--model", models["width"]],
            2,
            True,
        ),
        (
            "model: heads do not divide the width",
            "simcse",
            base + data + ["--model", models["heads"]],
            2,
            True,
        ),
        (
            "model: config.json not JSON",
            "simcse",
            base + data + ["--model", models["json"]],
            2,
            True,
        ),
        (
            "model: model.safetensors truncated",
            "simcse",
            base + data + ["--model", models["truncated"]],
            2,
            True,
        ),
        (
            "model: model.safetensors header garbage",
            "simcse",
            base + data + ["--model", models["garbage"]],
            2,
            True,
        ),
        (
            "--max_len beyond the model's positions",
            "simcse",
            base + data + ["--max_len", "100"],
            2,
            True,
        ),
        ("--device cuda without a GPU", "simcse", base + data + ["--device", "cuda"], 2, True),
        (
            "--precision fp8 (no such precision)",
            "simcse",
            base + data + ["--precision", "fp8"],
            2,
            True,
        ),
        ("--lr abc (not a number)", "simcse", base + data + ["--lr", "abc"], 2, True),
        ("--test nne (no such table)", "simcse", base + data + ["--test", "nne"], 2, True),
        ("--max_step 3 (a prefix, never guessed)", "esimcse", base + data + ["--max_step", "3"], 2,
         True),
        ("--eval-every 1 (dashes)", "simcsepp", base + data + ["--eval-every", "1"], 2, True),
        ("--chunk_size -1", "diffcse", base + data + ["--chunk_size", "-1"], 2, True),
        ("--compile with --chunk_size (not exact: measured)", "esimcse",
         base + data + ["--compile", "--chunk_size", "16"], 2, True),
        (
            "data is a FIFO (would never end)",
            "simcse",
            base + ["--data", str(tmp / "fifo")],
            2,
            True,
        ),
        (
            "data is a character device (/dev/zero)",
            "simcse",
            base + ["--data", "/dev/zero"],
            2,
            True,
        ),
        ("data is a symlink loop", "simcse", base + ["--data", str(tmp / "loop")], 2, True),
        (
            "data: .CSV with a BOM, a header, quoted commas and newlines (not an error)",
            "simcse",
            base[:-1] + [str(tmp / "out_csv"), "--data", str(tmp / "NLI.CSV")],
            0,
            False,
        ),
        (
            "data: lines of zero-width or control characters only (skipped, not an error)",
            "simcse",
            base[:-1] + [str(tmp / "out_zw"), "--data", str(tmp / "zero_width.txt")],
            0,
            False,
        ),
        (
            "--senteval is a file",
            "simcse",
            base + data + ["--senteval", str(tmp / "a_file")],
            2,
            True,
        ),
        (
            "--senteval is a symlink loop",
            "simcse",
            base + data + ["--senteval", str(tmp / "loop")],
            2,
            True,
        ),
        (
            "model: config.json model_type xlm-roberta",
            "simcse",
            base + data + ["--model", models["xlmr"]],
            2,
            True,
        ),
        (
            'model: config.json hidden_size "32" (a string)',
            "simcse",
            base + data + ["--model", models["string"]],
            2,
            True,
        ),
        (
            "model: config.json layer_norm_eps a string",
            "simcse",
            base + data + ["--model", models["eps"]],
            2,
            True,
        ),
        (
            'model: tokenizer_config.json do_lower_case "false" (a string)',
            "simcse",
            base + data + ["--model", models["lower"]],
            2,
            True,
        ),
        (
            "model: pytorch_model.bin is a training checkpoint",
            "simcse",
            base + data + ["--model", models["trainer_bin"]],
            2,
            True,
        ),
        (
            "diffcse: --generator vocab.txt larger than its embedding rows",
            "diffcse",
            base + data + ["--generator", models["small_generator"]],
            2,
            True,
        ),
        (
            "--out_dir inside a file",
            "simcse",
            base[:-1] + [str(tmp / "a_file" / "out")] + data,
            2,
            False,
        ),
        (
            "torchrun environment incomplete (WORLD_SIZE alone)",
            "simcse",
            base + data,
            2,
            True,
            {"env": {"WORLD_SIZE": "2"}},
        ),
        (
            "eval: --batch_size -1",
            "common",
            [
                "eval",
                "--model",
                world["model"],
                "--senteval",
                world["senteval"],
                "--device",
                "cpu",
                "--batch_size",
                "-1",
            ],
            2,
            True,
        ),
        (
            "eval: --json inside a file",
            "common",
            [
                "eval",
                "--model",
                world["model"],
                "--senteval",
                world["senteval"],
                "--device",
                "cpu",
                "--json",
                str(tmp / "a_file" / "x.json"),
            ],
            2,
            True,
        ),
        (
            "analyze: --out inside a file",
            "common",
            [
                "analyze",
                "--model",
                world["model"],
                "--senteval",
                world["senteval"],
                "--device",
                "cpu",
                "--out",
                str(tmp / "a_file" / "x"),
            ],
            2,
            True,
        ),
        (
            "analyze: --batch_size 0",
            "common",
            [
                "analyze",
                "--model",
                world["model"],
                "--senteval",
                world["senteval"],
                "--device",
                "cpu",
                "--batch_size",
                "0",
                "--out",
                str(tmp / "an"),
            ],
            2,
            True,
        ),
    ]
    for flag, value in [("batch_size", "1"), ("lr", "0"), ("lr", "nan"), ("temp", "0"), ("dropout",
                                                                                         "1"),
                        ("max_len", "2"), ("epochs", "0"), ("eval_every", "0"), ("save_every",
                                                                                 "-1"),
                        ("seed", "-1"), ("max_steps", "-5")]:
        c.append((f"--{flag} {value}", "simcse", base + data + [f"--{flag}", value], 2, True))
    for script, flag, value in [("esimcse", "dup_rate", "2"), ("esimcse", "queue_size", "-1"),
                                ("esimcse", "momentum", "1.5"), ("simcsepp", "temp_dcl", "0"),
                                ("simcsepp", "m", "-1"), ("diffcse", "mask_ratio", "1.5"),
                                ("diffcse", "lambda_rtd", "-1")]:
        c.append((f"{script}: --{flag} {value}", script, base + data + [f"--{flag}", value], 2,
                  True))
    c += [
        ("--out_dir is a file", "simcse", base[:-1] + [str(tmp / "a_file")] + data, 2, False),
        ("--out_dir holds a finished run", "simcse", base[:-1] + [str(done)] + data, 2, False),
        (
            "--out_dir holds an unfinished run",
            "simcse",
            base[:-1] + ["UNFINISHED"] + data,
            2,
            False,
        ),
        ("--resume of a finished run", "simcse", base[:-2] + data + ["--resume", str(done)], 0,
         True),
        ("--resume A --out_dir B", "simcse", base + data + ["--resume", str(done)], 2, True),
        ("--resume after the model's vocabulary changed (two ids swapped)", "simcse",
         ["--resume", "EDITED_MODEL"], 2, False),
        (
            "--resume of a missing folder",
            "simcse",
            base[:-2] + data + ["--resume", str(tmp / "nowhere")],
            2,
            True,
        ),
        (
            "--resume of a folder without a checkpoint",
            "simcse",
            base[:-2] + data + ["--resume", str(tmp / "adir")],
            2,
            True,
        ),
        (
            "--resume with a flag that contradicts the run",
            "simcse",
            data + ["--resume", "UNFINISHED", "--lr", "1e-3"],
            2,
            False,
        ),
        (
            "--resume of a SimCSE run by ESimCSE",
            "esimcse",
            data + ["--resume", "UNFINISHED"],
            2,
            False,
        ),
        ("--resume with a corrupt checkpoint.pt", "simcse", ["--resume", "CORRUPT"], 2, False),
        (
            "--resume and --overwrite together",
            "simcse",
            base[:-2] + data + ["--resume", str(done), "--overwrite", "1"],
            2,
            True,
        ),
        (
            "non-finite loss (--temp 1e-300)",
            "simcse",
            base[:-1] + [str(tmp / "out_nan")] + data + ["--temp", "1e-300"],
            3,
            False,
        ),
        (
            "--resume after the data file changed (same rows, new content)",
            "simcse",
            ["--resume", "EDITED_DATA"],
            2,
            False,
        ),
        (
            '--resume of a checkpoint whose config holds lr "abc"',
            "simcse",
            ["--resume", "BAD_TYPE"],
            2,
            False,
        ),
        (
            "--resume of a checkpoint whose step is 10**9",
            "simcse",
            ["--resume", "BAD_STEP"],
            2,
            False,
        ),
        (
            "--resume of a checkpoint whose best state has a wrong shape",
            "simcse",
            ["--resume", "BAD_SHAPE"],
            2,
            False,
        ),
        (
            "--resume of a checkpoint whose optimizer moments have a wrong shape",
            "simcse",
            ["--resume", "BAD_MOMENTS"],
            2,
            False,
        ),
        (
            "a full disk (the checkpoint of the last step cannot be written)",
            "simcse",
            ["--resume", "FULL_DISK"],
            2,
            False,
            {"fsize": 64_000},
        ),
        (
            "a full disk (the final model cannot be written; the last step's checkpoint stays)",
            "simcse",
            ["--resume", "FULL_DISK_FINAL"],
            2,
            False,
            {"fsize": 64_000},
        ),
        (
            "--out_dir in use by a run that is still going (its lock held)",
            "simcse",
            ["--resume", "UNFINISHED"],
            2,
            False,
            {"lock": "UNFINISHED"},
        ),
        (
            "a corrupt token cache (rebuilt with a note, not an error)",
            "simcse",
            base[:-1] + [str(tmp / "out_cache"), "--data", str(tmp / "cached.txt")],
            0,
            False,
        ),
        (
            (
                "SentEval: every STS-B dev gold score equal (dev Spearman NaN: never best, not an"
                " error)"
            ),
            "simcse",
            base[:-1] + [str(tmp / "out_flat")] + data + ["--senteval", str(flat_dev.parents[2])],
            0,
            False,
        ),
        (
            (
                "model: vocab.txt with a token twice, a blank line, CRLF endings (saved as read,"
                " not an error)"
            ),
            "simcse",
            base[:-1] + [str(tmp / "out_vocab")] + data + ["--model", models["vocab_twice"]],
            0,
            False,
        ),
        (
            "model: RoBERTa folder without vocab.json",
            "simcse",
            base + data + ["--model", models["bpe_no_vocab"]],
            2,
            True,
        ),
        (
            "model: RoBERTa merges.txt with a merge that is not in vocab.json",
            "simcse",
            base + data + ["--model", models["bpe_bad_merge"]],
            2,
            True,
        ),
    ]
    return c + nothing_lost_cases(tmp, world, base, data, done) + using_a_model_cases(
        tmp, world, base, data) + fourth_pass_cases(tmp, world, base, data) + \
        believed_cases(tmp, world, base, data) + rules_cases(tmp, world, base, data) + \
        newest_path_cases(tmp, world, base, data), dict(
        world=world, done=done, tmp=tmp)


def transfer_senteval(root, edit=None, n=30):
    """A tiny SentEval folder with the transfer tasks' files (n samples each), then edit(root)."""
    from test_transfer import write_transfer_folders
    make_senteval(root)
    write_transfer_folders(root, n=n)
    if edit:
        edit(root)
    return str(root)


def replace_in(rel, old, new):
    def edit(root):
        (root / rel).write_text((root / rel).read_text().replace(old, new, 1))
    return edit


def fourth_pass_cases(tmp, world, base, data):
    """Issue 40's classes: RANK read once, out_dirs that are not a run's, outputs that are folders,
    broken models and labels, a refs/main that is not UTF-8, a cached senteval.tar that is a
    folder. (Downloads that mislead need the stand-in hub: tests/test_download*.py.)"""
    model = Path(world["model"])
    theirs = tmp / "theirs"  # another model's folder: not a run's files
    theirs.mkdir()
    (theirs / "pytorch_model.bin").write_bytes(b"their weights")
    folders = {n: tmp / f"folder_{n}" for n in ("results.json", "log.txt")}
    for name, folder in folders.items():
        (folder / name).mkdir(parents=True)
    tensors = common.read_safetensors(model / "model.safetensors")
    nan = copy_model(model, tmp / "m_nan", lambda d: common.write_safetensors(
        d / "model.safetensors", {k: v.float().fill_(float("nan")) if v.is_floating_point()
                                  else v for k, v in tensors.items()}))
    hub = tmp / "hf_hub" / "models--org--tiny"
    (hub / "refs").mkdir(parents=True)
    (hub / "refs" / "main").write_bytes(b"\xff\xfe not UTF-8")
    (hub / "snapshots").mkdir()
    (hub / "snapshots" / ("a" * 40)).symlink_to(model)
    (tmp / "cache_tar_dir" / "data" / "senteval.tar").mkdir(parents=True)
    evaluate = ["eval", "--model", str(model), "--device", "cpu", "--tasks", "transfer",
                "--mode", "fasttest", "--senteval"]
    return [
        ("RANK=x (not a number)", "simcse", base + data, 2, True, {"env": {"RANK": "x"}}),
        ("RANK=1 left from another shell (no WORLD_SIZE)", "simcse", base + data, 2, True,
         {"env": {"RANK": "1"}}),
        ("--out_dir another model's folder (pytorch_model.bin: not a run's)", "simcse",
         base[:-1] + [str(theirs)] + data, 2, False),
        ("--out_dir the project's folder, --overwrite", "simcse",
         base[:-1] + [str(TESTS.parent), "--overwrite"] + data, 2, False),
        *[(f"--out_dir whose {n} is a folder, --overwrite", "simcse",
           base[:-1] + [str(folders[n]), "--overwrite"] + data, 2, False) for n in folders],
        ("eval: a model whose weights are NaN", "common",
         ["eval", "--model", nan, "--senteval", world["senteval"], "--device", "cpu"], 2, True),
        ("eval --tasks transfer: an SST-2 label 2", "common", evaluate + [transfer_senteval(
            tmp / "se_label2", replace_in("SST/binary/sentiment-train", "\t1\n", "\t2\n"))],
         2, True),
        ("eval --tasks transfer: an MRPC label -1", "common", evaluate + [transfer_senteval(
            tmp / "se_negative", replace_in("MRPC/msr_paraphrase_train.txt", "\n0\t", "\n-1\t"))],
         2, True),
        ("eval --tasks transfer: files too small for the folds", "common",
         evaluate + [transfer_senteval(tmp / "se_small", n=3)], 2, True),
        ("--model org/tiny: refs/main not UTF-8 in the HF cache (passed over)", "common",
         ["eval", "--model", "org/tiny", "--senteval", world["senteval"], "--device", "cpu"],
         0, True, {"env": {"HF_HUB_CACHE": str(tmp / "hf_hub")}}),
        ("download senteval: the cached senteval.tar is a folder", "common",
         ["download", "senteval"], 2, True, {"env": {"SIMCSE_CACHE": str(tmp / "cache_tar_dir")}}),
    ]


def nothing_lost_cases(tmp, world, base, data, done):
    """Issue 27's classes: outputs that are inputs, special files, files that do not add up."""
    model, senteval = Path(world["model"]), world["senteval"]
    as_out = copy_model(model, tmp / "m_as_out")
    fifo = copy_model(model, tmp / "m_fifo", lambda d: ((d / "vocab.txt").unlink(),
                                                          os.mkfifo(d / "vocab.txt")))
    tensors = common.read_safetensors(model / "model.safetensors")
    twice = copy_model(model, tmp / "m_twice", lambda d: common.write_safetensors(
        d / "model.safetensors", {**tensors, **{"bert." + k: v for k, v in tensors.items()}}))
    (tmp / "pairs.tsv").write_text("a man runs .\ta person runs .\n" * 16)
    (tmp / "pool_out").mkdir()
    (tmp / "pool_out" / "1_Pooling").write_text("a file where the saved model needs a folder")
    short_gold = make_senteval(tmp / "senteval_short_gold")
    gold = short_gold / "STS/STS12-en-test/STS.gs.MSRpar.txt"
    gold.write_text("".join(gold.read_text().splitlines(True)[:-1]))
    evaluate = ["eval", "--model", as_out, "--senteval", senteval, "--device", "cpu"]
    tok = common.Tokenizer.from_pretrained(model)
    short_generator = tmp / "g_short"  # 16 positions: --max_len 32 does not fit
    short = common.BertConfig.tiny(vocab_size=len(tok.vocab), max_position_embeddings=16)
    common.save_pretrained(common.Bert(short, mlm_head=True), short_generator, tok)
    return [
        ("--out_dir is the --model folder (--overwrite)", "simcse",
         base[:-1] + [as_out] + data + ["--model", as_out, "--overwrite", "1"], 2, True),
        ("--data is a file the run writes (out_dir/log.txt)", "simcse",
         base[:-1] + [str(done), "--overwrite", "1", "--data", str(done / "log.txt")], 2, True),
        ("eval --json into the model's config.json", "common",
         evaluate + ["--json", str(Path(as_out) / "config.json")], 2, True),
        ("data: a .tsv of sentence pairs", "simcse", base + ["--data", str(tmp / "pairs.tsv")], 2,
         True),
        ("--out_dir whose 1_Pooling is a file", "simcse",
         base[:-1] + [str(tmp / "pool_out")] + data, 2, True),
        ("SentEval: a gold file shorter than its input", "simcse",
         base + data + ["--senteval", str(short_gold)], 2, True),
        ("model: vocab.txt is a FIFO", "simcse", base + data + ["--model", fifo], 2, True),
        ("diffcse: --generator with fewer positions than --max_len", "diffcse",
         base + data + ["--generator", str(short_generator)], 2, True),
        ("model: a tensor stored as both X and bert.X", "simcse",
         base + data + ["--model", twice], 2, True),
    ]


def using_a_model_cases(tmp, world, base, data):
    """Issue 43's commands: encode, search, eval --sts_file, --dev_file; summarize [issue 53]."""
    model, cpu = world["model"], ["--device", "cpu"]
    run = {"method": "simcse", "config": {"seed": 1, "lr": 3e-5}, "best_dev": 80.0,
           "test": {"STS12": 70.0, "Avg": 75.0}}  # a finished run's results.json, cut short
    for name, changes in {"s1": {}, "s2": {"config": {"seed": 2, "lr": 1e-5}},
                          "t1": {"config": {"seed": 3, "lr": 3e-5}, "test": {}}}.items():
        (tmp / name).mkdir()
        (tmp / name / "results.json").write_text(json.dumps(run | changes))
    files = {"corpus.txt": "a man is playing .\na dog runs .\n", "blank.txt": "",
             "two_cols.tsv": "a man runs .\ta person runs .\n" * 3,
             "word_score.tsv": "s1\ts2\tscore\na\tb\t1.0\nc\td\thigh\n",
             "one_pair.tsv": "a man runs .\ta person runs .\t4.2\n"}
    for name, text in files.items():
        (tmp / name).write_text(text)
    (tmp / "latin1_corpus.txt").write_bytes(b"a man .\ncaf\xe9 au lait .\n")
    corpus = str(tmp / "corpus.txt")
    encoded = tmp / "encoded.npy"  # the corpus, encoded by the tiny model: a search's --vectors
    common.main_guard(common.cli, ["encode", "--model", model, "--input", corpus, "--out",
                                   str(encoded), *cpu])
    other = str(make_model(tmp / "m_other", seed=1))  # the same tiny BERT, other weights
    search = ["search", "--corpus", corpus, "--query", "a man", *cpu]
    sts = ["eval", "--model", model, *cpu, "--sts_file"]
    return [
        ("encode: --input missing", "common", ["encode", "--model", model, "--input",
                                               str(tmp / "nope.txt"), "--out", str(tmp / "v.npy"),
                                               *cpu], 2, True),
        ("encode: --input empty", "common", ["encode", "--model", model, "--input",
                                             str(tmp / "blank.txt"), "--out", str(tmp / "v.npy"),
                                             *cpu], 2, True),
        ("encode: --input not UTF-8", "common", ["encode", "--model", model, "--input",
                                                 str(tmp / "latin1_corpus.txt"), "--out",
                                                 str(tmp / "v.npy"), *cpu], 2, True),
        ("encode: --out is the --input", "common", ["encode", "--model", model, "--input", corpus,
                                                    "--out", corpus, *cpu], 2, True),
        ("search: --vectors of another model", "common",
         search + ["--model", other, "--vectors", str(encoded)], 2, True),
        ("search: --vectors missing", "common",
         search + ["--model", model, "--vectors", str(tmp / "nope.npy")], 2, True),
        ("search: --corpus empty", "common",
         ["search", "--model", model, "--corpus", str(tmp / "blank.txt"), "--query", "a", *cpu],
         2, True),
        ("search: --top_k 0", "common", search + ["--model", model, "--top_k", "0"], 2, True),
        ("eval --sts_file: missing", "common", sts + [str(tmp / "nope.tsv")], 2, True),
        ("eval --sts_file: empty", "common", sts + [str(tmp / "blank.txt")], 2, True),
        ("eval --sts_file: a row with two columns", "common", sts + [str(tmp / "two_cols.tsv")],
         2, True),
        ("eval --sts_file: a score that is not a number", "common",
         sts + [str(tmp / "word_score.tsv")], 2, True),
        ("eval --sts_file: one pair (a Spearman needs 2)", "common",
         sts + [str(tmp / "one_pair.tsv")], 2, True),
        ("--dev_file: a row with two columns", "simcse",
         base + data + ["--dev_file", str(tmp / "two_cols.tsv")], 2, True),
        ("summarize: one run", "common", ["summarize", str(tmp / "s1")], 2, True),
        ("summarize: a run without results.json", "common",
         ["summarize", str(tmp / "s1"), str(tmp / "m_other")], 2, True),
        ("summarize: runs of another lr", "common", ["summarize", str(tmp / "s1"),
                                                      str(tmp / "s2")], 2, True),
        ("summarize: a run without a test table", "common", ["summarize", str(tmp / "s1"),
                                                             str(tmp / "t1")], 2, True),
    ]


def believed_cases(tmp, world, base, data):
    """Issue 52: what encode, search, --sts_file and --dev_file write, read and believe."""
    model, cpu = world["model"], ["--device", "cpu"]
    files = {"b_corpus.txt": "a man is playing .\na dog runs .\n", "b_blank.txt": "\n  \n",
             "package.json": '{"name": "mine"}', "b_pairs.tsv": "a\tb\t1\nc\td\t2\ne\tf\t3\n",
             "b_inf.tsv": "a\tb\t1e309\nc\td\t2\ne\tf\t3\n",
             "b_comma.tsv": "a\tb\t4,8\nc\td\t2\ne\tf\t3\n",
             "b_equal.tsv": "a\tb\t3\nc\td\t3\ne\tf\t3\n"}
    for name, text in files.items():
        (tmp / name).write_text(text)
    if not (tmp / "b_fifo.npy").exists():
        os.mkfifo(tmp / "b_fifo.npy")
    corpus, pairs = str(tmp / "b_corpus.txt"), str(tmp / "b_pairs.tsv")
    encode = ["encode", "--model", model, "--input", corpus, *cpu, "--out"]
    search = ["search", "--model", model, "--corpus", corpus, *cpu]
    sts = ["eval", "--model", model, *cpu, "--sts_file"]
    return [
        ("encode: --out beside a JSON encode did not write", "common",
         encode + [str(tmp / "package.npy")], 2, True),
        ("encode: --out whose JSON is a model folder's", "common",
         encode + [f"{model}/special_tokens_map.npy"], 2, True),
        ("encode: --out inside SentEval", "common",
         encode + [f"{world['senteval']}/STS/x.npy"], 2, True),
        ("encode: --out a device (/dev/null)", "common", encode + ["/dev/null"], 2, True),
        ("encode: --out named .json (its JSON would replace it)", "common",
         encode + [str(tmp / "v.json")], 2, True),
        ("encode: --out a name of 300 bytes", "common", encode + [str(tmp / ("a" * 300))], 2,
         True),
        ("eval --json: the --sts_file it reads", "common", sts + [pairs, "--json", pairs], 2, True),
        ("eval --json: inside SentEval", "common",
         sts + [pairs, "--json", f"{world['senteval']}/STS/r.json"], 2, True),
        ("search: --vectors a FIFO", "common", search + ["--vectors", str(tmp / "b_fifo.npy"),
                                                         "--query", "a"], 2, True),
        ("search: --query of spaces", "common", search + ["--query", "   "], 2, True),
        ("search: --queries with no query", "common",
         search + ["--queries", str(tmp / "b_blank.txt")], 2, True),
        ("eval --sts_file: a score 1e309", "common", sts + [str(tmp / "b_inf.tsv")], 2, True),
        ("eval --sts_file: a first score 4,8 (no header)", "common",
         sts + [str(tmp / "b_comma.tsv")], 2, True),
        ("eval --sts_file: every score equal", "common", sts + [str(tmp / "b_equal.tsv")], 2,
         True),
        ("--out_dir: a name that is not UTF-8", "simcse", base + data + [
            "--out_dir", str(tmp / "out") + "\udcff"], 2, True),
        ("--dev_file: every score equal", "simcse",
         base + data + ["--dev_file", str(tmp / "b_equal.tsv")], 2, True),
        ("a flag typed with an en dash", "simcse", base + data + ["\u2013lr", "1e-5"], 2, True),
        ("--lr -1e-5 (a value that starts with -)", "simcse", base + data + ["--lr", "-1e-5"], 2,
         True),
    ]


def rules_cases(tmp, world, base, data):
    """The input and output rules [issue 63] and torchrun's variables read once [issue 61]; EIO on
    the data is simulated in-process only (tests/test_input_rule.py)."""
    for name, target in (("pooling_link", "1_Pooling"), ("dense_dangling", "2_Dense")):
        (tmp / name).mkdir()
        (tmp / name / target).symlink_to(tmp / f"{name}_elsewhere")
    (tmp / "pooling_link_elsewhere").mkdir()
    (tmp / "pooling_link_elsewhere" / "config.json").write_text("somebody's\n")
    torchrun = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": "29500"}
    encode = ["encode", "--model", world["model"], "--input", world["data"], "--device", "cpu"]
    return [
        ("--dev_file missing (a typo)", "simcse",
         base + data + ["--dev_file", str(tmp / "nothere.tsv")], 2, True),
        ("--dev_file a folder", "simcse", base + data + ["--dev_file", str(tmp / "adir")], 2, True),
        ("--dev_file a FIFO", "simcse", base + data + ["--dev_file", str(tmp / "fifo")], 2, True),
        ("--out_dir's 1_Pooling a link to a folder elsewhere", "simcse",
         base[:-1] + [str(tmp / "pooling_link")] + data, 2, False),
        ("--overwrite of a folder whose 2_Dense is a dangling link", "simcse",
         base[:-1] + [str(tmp / "dense_dangling"), "--overwrite"] + data, 2, False),
        ("LOCAL_RANK='²' under torchrun", "simcse", base + data, 2, True,
         {"env": {**torchrun, "LOCAL_RANK": "²"}}),
        ("MASTER_PORT='²' under torchrun", "simcse", base + data, 2, True,
         {"env": {**torchrun, "MASTER_PORT": "²"}}),
        ("encode: --out x.JSON (one file with its JSON where names ignore case)", "common",
         encode + ["--out", str(tmp / "x.JSON")], 2, True),
    ]


def newest_path_cases(tmp, world, base, data):
    """Issue 63: the tools a user runs, summarize's runs that cannot be averaged, messages that
    misled. (SIGTERM while tokenizing and a file changed while read: tests/test_token_cache.py.)"""
    model, tools = Path(world["model"]), "tests/tools/"
    (tmp / "thesis.txt").write_text("a thesis, not a corpus\n")
    (tmp / "four_words.txt").write_text("one two three four\n")
    head = ["--head", world["data"], "--lines", "5"]
    run = {"method": "simcse", "config": {"seed": 1}, "best_dev": 80.0,
           "test": {"STS12": 70.0, "STS15": 72.0, "Avg": 71.0}}
    odd = {"n1": {}, "n_stopped": {"stopped": "the loss became nan at step 3"},
           "n_lacks": {"test": {"STS12": 70.0, "Avg": 71.0}}, "n_big": {"best_dev": 10**400}}
    for i, (name, changes) in enumerate(odd.items()):
        (tmp / name).mkdir()
        (tmp / name / "results.json").write_text(json.dumps(run | {"config": {"seed": i}} |
                                                            changes))
    (tmp / "n_folder" / "results.json").mkdir(parents=True)
    (tmp / "n_fifo").mkdir()
    os.mkfifo(tmp / "n_fifo" / "results.json")
    (tmp / "n_huge").mkdir()
    with open(tmp / "n_huge" / "results.json", "w") as f:
        os.truncate(f.fileno(), 2**40)  # 1 TiB, sparse
    cut_bin = copy_model(model, tmp / "m_cut_bin", training_checkpoint)
    torch_bin = Path(cut_bin) / "pytorch_model.bin"
    import torch
    torch.save(common.read_safetensors(model / "model.safetensors"), torch_bin)
    torch_bin.write_bytes(torch_bin.read_bytes()[:5000])
    config_dir = copy_model(model, tmp / "m_config_dir", lambda d: ((d / "config.json").unlink(),
                                                                    (d / "config.json").mkdir()))
    (tmp / "dev_0_1.tsv").write_text("a man runs .\ta dog runs .\t0\nx y .\tz w .\t1\n")
    summarize = ["summarize", str(tmp / "n1")]
    return [
        ("make_corpus: --out an existing file", tools + "make_corpus.py",
         ["--out", str(tmp / "thesis.txt"), *head], 2, True),
        ("make_corpus: --out the --head, --overwrite", tools + "make_corpus.py",
         ["--out", world["data"], *head, "--overwrite"], 2, True),
        ("make_corpus: --model_out a trained model's folder", tools + "make_corpus.py",
         ["--model_out", str(model), "--vocab", str(model / "vocab.txt")], 2, True),
        ("make_corpus: --lines -5", tools + "make_corpus.py",
         ["--out", str(tmp / "c.txt"), "--lines", "-5"], 2, True),
        ("make_corpus: --head missing", tools + "make_corpus.py",
         ["--out", str(tmp / "c.txt"), "--head", str(tmp / "nowhere.txt")], 2, True),
        ("make_corpus: a four-word --head", tools + "make_corpus.py",
         ["--out", str(tmp / "c.txt"), "--head", str(tmp / "four_words.txt")], 2, True),
        ("make_generator: --out a model's folder", tools + "make_generator.py",
         ["--model", str(model), "--data", world["data"], "--out", str(model)], 2, True),
        ("bench_scale: --scale abc", tools + "bench/bench_scale.py", ["--scale", "abc"], 2, True),
        ("gpu_scale: --extra with an unclosed quote", tools + "bench/gpu_scale.py",
         [*data, "--model", str(model), "--extra", '"--lr 1'], 2, True),
        ("gpu_scale: --extra --out_dir (it sets that itself)", tools + "bench/gpu_scale.py",
         [*data, "--model", str(model), "--extra", "--out_dir /tmp/x"], 2, True),
        ("exercise: no such command", tools + "exercise.py", ["strat"], 2, True),
        ("summarize: a run that stopped itself (a NaN loss)", "common",
         summarize + [str(tmp / "n_stopped")], 2, True),
        ("summarize: a task missing from one run's table", "common",
         summarize + [str(tmp / "n_lacks")], 2, True),
        ("summarize: a best_dev of 400 digits", "common", summarize + [str(tmp / "n_big")], 2,
         True),
        ("summarize: results.json a folder", "common", summarize + [str(tmp / "n_folder")], 2,
         True),
        ("summarize: results.json a FIFO", "common", summarize + [str(tmp / "n_fifo")], 2, True),
        ("summarize: a 1 TiB results.json", "common", summarize + [str(tmp / "n_huge")], 2, True),
        ("model: pytorch_model.bin truncated", "simcse", base + data + ["--model", cut_bin], 2,
         True),
        ("model: config.json a folder", "simcse", base + data + ["--model", config_dir], 2, True),
        ("--dev_file: scores 0-1, no pair above 4 (a note on align, not an error)", "simcse",
         base[:-1] + [str(tmp / "out_dev01")] + data + ["--dev_file", str(tmp / "dev_0_1.tsv")],
         0, False),
    ]


def training_checkpoint(folder):
    """pytorch_model.bin as a trainer saves it: a nested dict (weights, optimizer state, step)."""
    import torch
    tensors = common.read_safetensors(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    torch.save({"model": tensors, "optimizer": {"lr": 1e-3}, "step": 7},
               folder / "pytorch_model.bin")


def roberta_folder(folder):
    """A tiny RoBERTa with a byte-level BPE of GPT-2's first 40 merges."""
    import torch
    from fixtures.make_roberta_fixtures import bpe_vocab, read_merges
    merges = read_merges()[:40]
    tok = common.BPETokenizer(bpe_vocab(merges), merges)
    torch.manual_seed(0)
    cfg = common.BertConfig.tiny(vocab_size=len(tok.vocab), model_type="roberta", pad_token_id=1)
    common.save_pretrained(common.Bert(cfg), folder, tok)
    return folder


def vocab_with_a_token_twice(folder):
    """Two lines of vocab.txt replaced (by a token already there and a blank line), CRLF line
    endings: the saved folder must keep every line where it was (tests/test_saving.py checks that
    it tokenizes the same)."""
    lines = (folder / "vocab.txt").read_text().splitlines()
    lines[-2:] = [lines[10], ""]
    (folder / "vocab.txt").write_bytes("".join(t + "\r\n" for t in lines).encode())


def corrupt_token_cache(world, path):
    """Tokenize path once into the token cache (as a run would), then cut the cache file short."""
    import simcse_min
    before = set(common.CACHE.glob("tokens/*.npz"))
    tok = common.Tokenizer.from_pretrained(world["model"])
    common.tokenize_file(tok, path, simcse_min.Config().max_len)
    cached, = set(common.CACHE.glob("tokens/*.npz")) - before
    cached.write_bytes(cached.read_bytes()[:100])


def tampered(src, dst, edit):
    """A copy of an unfinished run whose checkpoint.pt was edited (as values, re-saved)."""
    import shutil
    import torch
    shutil.copytree(src, dst)
    ckpt = torch.load(dst / "checkpoint.pt", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, dst / "checkpoint.pt")
    return str(dst)


def prepare(tmp, context):
    """The runs some cases need: a finished one, an unfinished one (checkpoint at step 2), a corrupt
    checkpoint, checkpoints edited by hand, one whose data file changed since."""
    import shutil
    import simcse_min
    tmp = Path(tmp)
    world = {k: v for k, v in context["world"].items() if k != "generator"}
    edited = tmp / "edited.txt"
    shutil.copy(world["data"], edited)
    with open(os.devnull, "w") as null, __import__("contextlib").redirect_stdout(null):
        simcse_min.train(simcse_min.Config(**world, device="cpu", batch_size=8, max_steps=2,
                                           out_dir=str(context["done"])))
        unfinished = unfinished_run(tmp, world)
        edited_run = unfinished_run(tmp, {**world, "data": str(edited)}, "edited_run")
        full_disk = unfinished_run(tmp, world, "full_disk")
        changing = Path(copy_model(Path(world["model"]), tmp / "m_changing"))
        edited_model = unfinished_run(tmp, {**world, "model": str(changing)}, "edited_model_run")
        # stopped at its last step
        full_disk_final = unfinished_run(tmp, world, "full_disk_final", steps=2)
    edited.write_text(edited.read_text().replace("man", "cat", 1))  # same rows, another hash
    vocab = (changing / "vocab.txt").read_text().splitlines()
    vocab[20], vocab[21] = vocab[21], vocab[20]  # the same tokens, two ids swapped
    (changing / "vocab.txt").write_text("\n".join(vocab) + "\n")
    corrupt_token_cache(world, tmp / "cached.txt")
    corrupt = tmp / "corrupt"
    corrupt.mkdir(parents=True)
    (corrupt / "checkpoint.pt").write_bytes(b"PK\x03\x04 not a whole checkpoint")
    best = "embeddings.word_embeddings.weight"
    return {"UNFINISHED": str(unfinished), "CORRUPT": str(corrupt), "EDITED_DATA": str(edited_run),
            "EDITED_MODEL": str(edited_model),
            "FULL_DISK": str(full_disk), "FULL_DISK_FINAL": str(full_disk_final),
            "BAD_TYPE": tampered(unfinished, tmp / "bad_type",
                                 lambda c: c["config"].update(lr="abc")),
            "BAD_STEP": tampered(unfinished, tmp / "bad_step", lambda c: c.update(step=10**9)),
            "BAD_SHAPE": tampered(unfinished, tmp / "bad_shape", lambda c: c["objects"]["best"][
                "state"].update({best: c["objects"]["best"]["state"][best][:, :3]})),
            "BAD_MOMENTS": tampered(unfinished, tmp / "bad_moments",
                                    lambda c: c["objects"]["opt"]["state"][0].update(
                exp_avg=c["objects"]["opt"]["state"][0]["exp_avg"][:, :3]))}


def substitute(args, names):
    return [names.get(a, a) for a in args]


@contextlib.contextmanager
def lock_held(names, options=None):
    """options["lock"]: hold that run folder's lock (as its live run would) while a row runs."""
    if "lock" not in (options or {}):
        yield
        return
    gc.collect()  # in-process, a run refused after taking its lock lets go when collected
    fd = os.open(names[options["lock"]], os.O_RDONLY)  # a live run locks the folder itself
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held elsewhere: an error, not a hang
        yield
    finally:
        os.close(fd)


def program(script):
    """A row's script: "common" (common.py's command line), a method, or a tool's path."""
    if script.endswith(".py"):
        return script
    return "common.py" if script == "common" else f"{script}_min.py"


def run_cli(script, args, options=None):
    """The command line, in a process: -> (exit status, stderr). options: env, fsize (see the module
    doc)."""
    options = options or {}
    limit = options.get("fsize")
    proc = subprocess.run([sys.executable, program(script), *args],
                          capture_output=True, text=True, cwd=TESTS.parent, timeout=300,
                          env={**os.environ, **options.get("env", {})},
                          preexec_fn=(lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit,
                                                                                         limit)))
                          if limit
                          else None)
    return proc.returncode, proc.stderr


def message(stderr):
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main():
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("SIMCSE_CACHE", str(Path(tmp) / "cache"))
        common.CACHE = Path(os.environ["SIMCSE_CACHE"])  # prepare() runs in this process
        table, context = cases(tmp)
        wanted = sys.argv[1:]  # words of the labels to run (default: every row)
        table = [row for row in table if not wanted or any(w in row[0] for w in wanted)]
        names = prepare(tmp, context)
        print("| input | exit code | message |\n|---|---|---|")
        failures = 0
        for label, script, args, code, _, *options in table:
            with lock_held(names, *options):
                got, stderr = run_cli(script, substitute(args, names), *options)
            shown = message(stderr).replace(str(tmp), "$TMP").replace("|", "\\|").replace("`", "'")
            flag = "" if got == code and "Traceback" not in stderr else " **(unexpected)**"
            failures += bool(flag)
            print(f"| {label} | {got}{flag} | `{shown}` |", flush=True)
        print(f"\n{len(table)} rows, {failures} unexpected")
        return failures


if __name__ == "__main__":
    sys.exit(1 if main() else 0)
