"""DiffCSE in training: the RTD gradient reaches the encoder through the projector, the generator
stays frozen over a step, and a generator without an MLM head or with another vocabulary is
refused. The oracles: the encoder's gradient with and without the RTD term, and the generator's
weights before and after a step."""
import copy

import pytest
import torch

import common
import diffcse_min
from common import Bert, BertConfig, CheckpointError, MixedPrecision, make_optimizer, optimizer_step
from diffcse_min import Config, info_nce, load_generator, train_step
from test_diffcse import sentences, tiny_models, TOK


def test_rtd_gradient_reaches_encoder_through_projector(monkeypatch):
    # loss = λ·RTD alone
    monkeypatch.setattr(diffcse_min, "info_nce", lambda h1, h2, temp: 0.0 * h1.sum())
    model, head, disc, generator = tiny_models()
    ids, mask = sentences(8, 10, seed=5)
    loss, stats = train_step(model, head, ids[:, None], mask[:, None], Config(lambda_rtd=0.005),
                             disc, generator,
                             TOK, torch.Generator().manual_seed(0))
    torch.testing.assert_close(loss, 0.005 * stats["rtd"])
    loss.backward()
    for name, p in [*model.named_parameters(), *head.named_parameters()]:
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_generator_frozen_over_a_training_step():
    model, head, disc, generator = tiny_models()
    before = copy.deepcopy(generator.state_dict())
    modules = (model, head, disc, generator)
    opt, sched = make_optimizer([p for m in modules for p in m.parameters()], 1e-3, 10,
                                torch.device("cpu"))
    ids, mask = sentences(8, 10, seed=6)
    loss, _ = train_step(model, head, ids[:, None], mask[:, None], Config(), disc, generator, TOK,
                         torch.Generator().manual_seed(0))
    enc_before = copy.deepcopy(model.state_dict())
    optimizer_step(loss, opt, sched, MixedPrecision("fp32", torch.device("cpu")))
    assert all(not p.requires_grad and p.grad is None for p in generator.parameters())
    assert all(torch.equal(before[k], v) for k, v in generator.state_dict().items())
    assert any(not torch.equal(enc_before[k], v) for k, v
               in model.state_dict().items()), "the encoder did not move"


def generator_run(folder):
    """What load_generator reads of a Run: --generator and the rank that prints."""
    run = object.__new__(common.Run)
    run.cfg, run.rank = Config(generator=str(folder), max_len=32), 0
    return run


def test_generator_checkpoint_without_mlm_head_is_a_clear_error(tmp_path):
    torch.manual_seed(0)
    common.save_pretrained(Bert(BertConfig.tiny()), tmp_path / "encoder", TOK)
    with pytest.raises(CheckpointError, match="no masked-LM head: a masked language model is "
                                              "needed"):
        load_generator(generator_run(tmp_path / "encoder"), TOK)
    common.save_pretrained(Bert(BertConfig.tiny(), mlm_head=True), tmp_path / "mlm", TOK)
    generator = load_generator(generator_run(tmp_path / "mlm"), TOK)
    assert generator.mlm is not None and not any(p.requires_grad for p in generator.parameters())


def test_generator_with_another_vocabulary_is_refused(tmp_path):
    other = common.Tokenizer(
        {w: i for i, w in enumerate([*common.SPECIAL_TOKENS, *(f"v{i}" for i in range(123))])}
    )
    common.save_pretrained(Bert(BertConfig.tiny(), mlm_head=True), tmp_path / "mlm", other)
    with pytest.raises(common.UserError, match="vocabulary"):
        load_generator(generator_run(tmp_path / "mlm"), TOK)


def test_no_special_token_is_ever_masked(monkeypatch):
    """[UNK] and a literal [MASK] in the text stay as they are, like [CLS], [SEP] and [PAD]: the
    official collator (transformers 4.2.1's DataCollatorForLanguageModeling) masks no special id
    [issue 30]. At mask_ratio 1 every other real token is chosen."""
    w = TOK.vocab["w7"]
    row = [TOK.cls_id, w, TOK.unk_id, TOK.mask_id, w, w, TOK.sep_id, TOK.pad_id]
    ids, mask = torch.tensor([row] * 4), torch.tensor([[1] * 7 + [0]] * 4)
    chosen, real = [], diffcse_min.mask_tokens

    def spy(*args):
        chosen.append(real(*args)[1])
        return real(*args)
    monkeypatch.setattr(diffcse_min, "mask_tokens", spy)
    train_step(*tiny_models()[:2], ids[:, None], mask[:, None], Config(mask_ratio=1.0),
               *tiny_models()[2:], TOK, torch.Generator().manual_seed(0))
    assert chosen[0].tolist() == [[False, True, False, False, True, True, False, False]] * 8
