"""Nothing lost [issue 27]: two runs on one out_dir, outputs that are inputs, links, leftovers, STS
files that do not add up, and special files; each refusal leaves every file as it was (the
oracle: every file's bytes before and after)."""
import importlib
import os
import subprocess
import sys
import warnings

import pytest
import torch

import common
from conftest import tiny_config
from tiny_world import stsb_dev, tokenizer

SIMCSE = importlib.import_module("simcse_min").__file__  # the suite runs in a temporary folder


def config(world, out, **kw):
    return tiny_config("simcse", world, out, **{"eval_every": 2, **kw})


def copy_model(src, dst):
    dst.mkdir(exist_ok=True)
    for p in common.Path(src).iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def files(folder):
    return {p: p.read_bytes() for p in sorted(common.Path(folder).rglob("*")) if p.is_file()}


def test_two_runs_started_together_on_one_folder_one_is_refused(world, tmp_path):
    """Both used to pass the 'already holds a run' check before either locked (at start())."""
    (tmp_path / "there").mkdir()
    first = common.Run(config(world, tmp_path / "there"), SIMCSE)  # its lock: now
    with pytest.raises(common.UserError, match="in use by another run"):
        common.Run(config(world, tmp_path / "there"), SIMCSE)
    first.release()
    a, b = (common.Run(config(world, tmp_path / "new"), SIMCSE) for _ in range(2))
    common.open_out_dir(a)  # no folder when both checked: the first to make it wins
    with pytest.raises(common.UserError, match="appeared after this run checked it"):
        common.open_out_dir(b)
    a.release(), b.release()


@pytest.mark.parametrize("what", ["out_dir is the model", "data is the log", "json is config"])
def test_an_output_that_is_an_input_is_refused(what, world, tmp_path):
    model = copy_model(world["model"], tmp_path / "model")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "log.txt").write_text("a line\n" * 100)
    before = {**files(model), **files(tmp_path / "out")}
    with pytest.raises(common.UserError, match="one of this command's inputs"):
        if what == "json is config":
            common.cli(["eval", "--model", str(model), "--senteval", world["senteval"],
                         "--device", "cpu", "--json", str(model / "config.json")])
        elif what == "out_dir is the model":
            importlib.import_module("simcse_min").train(config(world, model, model=str(model),
                                                               overwrite=True))
        else:
            importlib.import_module("simcse_min").train(config(
                world, tmp_path / "out", data=str(tmp_path / "out" / "log.txt"), overwrite=True))
    assert {**files(model), **files(tmp_path / "out")} == before
    if what == "json is config":  # a file of its own in the model folder: written, again
        for _ in range(2):
            common.cli(["eval", "--model", str(model), "--senteval", world["senteval"],
                        "--device", "cpu", "--json", str(model / "eval.json")])


def test_a_log_that_is_a_link_is_replaced_never_followed(world, tmp_path):
    outside = tmp_path / "notes.txt"
    outside.write_text("somebody's notes\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "log.txt").symlink_to(outside)
    importlib.import_module("simcse_min").train(config(world, tmp_path / "out"))
    assert outside.read_text() == "somebody's notes\n"
    assert not (tmp_path / "out" / "log.txt").is_symlink()


def test_overwrite_clears_the_old_run_and_a_killed_write_leaves_nothing(world, tmp_path,
                                                                         monkeypatch):
    out = tmp_path / "out"
    importlib.import_module("simcse_min").train(config(world, out))
    (out / ".checkpoint.pt.a1b2c3d4.tmp").write_bytes(b"half a checkpoint")  # a SIGKILL's
    monkeypatch.setattr(common.Run, "catch_signals", lambda run: sys.exit(137))  # killed at start
    with pytest.raises(SystemExit):
        importlib.import_module("simcse_min").train(config(world, out, overwrite=True))
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["log.txt"]


def test_the_fp16_schedule_warning_is_filtered():
    def warn():
        warnings.warn("Detected call of `lr_scheduler.step()` before `optimizer.step()`.")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        common.main_guard(warn)
    assert seen == []


@pytest.mark.parametrize("name", ["1_Pooling", "2_Dense"])
def test_a_saved_models_folder_that_is_a_file_is_refused_before_training(world, tmp_path, name):
    """Before any work, and before --overwrite removes the old run's files (2_Dense, a supervised
    run's, raised FileExistsError once the run had trained and deleted the old model)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text("not a folder")
    (out / "results.json").write_text("{}")  # the old run's
    with pytest.raises(common.UserError, match=f"{name} is a file"):
        importlib.import_module("simcse_min").train(config(world, out, overwrite=True))
    assert sorted(p.name for p in out.iterdir()) == [name, "results.json"]


@pytest.mark.parametrize("cut", ["gold shorter", "one scored pair", "empty dev"])
def test_sts_files_that_do_not_add_up_are_one_line(cut, world, tmp_path):
    root = tmp_path / "senteval"
    for p, data in files(world["senteval"]).items():
        (root / p.relative_to(world["senteval"])).parent.mkdir(parents=True, exist_ok=True)
        (root / p.relative_to(world["senteval"])).write_bytes(data)
    gold = root / "STS/STS12-en-test/STS.gs.MSRpar.txt"
    if cut == "gold shorter":
        gold.write_text("".join(gold.read_text().splitlines(True)[:-1]))
    elif cut == "one scored pair":
        gold.write_text("3.0\n" + "\n" * (len(gold.read_text().splitlines()) - 1))
    else:
        (root / "STS/STSBenchmark/sts-dev.csv").write_text("")
    with pytest.raises(common.UserError, match="pairs but .* gold scores|scored pair"):
        common.load_sts(root, "dev" if cut == "empty dev" else "test")


def test_a_model_with_few_positions_trains_its_dev_set_cut_to_them(world, tmp_path):
    """The STS-B dev set was tokenized at 512 tokens whatever the model: IndexError at step 0."""
    tok = tokenizer()
    short = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab),
                                               max_position_embeddings=8))
    common.save_pretrained(short, tmp_path / "short", tok)
    dev = common.DevSet(tok, stsb_dev(common.resolve_senteval(world["senteval"])), 8)
    assert max(map(len, dev.ids)) == 8  # the dev sentences are longer: cut
    importlib.import_module("simcse_min").train(config(world, tmp_path / "out", max_len=8,
                                                       model=str(tmp_path / "short")))


def test_a_tensor_stored_twice_is_refused(world, tmp_path):
    tensors = common.read_safetensors(common.Path(world["model"]) / "model.safetensors")
    name = next(k for k in tensors if k.endswith("word_embeddings.weight"))
    tensors[name.removeprefix("bert.") if name.startswith("bert.") else "bert." + name] = \
        torch.zeros_like(tensors[name])
    copy_model(world["model"], tmp_path)
    common.write_safetensors(tmp_path / "model.safetensors", tensors)
    with pytest.raises(common.CheckpointError, match="holds this tensor twice"):
        common.Bert.from_pretrained(tmp_path)


def test_a_vocabulary_file_that_is_a_fifo_is_refused_not_read_forever(world, tmp_path):
    copy_model(world["model"], tmp_path)
    (tmp_path / "vocab.txt").unlink()
    os.mkfifo(tmp_path / "vocab.txt")
    code = f"import common; common.main_guard(common.Tokenizer.from_pretrained, {str(tmp_path)!r})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=common.Path(common.__file__).parent,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "not a regular file" in proc.stderr, proc.stderr


def test_the_token_cache_is_keyed_by_the_ids_too(world, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
    tok = tokenizer()
    shifted = common.Tokenizer({t: (i + 7) % len(tok.vocab) for t, i in tok.vocab.items()})
    common.tokenize_file(tok, world["data"], 32)
    data, _, hit = common.tokenize_file(shifted, world["data"], 32)
    first = common.read_lines(world["data"])[0]
    assert not hit and list(data[0][0]) == shifted.encode(first, 32)


def test_a_tsv_of_pairs_is_refused(tmp_path):
    (tmp_path / "pairs.tsv").write_text("a man runs .\ta person runs .\n" * 4)
    with pytest.raises(common.UserError, match="a .tsv is not read"):
        list(common.training_rows(tmp_path / "pairs.tsv"))
