"""--precision and runs that move between devices (issue 16), all on the CPU:
- the choice per GPU, with the GPU's bf16 capability mocked;
- the fp16 loss scaler: unscaled before clipping (the step equals the fp32 one bit for bit), an
overflowing step
  skipped and counted, its state in the checkpoint, and a whole fp16 run (CPU fp16 autocast) stopped
  and resumed
  bit-identically;
- a checkpoint written with CUDA (two GPU generator states, a DiffCSE masking generator of CUDA
size) resumed on the
  CPU, with a note and a deterministic reseed; a run saved in one precision continued in another."""
import importlib
import json
import signal

import pytest
import torch

import common
from conftest import tiny_config
from test_resume import assert_same_run
from test_signals import signals_after_step

CUDA = torch.device("cuda")  # a device object only: nothing here touches a GPU


@pytest.fixture
def gpu(monkeypatch):
    """A mocked GPU: its name and whether it computes bf16 natively (set gpu['native'])."""
    state = {"native": True, "name": "Tesla T4"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: state["name"])
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: state["native"])
    return state


@pytest.mark.parametrize("native, asked, chosen", [
    (True, "auto", "bf16"), (True, "fp16", "fp16"), (True, "fp32", "fp32"),
    (False, "auto", "fp16"), (False, "fp16", "fp16"), (False, "fp32", "fp32")])
def test_precision_per_gpu(gpu, native, asked, chosen):
    gpu["native"] = native
    name, why = common.choose_precision(asked, CUDA)
    assert name == chosen and why
    if asked == "auto":
        assert ("has native bf16" if native else "Tesla T4 has no native bf16") in why


def test_bf16_asked_for_on_a_gpu_without_it_is_one_line(gpu):
    gpu["native"] = False
    with pytest.raises(common.UserError, match="--precision bf16: the Tesla T4 has no native "
                                               "bf16.*fp16 or auto"):
        common.choose_precision("bf16", CUDA)


def test_the_cpu_runs_fp32_unless_asked():
    assert common.choose_precision("auto", torch.device("cpu"))[0] == "fp32"
    assert common.choose_precision("fp16", torch.device("cpu")) == ("fp16", "asked for")


def tiny_step(precision, scale_loss=1.0):
    """One optimizer_step of a small linear model whose gradient norm (about 62) is clipped ->
    (weights, amp, lr, steps skipped)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt, sched = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
    amp = common.MixedPrecision(precision, torch.device("cpu"))
    loss = (model(torch.randn(16, 8)) * 10).pow(2).mean() * scale_loss
    common.optimizer_step(loss, opt, sched, amp)
    skipped = common.skipped_steps(opt, sched)
    return model.weight.detach().clone(), amp, sched.get_last_lr()[0], skipped


def test_fp16_scaler_unscales_before_clipping():
    """The scale is a power of two, so unscaled gradients are the fp32 ones exactly: the same
    clipped step. Clipping the scaled gradients (norm ~62 x 65536) before unscaling would shrink the
    step 65536-fold."""
    fp32, _, _, _ = tiny_step("fp32")
    fp16, amp, _, skipped = tiny_step("fp16")
    assert amp.scaler.is_enabled() and amp.scaler.get_scale() == 65536.0 and skipped == 0
    assert torch.equal(fp16, fp32)


def test_an_overflowing_fp16_step_is_skipped_and_counted():
    torch.manual_seed(0)
    before = torch.nn.Linear(8, 8).weight.detach().clone()
    after, amp, lr, skipped = tiny_step("fp16", scale_loss=float("inf"))
    assert torch.equal(after, before) and skipped == 1 and amp.scaler.get_scale() == 32768.0
    assert lr == pytest.approx(0.9e-3)  # the schedule follows the step count [HF Trainer 4.2]
    state = amp.state_dict()
    again = common.MixedPrecision("fp16", torch.device("cpu"))
    again.load_state_dict(state)
    assert again.scaler.get_scale() == 32768.0
    fresh = common.MixedPrecision("fp16", torch.device("cpu"))
    # saved without a scaler
    fresh.load_state_dict(common.MixedPrecision("bf16", torch.device("cpu")).state_dict())
    assert fresh.scaler.get_scale() == 65536.0


def flags(world, out, method="simcse", **kw):
    """2 epochs of 6 steps, dev every 4, a checkpoint every 3."""
    return tiny_config(method, world, out, **{"max_steps": 0, "epochs": 2, "eval_every": 4,
                                              "save_every": 3, **kw})


def stop_after(monkeypatch, module, cfg, n):
    signals_after_step(monkeypatch, module, n, signal.SIGTERM)
    with pytest.raises(SystemExit):
        module.train(cfg)
    monkeypatch.undo()


def test_an_fp16_run_logs_its_precision_and_resumes_bit_identically(world, tmp_path, monkeypatch):
    module = importlib.import_module("simcse_min")
    module.train(flags(world, tmp_path / "whole", precision="fp16"))
    log = (tmp_path / "whole" / "log.txt").read_text()
    assert "precision fp16: asked for" in log and "| skipped " in log
    stop_after(monkeypatch, module, flags(world, tmp_path / "cut", precision="fp16"), 4)
    amp = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["objects"]["amp"]
    assert amp["name"] == "fp16" and amp["scaler"]["scale"] > 0
    module.train(module.Config(resume=str(tmp_path / "cut")))
    assert_same_run(tmp_path / "whole", tmp_path / "cut")


def test_a_cpu_run_logs_fp32_and_why(world, tmp_path):
    importlib.import_module("simcse_min").train(flags(world, tmp_path / "out", max_steps=1))
    assert "precision fp32: auto on cpu" in (tmp_path / "out" / "log.txt").read_text()


def edit_checkpoint(out, edit):
    ckpt = torch.load(out / "checkpoint.pt", weights_only=True)
    edit(ckpt)
    torch.save(ckpt, out / "checkpoint.pt")


def test_a_cuda_checkpoint_resumes_on_the_cpu_with_notes_and_a_deterministic_reseed(world, tmp_path,
                                                                                    monkeypatch):
    """What a DiffCSE run on two visible GPUs saves: two CUDA generator states and a 16-byte CUDA
    masking-generator state (a CPU generator's is 5,056 bytes; set_state refused it). On the CPU:
    notes, and the same result twice."""
    module = importlib.import_module("diffcse_min")
    stop_after(monkeypatch, module, flags(world, tmp_path / "a", "diffcse"), 4)

    def as_if_cuda(ckpt):
        cuda_state = torch.tensor([42, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
                                  dtype=torch.uint8)
        ckpt["device"], ckpt["rng"]["cuda"] = "cuda", [cuda_state, cuda_state.clone()]
        ckpt["objects"]["gen"] = cuda_state.clone()
        ckpt["objects"]["amp"]["name"] = "bf16"
    edit_checkpoint(tmp_path / "a", as_if_cuda)
    (tmp_path / "b").mkdir()
    for name in ("checkpoint.pt", "log.txt"):
        (tmp_path / "b" / name).write_bytes((tmp_path / "a" / name).read_bytes())
    for out in ("a", "b"):
        module.train(module.Config(resume=str(tmp_path / out)))
    log = (tmp_path / "a" / "log.txt").read_text()
    assert "note: saved on cuda, continued on cpu" in log
    assert "note: saved in bf16, continued in fp32" in log
    # seed 42 + 1000 x step 4
    assert "note: the generator state saved is not a cpu one: seeded from 4042" in log
    assert_same_run(tmp_path / "a", tmp_path / "b")


@pytest.mark.parametrize("saved, visible, index, restored, reseeded", [
    (2, 1, 0, [0], False),   # saved with two GPUs visible, resumed with one: its own state restored
    (1, 2, 1, [0], True),    # torchrun's rank on cuda:1 of a run saved with one GPU: seeded
    (0, 1, 0, [], True)])    # saved on the CPU, resumed on a GPU: seeded
def test_gpu_generator_states_restore_what_fits_and_seed_the_rest(monkeypatch, saved, visible,
                                                                  index, restored,
                                                                   reseeded):
    calls = {"set": [], "seed": []}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, i: calls["set"].append(i))
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: calls["seed"].append(seed))
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [])
    states = {**common.rng_states(), "cuda": [torch.zeros(16, dtype=torch.uint8)] * saved}
    note = common.set_rng_states(states, torch.device("cuda", index), seed=7)
    assert calls["set"] == restored and calls["seed"] == ([7] if reseeded else [])
    assert bool(note) == reseeded and (not note or f"none for cuda:{index}" in note)


def test_the_precision_may_change_on_resume_and_a_bad_one_is_refused(world, tmp_path, monkeypatch):
    module = importlib.import_module("simcse_min")
    stop_after(monkeypatch, module, flags(world, tmp_path / "out"), 4)
    module.train(module.Config(resume=str(tmp_path / "out"), precision="fp16"))
    log = (tmp_path / "out" / "log.txt").read_text()
    assert "note: saved in fp32, continued in fp16" in log
    assert (
        json.loads((tmp_path / "out" / "results.json").read_text())["config"]["precision"] == "fp16"
    )
    with pytest.raises(common.UserError, match="--precision fp8: choose auto, bf16, fp16, fp32"):
        module.train(flags(world, tmp_path / "bad", precision="fp8"))
