"""--chunk_size (common.gradient_cache, issue 44): the whole batch's step, chunk_size rows at once.

The oracle is the unchunked step with the same dropout masks: ddp_world.Masks records each chunk's
masks and replays them, joined, in the unchunked run. 8 float64 steps of each method (batch 64,
chunk 16) then agree to 1e-12 (ddp_world.tolerance); one process here, two in test_ddp.py. The
second pass of a chunk must see its first pass's random state, autocast and module modes: checked
where SDPA draws the attention dropout itself, in bf16, and in SimCSE++'s dropout-off pass. The
memory that autograd saves for backward scales with the chunk, not the batch."""
import collections
import importlib
import random
import weakref

import pytest
import torch

import common
from ddp_world import METHODS, Masks, assert_same_states, no_dropout_bert, run_method
from tiny_world import sentence, tokenizer

@pytest.mark.parametrize("method", METHODS)
def test_chunked_steps_are_the_unchunked_steps_with_the_same_masks(method):
    masks = Masks()
    losses, _, states = run_method(method, chunk_size=16, batch=64, steps=8, masks=masks)
    masks.replay = True
    losses0, _, states0 = run_method(method, chunk_size=0, batch=64, steps=8, masks=masks)
    assert not any(masks.saved.values())  # every recorded mask replayed: the same masks
    assert losses == pytest.approx(losses0, abs=1e-12, rel=0)
    assert losses[0] != pytest.approx(losses[-1], abs=1e-3)  # the steps moved the weights
    assert_same_states(states, states0)


def sentences(n):
    rng = random.Random(0)
    return [sentence(rng) for _ in range(n)]


def recorded_passes(model):
    """model.encode wrapped: whether autocast is on, and the outputs, in each chunk's first pass
    (no graph) and its second."""
    passes = {False: [], True: []}
    encode = model.encode

    def recording(*args, **kw):
        out = encode(*args, **kw)
        passes[torch.is_grad_enabled()].append((torch.is_autocast_enabled("cpu"), out.detach()))
        return out
    model.encode = recording
    return passes


@pytest.mark.parametrize("method, precision", [("simcse", "fp32"), ("simcse", "bf16"),
                                               ("simcsepp", "fp32")])
def test_the_second_pass_replays_the_first(method, precision):
    """Attention dropout on (SDPA draws it from the generator), bf16 autocast, SimCSE++'s pass
    with every dropout off: each chunk's second pass computes its first pass's vectors exactly."""
    m, tok = importlib.import_module(f"{method}_min"), tokenizer()
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)))  # dropout 0.1, both
    model.pooler = head = m.MLPHead(32)
    passes = recorded_passes(model)
    ids, mask = tok(sentences(24))
    amp = common.MixedPrecision(precision, torch.device("cpu"))
    with amp.autocast():
        loss, _ = m.train_step(model.train(), head, ids[:, None], mask[:, None],
                               m.Config(chunk_size=8))
    loss.backward()
    first, second = passes[False], passes[True]
    assert len(first) == len(second) == (9 if method == "simcsepp" else 6)  # 48 (+24) rows by 8
    assert {autocast for autocast, _ in first + second} == {precision == "bf16"}
    for _, b in second:  # backward meets SimCSE++'s dropout-off chunks first: any order
        assert sum(torch.equal(a, b) for _, a in first) == 1
    assert not torch.equal(first[0][1], first[3][1])  # one sentence, two views: other masks
    assert model.training and all(x.training for x in model.modules())  # modes as they were


def test_esimcse_momentum_encoder_runs_in_chunks_too():
    """The queue's encoder has no graph, but its whole-batch pass would still be the step's peak."""
    m, tok = importlib.import_module("esimcse_min"), tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab)))
    model.pooler = head = m.MLPHead(32)
    momentum, rows = m.momentum_encoder(model), []
    encode = momentum.encode
    momentum.encode = lambda x, mask, **kw: rows.append(len(x)) or encode(x, mask, **kw)
    ids, mask = tok(sentences(24))
    m.train_step(model.train(), head, ids[:, None], mask[:, None], m.Config(chunk_size=8),
                 momentum, collections.deque(maxlen=48), random.Random(0))
    assert rows == [8, 8, 8]


def test_backward_leaves_the_random_state_and_the_modes_as_it_found_them():
    """The second passes set each chunk's random state and step 1's modes (here eval: SimCSE++'s
    dropout-off pass); afterwards both are as before backward. Else the next draws would repeat
    those made between the passes (DiffCSE's generator), or dropout would stay off."""
    tok = tokenizer()
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab))).train()
    ids, mask = tok(sentences(24))
    with importlib.import_module("simcsepp_min").dropout_off(model):
        vectors = common.gradient_cache(model, 8, ids, mask, cls_only=True)  # [24, H]
    weights = torch.randn_like(vectors)  # a draw between the passes
    state = torch.get_rng_state()
    (vectors * weights).sum().backward()
    assert torch.equal(torch.get_rng_state(), state)
    assert all(m.training for m in model.modules())


def test_mixed_precision_and_the_fp16_scaler_work_as_unchunked():
    """fp16 autocast with the loss scaler: the cached gradient is the scaled one, so the unscaled
    gradients are the unchunked step's (the same masks), to fp16's precision."""
    grads = []
    masks = Masks()
    for chunk_size in (16, 0):
        m, tok = importlib.import_module("simcse_min"), tokenizer()
        torch.manual_seed(0)
        model = no_dropout_bert(tok, dropout=0.1).float()
        model.pooler = head = m.MLPHead(32)
        masks.patch(model=model)
        amp = common.MixedPrecision("fp16", torch.device("cpu"))
        amp.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)  # no overflow: a step
        opt, _ = common.make_optimizer(model.parameters(), 1e-3, 10, torch.device("cpu"))
        ids, mask = tok(sentences(64))
        with amp.autocast():
            loss, _ = m.train_step(model.train(), head, ids[:, None], mask[:, None],
                                   m.Config(chunk_size=chunk_size))
        amp.scaler.scale(loss).backward()
        amp.scaler.unscale_(opt)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        masks.replay = True
    assert grads[0].norm() > 1
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=2e-3 * grads[1].abs().max())


class SavedBytes:
    """saved_tensors_hooks that count the bytes autograd holds for backward: a tensor from its
    save until autograd lets go of it (every saver), one storage counted once, parameters not at
    all (saved, not copied). peak: the most at once."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.holders, self.live, self.peak = {}, 0, 0

    def pack(self, t):
        key = t.untyped_storage().data_ptr()
        if key in self.params:
            return t
        if key not in self.holders:
            self.holders[key] = 0
            self.live += t.untyped_storage().nbytes()
            self.peak = max(self.peak, self.live)
        self.holders[key] += 1
        held = Held(t)
        weakref.finalize(held, self.release, key, t.untyped_storage().nbytes())
        return held

    def release(self, key, nbytes):
        self.holders[key] -= 1
        if not self.holders[key]:
            del self.holders[key]
            self.live -= nbytes


class Held:
    def __init__(self, t):
        self.t = t


def saved_peak(chunk_size, batch=256):
    """Peak bytes saved for backward in one SimCSE step (forward and backward) of batch sentences,
    2 views each, on a 4-layer float32 BERT; and the cached vectors' bytes."""
    m, tok = importlib.import_module("simcse_min"), tokenizer()
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab), num_hidden_layers=4))
    model.pooler = head = m.MLPHead(32)
    ids, mask = tok(sentences(batch))
    counter = SavedBytes(model.parameters())
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda held: held if
                                                  isinstance(held, torch.Tensor) else held.t):
        loss, _ = m.train_step(model.train(), head, ids[:, None], mask[:, None],
                               m.Config(chunk_size=chunk_size))
        loss.backward()
    return counter.peak, 2 * batch * 32 * 4


def test_the_memory_saved_for_backward_scales_with_the_chunk():
    whole, cached = saved_peak(0)
    chunked, _ = saved_peak(16)
    print(f"saved for backward, batch 256: {whole} bytes; chunk 16: {chunked}")
    assert chunked <= whole / 8 + cached
    assert chunked >= whole / 64  # measured: a chunk's graph is counted, not nothing
