"""--compile on the CPU (inductor), every method: a compiled training step equals the eager one
(loss and encoder
gradients), and a second step on other sentences runs the same graph: shapes are static, so nothing
recompiles
(ESimCSE's views are padded to max_len + 9; DiffCSE's RTD loss ignores the padding past the longest
sentence).

Inductor draws dropout masks with its own generator; `fallback_random` makes it draw them as
eager PyTorch does, so the two steps see the same masks. About 10 s of compilation per method on 2
cores (one layer)."""
import collections
import copy
import importlib
import random

import pytest
import torch
import torch._dynamo
import torch._inductor.config

import common
from tiny_world import tokenizer

TOK = tokenizer()
MAX_LEN = 32  # Config().max_len: under --compile every batch is padded to it (Run.width)


def batch(seed):
    """ids, mask [8, 1, 32]: sentences of random lengths (the longest below 32), padded to
    max_len."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, MAX_LEN - 4, (8, 1), generator=g)
    mask = (torch.arange(MAX_LEN) < lengths).long()[:, None]  # [8, 1, 32]
    ids = torch.randint(5, len(TOK.vocab), (8, 1, MAX_LEN), generator=g) * mask
    ids[:, 0, 0] = TOK.cls_id
    return ids, mask


def setup(method):
    """A one-layer tiny BERT, its head and the extra train_step arguments of `method`, all
    seeded."""
    module = importlib.import_module(f"{method}_min")
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(TOK.vocab), num_hidden_layers=1))
    head = (module.BNProjector if method == "diffcse" else module.MLPHead)(model.cfg.hidden_size)
    cfg = module.Config(compile=True)
    extra = {"esimcse": lambda: (module.momentum_encoder(model), collections.deque(maxlen=16),
                                 random.Random(0)),
             "diffcse": lambda: (module.Discriminator(copy.deepcopy(model)),
                                 common.Bert(common.BertConfig.tiny(vocab_size=len(TOK.vocab)),
                                             mlm_head=True),
                                 TOK, torch.Generator().manual_seed(0))}.get(method, tuple)()
    return module, model.train(), head.train(), cfg, extra


def step(method, compiled, seed=0):
    module, model, head, cfg, extra = setup(method)
    if compiled:
        model.compile(dynamic=False)  # as Run.compile on the CPU
    torch.manual_seed(1)
    loss, _ = module.train_step(model, head, *batch(seed), cfg, *extra)
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters()], (module, model, head, cfg, extra)


@pytest.mark.parametrize("method", ["simcse", "esimcse", "simcsepp", "diffcse"])
def test_compiled_step_equals_eager_and_never_recompiles(method):
    torch._dynamo.reset()
    eager_loss, eager_grads, _ = step(method, compiled=False)
    with torch._inductor.config.patch(fallback_random=True):
        loss, grads, (module, model, head, cfg, extra) = step(method, compiled=True)
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-3, atol=1e-5)
    # other lengths, other repeats: the same shapes
    with torch._dynamo.config.patch(error_on_recompile=True):
        for seed in (1, 2):
            module.train_step(model, head, *batch(seed), cfg, *extra)[0].backward()


def test_esimcse_views_have_one_width_under_compile():
    module = importlib.import_module("esimcse_min")
    widths = {module.make_views(*batch(seed), 0.32, random.Random(seed), fixed=True)[0].shape
              for seed in range(20)}
    assert widths == {(16, MAX_LEN + 9)}
    loose = {module.make_views(*batch(seed), 0.32, random.Random(seed))[0].size(1) for seed
             in range(20)}
    assert len(loose) > 1  # eager: padded to the longest repeat, which varies
