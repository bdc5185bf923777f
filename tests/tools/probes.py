"""What each exercise of exercise.py gives on fixed inputs: one function per exercise, taking the
module under test (the learner's file, or ours with one known mistake) and returning values that
tell a mistake from another: losses with their gradients, or, where an answer may draw its random
numbers in another order than ours, statistics that do not depend on that order."""
import copy
import random

import torch
import torch.nn as nn


def rand(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()


def value_and_grads(loss, inputs):  # an input the loss does not use: a zero gradient
    grads = torch.autograd.grad(loss, inputs, allow_unused=True)
    zeros = [torch.zeros_like(x) for x in inputs]
    return [loss.detach(), *(z if g is None else g for g, z in zip(grads, zeros))]


def info_nce(m):
    h1, h2 = rand(4, 8, seed=0), rand(4, 8, seed=1)
    return value_and_grads(m.info_nce(h1, h2, 0.05), (h1, h2))


def hard_negatives(m):
    h1, h2, h3 = (rand(4, 8, seed=s) for s in range(3))
    return [*info_nce(m), *value_and_grads(m.info_nce(h1, h2, 0.05, h3, 0.7), (h1, h2, h3))]


def make_views(m):
    one = torch.arange(6).view(2, 1, 3)
    three = torch.arange(12).view(2, 3, 2)
    return [*m.make_views(one, torch.ones_like(one)), *m.make_views(three, three % 2)]


def repeat_subwords(m):
    """Over 200 draws, for each length 1..32: the most repeats seen; and whether [CLS] (2) or
    [SEP] (3) was ever repeated."""
    ids, mask = torch.zeros(32, 32, dtype=torch.long), torch.zeros(32, 32, dtype=torch.long)
    for n in range(1, 33):
        row = [2] + list(range(5, 5 + n - 2)) + [3] if n > 1 else [2]
        ids[n - 1, :n], mask[n - 1, :n] = torch.tensor(row), 1
    rng, most, specials = random.Random(0), torch.zeros(32, dtype=torch.long), False
    for _ in range(200):
        new_ids, new_mask = m.repeat_subwords(ids, mask, 0.32, rng)
        most = torch.maximum(most, new_mask.sum(1) - mask.sum(1))
        specials = specials or bool(((new_ids == 2).sum(1) > 1).any() | ((new_ids == 3).sum(1)
                                                                          > 1).any())
    return [most, specials]


def momentum(m):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).double()
    encoder = m.momentum_encoder(model)
    modes = [encoder.training, any(p.requires_grad for p in encoder.parameters()),
             encoder is model]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    m.momentum_update(encoder, model, 0.9)
    return [modes, [p.detach() for p in encoder.parameters()]]


def queue_loss(m):
    h1, h2, queue = rand(4, 8, seed=0), rand(4, 8, seed=1), rand(3, 8, seed=2).detach()
    return value_and_grads(m.info_nce_with_queue(h1, h2, queue, 0.05), (h1, h2))


def off_dropout_nce(m):
    h = [rand(4, 8, seed=s) for s in range(3)]
    return value_and_grads(m.off_dropout_nce(*h, 0.05, 0.9), h)


def dcl(m):
    h = [rand(6, 8, seed=s) for s in range(2)]
    return value_and_grads(m.dcl_loss(*h, 5.0), h)


def bn_projector(m):
    """The parameters' shapes and, with every Linear set to the same weights, the output."""
    head = m.BNProjector(16).double().train()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in (x for x in head.modules() if isinstance(x, nn.Linear)):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=g))
    shapes = sorted(tuple(p.shape) for p in head.parameters())
    return [shapes, head(torch.randn(12, 16, generator=g, dtype=torch.float64)).detach()]


def mask_tokens(m):
    """Shares over 512 x 48 tokens: chosen of the maskable, then [MASK], random, kept of the chosen;
    and whether a special token or padding was ever changed."""
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(3, 49, (512,), generator=g)
    mask = (torch.arange(48) < lengths[:, None]).long()
    ids = torch.randint(5, 30522, (512, 48), generator=g)
    ids[:, 0], ids[torch.arange(512), lengths - 1] = 2, 3
    ids = ids * mask
    out, chosen = m.mask_tokens(ids, mask, 0.30, 4, 30522, (2, 3), torch.Generator().manual_seed(0))
    maskable = mask.bool() & (ids != 2) & (ids != 3)
    n = chosen.sum().item()
    shares = [n / maskable.sum().item(), (chosen & (out == 4)).sum().item() / n,
              (chosen & (out != 4) & (out != ids)).sum().item() / n,
              (chosen & (out == ids)).sum().item() / n]
    return [torch.tensor(shares), bool((out[~maskable] != ids[~maskable]).any())]


def rtd_loss(m):
    logits = rand(4, 9, 2, seed=0)
    labels = torch.randint(0, 2, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(9) < torch.tensor([[6], [3], [5], [2]])).long()
    return value_and_grads(m.rtd_loss(logits, labels * mask, mask), (logits,))


def attention(m):
    """A tiny BERT in float64: padded rows in eval mode, the [CLS]-only pass, and whether the
    attention probabilities are dropped out in training mode."""
    torch.manual_seed(0)
    model = m.Bert(m.BertConfig.tiny(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.5))
    model, g = model.double().eval(), torch.Generator().manual_seed(2)
    with torch.no_grad():  # weights of N(0, 0.3^2), not 0.02^2: GELU's tanh form differs too
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ids = torch.randint(5, 128, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = (torch.arange(9) < torch.tensor([[9], [5], [2]])).long()
    out = [model(ids, mask).detach(), model(ids, mask, cls_only=True).detach()]
    model.train()
    return [*out, not torch.equal(model(ids, mask), copy.deepcopy(model).eval()(ids, mask))]


def alignment_uniformity(m):
    x, y = rand(20, 8, seed=0).detach(), rand(20, 8, seed=1).detach()
    return [m.alignment(x, 3 * y), m.uniformity(2 * x), m.uniformity(torch.eye(3)[:2])]
