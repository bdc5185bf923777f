"""The precision of every method's loss: common.upcast lifts bf16 and fp16 to float32 and leaves
float64 as it is, so a float64 model gives a float64 loss in each method's train_step (ESimCSE's
queue of float64 vectors too) whose graph is whole, a float64 gradient reaching the encoder. The
oracle: the dtypes torch gives each tensor."""
import collections
import copy
import random

import pytest
import torch

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from tiny_world import sentence, tokenizer


def test_upcast_is_at_least_float32():
    assert common.upcast(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.float32
    assert common.upcast(torch.ones(2, dtype=torch.float16)).dtype == torch.float32
    assert common.upcast(torch.ones(2, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("method", ["simcse", "esimcse", "simcsepp", "diffcse"])
def test_float64_model_gives_a_float64_loss(method):
    torch.manual_seed(0)
    tok, rng = tokenizer(), random.Random(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab))).double().train()
    ids, mask = tok([sentence(rng) for _ in range(4)], max_len=16)
    ids, mask = ids[:, None], mask[:, None]  # [B, 1, L]
    H = model.cfg.hidden_size
    if method == "simcse":
        losses = [simcse_min.train_step(model, simcse_min.MLPHead(H).double(), ids, mask,
                                        simcse_min.Config())[0]]
    elif method == "simcsepp":
        cfg = simcsepp_min.Config()
        losses = [simcsepp_min.train_step(model, simcsepp_min.MLPHead(H).double(), ids, mask,
                                          cfg)[0]]
    elif method == "esimcse":
        cfg, head = esimcse_min.Config(queue_size=6), esimcse_min.MLPHead(H).double()
        momentum, queue = esimcse_min.momentum_encoder(model), collections.deque(maxlen=6)
        losses = [esimcse_min.train_step(model, head, ids, mask, cfg, momentum, queue,
                                         random.Random(0))[0]
                  for _ in range(2)]  # the second step with a queue of float64 vectors
        assert all(q.dtype == torch.float64 for q in queue)
    else:
        disc = diffcse_min.Discriminator(copy.deepcopy(model)).double().train()
        generator = common.Bert(model.cfg, mlm_head=True).double().requires_grad_(False)
        head = diffcse_min.BNProjector(H).double().train()
        losses = [diffcse_min.train_step(model, head, ids, mask, diffcse_min.Config(), disc,
                                         generator, tok,
                                         torch.Generator().manual_seed(0))[0]]
    for loss in losses:
        assert loss.dtype == torch.float64 and torch.isfinite(loss)
    losses[-1].backward()  # the float64 graph is whole
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(g.dtype == torch.float64 for g in grads)  # a gradient reached the model
