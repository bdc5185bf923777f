"""What --resume checks before it continues: the --dev_file's bytes (a changed file is one line), a
flag typed on --resume that contradicts the run (one line), a checkpoint of an older format named
older, and this device's fused-optimizer choice kept over the saved one [issue 30, issue 52]. The
oracle: the run's checkpoint, edited as each case writes it."""
import pytest
import torch

import common
import simcse_min
from bad_inputs import unfinished_run


def test_a_resumed_optimizer_keeps_this_devices_fused_choice():
    """A checkpoint saved on the CPU (fused off) resumed on CUDA, where make_optimizer turns fused
    AdamW on: the live optimizer's choice stays, the saved one does not replace it [issue 30]."""
    model = common.Bert(common.BertConfig.tiny())
    saved_on_cpu, _ = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
    state = saved_on_cpu.state_dict()
    assert not state["param_groups"][0]["fused"]
    live, _ = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
    live.param_groups[0]["fused"] = True  # as make_optimizer sets it on CUDA
    assert common.restore_state(live, state, "cpu", model, 0) == ""
    assert live.param_groups[0]["fused"] is True


def test_a_changed_dev_file_or_a_typed_flag_on_resume_is_one_line(world, tmp_path, capsys):
    """The --dev_file's SHA-256 is kept in the checkpoint: edited before --resume, the file is one
    line; so is a flag typed on --resume that contradicts the run it resumes."""
    world.pop("generator")  # a SimCSE run
    pairs = tmp_path / "dev.tsv"
    pairs.write_text("a man runs .\ta person runs .\t4\na dog\ta cat\t1\nthe sun\ta car\t0\n")
    unfinished_run(tmp_path, world, "run", dev_file=str(pairs), test="none")  # a checkpoint
    cfg = common.parse_args(simcse_min.Config, ["--resume", str(tmp_path / "run"), "--test",
                                                "sts"])  # the default, typed: it contradicts
    with pytest.raises(common.UserError, match="--test sts contradicts the resumed run's none"):
        common.read_resumed_run(cfg, "simcse")
    pairs.write_text(pairs.read_text().replace("\t1\n", "\t2\n"))  # edited before --resume
    with pytest.raises(common.UserError, match="--dev_file .* changed since the run started"):
        simcse_min.train(simcse_min.Config(resume=str(tmp_path / "run"), device="cpu"))


def test_a_checkpoint_of_the_format_before_the_dev_files_hash_is_named_older(world, tmp_path):
    """A format-5 checkpoint (no dev_sha256) said 'the --dev_file  changed' of a run without one."""
    world.pop("generator")  # a SimCSE run
    unfinished_run(tmp_path, world, "run")
    path = tmp_path / "run" / "checkpoint.pt"
    ckpt = torch.load(path, weights_only=True)
    del ckpt["dev_sha256"]
    torch.save({**ckpt, "format": 5}, path)
    with pytest.raises(common.UserError, match=r"written by an older simcse-min \(format 5\)"):
        simcse_min.train(simcse_min.Config(resume=str(tmp_path / "run"), device="cpu"))
