"""Each method's head and the parts of its loop that live in train(), checked for what they are
named: SimCSE's Linear + tanh head as the official code initialises it; DiffCSE's BatchNorm
projector (ReLU between, no learnable scale at the end) and its generator left in train mode;
ESimCSE's queue (bounded by queue_size, emptied at each epoch, an entry of another width refused)
and its momentum encoder (moved after every optimizer step), and ESimCSE's defaults as its paper
sets them. The oracles: the official modules written out with torch's primitives, and the state
recorded at each step of a real run."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import common
import diffcse_min
import esimcse_min
import simcse_min
from conftest import tiny_config


def test_simcse_head_is_linear_then_tanh_initialised_as_the_official_code():
    torch.manual_seed(0)
    head = simcse_min.MLPHead(256)
    x = torch.randn(5, 256) * 10
    torch.testing.assert_close(head(x), torch.tanh(x @ head.dense.weight.T + head.dense.bias))
    assert abs(head.dense.weight.std().item() - 0.02) < 0.001 and not head.dense.bias.any()


def standardise(x):  # BatchNorm in training mode: batch mean, biased variance, eps 1e-5
    return (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + 1e-5)


def test_diffcse_projector_is_linear_bn_relu_linear_bn_without_affine():
    torch.manual_seed(0)
    head = diffcse_min.BNProjector(16).train()
    with torch.no_grad():
        # a trained BN, not the init
        head.net[1].weight.uniform_(0.5, 1.5), head.net[1].bias.uniform_(-1, 1)
    x = torch.randn(12, 16)
    w1, bn1, w2 = head.net[0].weight, head.net[1], head.net[3].weight
    want = standardise(F.relu(standardise(x @ w1.T) * bn1.weight + bn1.bias) @ w2.T)
    torch.testing.assert_close(head(x), want)
    # the last BatchNorm learns nothing [official ProjectionMLP]
    assert not list(head.net[4].parameters())


def run_recording(module, world, tmp_path, monkeypatch, record, **kw):
    """module.train on the tiny world; record(locals of train_step's caller args) before each
    step."""
    real_step, seen = module.train_step, []

    def step(*args):
        seen.append(record(*args))
        return real_step(*args)
    monkeypatch.setattr(module, "train_step", step)
    cfg = tiny_config(module, world, tmp_path / "out", **{"max_steps": 0, "eval_every": 100, **kw})
    module.train(cfg)
    return seen


def test_esimcse_queue_is_bounded_emptied_each_epoch_and_momentum_moves_after_each_step(
        world, tmp_path, monkeypatch):
    """48 rows, batch 8: 6 steps an epoch; queue_size 16 holds two batches at most and starts empty
    each epoch [official code]; the momentum encoder differs from one step to the next."""
    def record(model, head, ids, mask, cfg, momentum, queue, rng, tok=None, gen=None):
        return len(queue), queue.maxlen, [p.detach().clone() for p in momentum.parameters()]
    seen = run_recording(esimcse_min, world, tmp_path, monkeypatch, record, queue_size=16, epochs=2,
                         lr=1e-3)
    sizes = [s for s, _, _ in seen]
    assert len(seen) == 12 and {m for _, m, _ in seen} == {16}
    assert sizes == [0, 8, 16, 16, 16, 16, 0, 8, 16, 16, 16, 16], sizes
    momenta = [m for _, _, m in seen]
    assert all(not all(torch.equal(a, b) for a, b in zip(x, y)) for x, y in zip(momenta,
                                                                                momenta[1:]))


def test_diffcse_generator_keeps_dropout_on_during_training(world, tmp_path, monkeypatch):
    """Frozen, yet in train mode as in the official run (its dropout draws differ at every step)."""
    def record(model, head, ids, mask, cfg, disc, generator, tok, gen):
        return generator.training, all(not p.requires_grad for p in generator.parameters())
    seen = run_recording(diffcse_min, world, tmp_path, monkeypatch, record, max_steps=2, lr=7e-6)
    assert seen == [(True, True), (True, True)]


def test_configs_are_dataclasses_with_the_papers_defaults():
    assert dataclasses.is_dataclass(esimcse_min.Config)
    cfg = esimcse_min.Config()
    assert (cfg.queue_size, cfg.momentum, cfg.dup_rate) == (160, 0.995, 0.32)


def test_a_queue_entry_of_another_width_is_refused():
    import collections
    import torch
    model, queue = common.Bert(common.BertConfig.tiny()), collections.deque()
    common.restore_state(queue, [torch.zeros(32)], "cpu", model, 0)  # the model's width: restored
    assert len(queue) == 1
    with pytest.raises(ValueError, match="width"):
        common.restore_state(queue, [torch.zeros(31)], "cpu", model, 0)
