"""The GPU path without a GPU [issue 30]: a training step never reads a value back from the device
(run on the meta device, where any such read fails), a non-finite loss is noted on the device and
read every 10 steps, torchrun's ranks agree on signals every 10 steps, fp16 counts skipped steps
without reading the scale, SimCSE++ compiles static graphs only, and uniformity is one matmul. The
oracle: the meta device, where reading a value back fails, and the counts of device reads."""
import collections
import contextlib
import importlib
import random
import types

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

import common
from test_compile import TOK, batch, setup

META = torch.device("meta")


def extras(method, model):
    """The train_step arguments after cfg, on the meta device (DiffCSE: gen None, as meta has no
    generator of its own)."""
    module = importlib.import_module(f"{method}_min")
    if method == "esimcse":
        return module.momentum_encoder(model), collections.deque(maxlen=16), random.Random(0)
    if method == "diffcse":
        generator = common.Bert(model.cfg, mlm_head=True).to(META).requires_grad_(False)
        return module.Discriminator(common.Bert(model.cfg)).to(META), generator, TOK, None
    return ()


@pytest.mark.parametrize("method", ["simcse", "esimcse", "simcsepp", "diffcse"])
def test_a_training_step_reads_nothing_back_from_the_device(method, monkeypatch):
    """.item(), .tolist(), bool() of a meta tensor raise: the step below is the loop's own."""
    module, model, head, cfg, _ = setup(method)
    model, head = model.to(META), head.to(META)
    real_tensor = torch.tensor

    def host_data(*args, device=None, **kw):  # a tensor built from Python data on the device
        assert device is None or torch.device(device).type == "cpu", "copied from the host"
        return real_tensor(*args, **kw)
    monkeypatch.setattr(torch, "tensor", host_data)
    monkeypatch.setattr(torch, "autocast", lambda *a, **k: contextlib.nullcontext())  # no meta
    cfg.compile = False
    opt, sched = common.make_optimizer([*model.parameters(), *head.parameters()], 1e-3, 10, META)
    amp, watch = common.MixedPrecision("fp32", torch.device("cpu")), common.LossWatch()
    more = extras(method, model)
    for step in range(2):
        loss, stats = module.train_step(model, head, *batch(step), cfg, *more)
        watch.note(loss, step + 1)
        common.optimizer_step(loss, opt, sched, amp)
    assert loss.device == META and watch.first.device == META


def test_a_non_finite_loss_is_noted_on_the_device_and_read_every_10_steps():
    watch = common.LossWatch()
    for step, value in enumerate([1.0, 2.0, float("inf"), float("nan"), 3.0], start=1):
        watch.note(torch.tensor(value), step)
    assert watch.stopped(5, read=False) == ""  # not read yet: no host sync
    assert watch.stopped(10, read=False).startswith("the loss became inf at step 3")
    assert watch.stopped(7, read=True).startswith("the loss became inf at step 3")
    fine = common.LossWatch()
    fine.note(torch.tensor(0.5), 1)
    assert fine.stopped(10, read=True) == ""


def test_torchrun_ranks_agree_on_signals_every_10_steps(monkeypatch):
    calls = []
    monkeypatch.setattr(common.dist, "all_reduce", lambda flag, op: calls.append(int(flag)))
    run = types.SimpleNamespace(world_size=2, signal=15, device=torch.device("cpu"))
    seen = [common.Run.signal_received(run, step) for step in range(25)]
    assert len(calls) == 3 and seen == [15] * 25  # steps 0, 10, 20


def test_fp16_counts_a_skipped_step_without_reading_the_scale(monkeypatch):
    monkeypatch.setattr(torch.amp.GradScaler, "get_scale", lambda self: pytest.fail("a sync"))
    model = torch.nn.Linear(4, 4)
    opt, sched = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
    amp = common.MixedPrecision("fp16", torch.device("cpu"))
    common.optimizer_step(model(torch.ones(2, 4)).sum() * float("inf"), opt, sched, amp)
    common.optimizer_step(model(torch.ones(2, 4)).sum(), opt, sched, amp)
    assert common.skipped_steps(opt, sched) == 1


def test_compiled_simcsepp_has_only_static_graphs(monkeypatch):
    """Its dropout-off pass (b rows, eval mode) recompiles the encoder: with dynamo's automatic
    dynamic shapes that second graph had a symbolic batch size; Run.compile asks for static."""
    torch._dynamo.reset()
    symbolic, real_compile = [], torch.compile

    def recorder(gm, example_inputs):
        values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        symbolic.extend(v for v in values if isinstance(v, torch.SymInt) or torch.is_tensor(v)
                        and any(isinstance(s, torch.SymInt) for s in v.shape))
        return gm.forward
    monkeypatch.setattr(torch, "compile", lambda fn, mode=None, **kw: real_compile(
        fn, backend=recorder, **kw))
    module, model, head, cfg, extra = setup("simcsepp")
    run = types.SimpleNamespace(cfg=cfg, device=torch.device("cpu"), log=lambda msg: None)
    common.Run.compile(run, model)
    for seed in (0, 1):
        module.train_step(model, head, *batch(seed), cfg, *extra)[0].backward()
    torch._dynamo.reset()
    assert symbolic == []


def test_uniformity_from_the_gram_matrix_equals_pdists_pairs(monkeypatch):
    x = torch.randn(300, 16, generator=torch.Generator().manual_seed(0))
    unit = F.normalize(x.double(), dim=-1)
    reference = torch.pdist(unit).pow(2).mul(-2).exp().mean().log().item()  # pairs i < j
    monkeypatch.setattr(torch, "pdist", lambda *a: pytest.fail("pdist: 1.9x slower"))
    assert common.uniformity(x) == pytest.approx(reference, rel=1e-12)


def test_the_docs_say_what_runs_on_a_gpu(monkeypatch):
    """TF32 matmuls on CUDA (set by resolve_device) and the masked attention's kernel, in the
    README and docs/speed.md [issue 30, item 8]."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        assert common.resolve_device("cuda").type == "cuda"
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    root = common.Path(common.__file__).parent
    speed, readme = (root / "docs/speed.md").read_text(), (root / "README.md").read_text()
    assert "TF32" in readme and "TF32 matmuls" in speed
    assert "memory-efficient\n  kernel" in speed or "memory-efficient kernel" in speed
