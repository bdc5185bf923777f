"""The fast path: the [CLS]-only last layer equals the full one, padding equals a loop, the cached
tokenizer equals tokenize-then-truncate, --compile plumbing (batches padded to max_len), and the
benchmark's arithmetic (MFU, the epoch projection)."""
import random
import re

import pytest
import torch

import common
import diffcse_min
import esimcse_min
import simcse_min
import simcsepp_min
from common import Bert, BertConfig

METHOD_MODULES = [simcse_min, esimcse_min, simcsepp_min, diffcse_min]


def tiny64(seed=0):
    torch.manual_seed(seed)
    return Bert(BertConfig.tiny()).double().eval()


def inputs(padded):
    ids = torch.randint(5, 128, (4, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(4, 9, dtype=torch.long)
    if padded:
        mask[1, 5:], mask[3, 2:] = 0, 0  # rows of 5 and 2 real tokens
    return ids, mask


@pytest.mark.parametrize("padded", [False, True])
def test_cls_only_equals_the_full_last_layer(padded):
    model = tiny64()
    ids, mask = inputs(padded)
    full = model(ids, mask)[:, 0]  # [4, H]
    fast = model(ids, mask, cls_only=True)
    assert fast.shape == (4, model.cfg.hidden_size)
    torch.testing.assert_close(fast, full, atol=1e-12, rtol=0)


def test_cls_only_gives_the_same_gradients():
    grads = []
    for cls_only in (False, True):
        model = tiny64()
        ids, mask = inputs(padded=True)
        cls = model(ids, mask, cls_only=True) if cls_only else model(ids, mask)[:, 0]  # [4, H]
        cls.sin().sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-12, rtol=0, msg=name)


def test_cls_evaluation_equals_the_full_forward():
    model, tok = tiny64().float(), None
    id_lists = [[2] + [random.Random(i).randrange(5, 128) for _ in range(i % 11)] + [3] for i
                in range(40)]
    tok = type("Ids", (), {"pad": lambda self, x, width=None: common.pad_ids(x, 0, width)})()
    vectors = common.encode_sentences(model, tok, None, "cls_before_pooler", 8,
                                      id_lists=id_lists)  # [40, H]
    for i in (0, 7, 39):
        ids = torch.tensor([id_lists[i]])
        torch.testing.assert_close(vectors[i], model(ids, torch.ones_like(ids))[0, 0], atol=1e-5,
                                   rtol=0)


def pad_loop(id_lists, pad_id, width=None):  # the oracle: rows written into a tensor one by one
    L = max([width or 0, *map(len, id_lists)])
    ids = torch.full((len(id_lists), L), pad_id, dtype=torch.long)
    mask = torch.zeros((len(id_lists), L), dtype=torch.long)
    for i, x in enumerate(id_lists):
        ids[i, :len(x)], mask[i, :len(x)] = torch.tensor(x, dtype=torch.long), 1
    return ids, mask


@pytest.mark.parametrize("width", [None, 3, 40])
def test_padding_equals_a_loop(width):
    rng = random.Random(width)
    id_lists = [[rng.randrange(30000) for _ in range(rng.randint(1, 33))] for _ in range(50)]
    for got, want in zip(common.pad_ids(id_lists, 7, width), pad_loop(id_lists, 7, width)):
        assert got.dtype == torch.long and torch.equal(got, want)


@pytest.mark.parametrize("compile_flag", [False, True])
def test_compile_pads_every_batch_to_max_len_for_one_shape(compile_flag):
    tok = type("Ids", (), {"pad": lambda self, x, width=None: common.pad_ids(x, 0, width)})()
    data = [([2, 5, 3], [2, 6, 7, 3]), ([2, 3], [2, 9, 3])]  # 2 rows x 2 columns
    cfg = simcse_min.Config(batch_size=2, max_len=8, compile=compile_flag)
    ids, mask = next(common.epoch_batches(data, tok, cfg, 0, 1))
    assert ids.shape == mask.shape == (2, 2, 8 if compile_flag else 4)
    assert sorted(ids[:, 1, :4].tolist()) == [[2, 6, 7, 3], [2, 9, 3, 0]]
    assert sorted(mask[:, 0].sum(-1).tolist()) == [2, 3]


@pytest.fixture(scope="module")
def wiki_lines(wiki_path):
    return common.read_lines(wiki_path)[:600] + ["a [MASK] b " * 20, "[CLS] x [SEP] " * 12, "",
                                                 "word " * 40]


@pytest.mark.parametrize("max_len", [2, 5, 32])
def test_early_stopping_cached_tokenizer_equals_encode_then_truncate(model_dir, wiki_lines,
                                                                     max_len):
    warm = common.Tokenizer.from_pretrained(model_dir)
    for text in wiki_lines:
        cold = common.Tokenizer.from_pretrained(model_dir) if text is wiki_lines[0] else None
        full = warm.encode(text)  # no truncation: the oracle
        want = full[:max_len - 1] + [warm.sep_id] if len(full) > max_len else full
        assert warm.encode(text, max_len) == want, text
        if cold is not None:
            assert cold.encode(text, max_len) == want


def bare_run(compile_flag):
    run = object.__new__(common.Run)  # the bookkeeping without an output folder or SentEval
    run.cfg, run.device = simcse_min.Config(compile=compile_flag), torch.device("cpu")
    run.log = print
    return run


def test_compile_flag_compiles_in_place_and_keeps_checkpoint_names(tmp_path):
    model = Bert(BertConfig.tiny())
    names = list(model.state_dict())
    run = bare_run(False)
    assert run.compile(model) is model and model._compiled_call_impl is None
    run = bare_run(True)
    # lazy: compiles on the first call, which this test does not make
    assert run.compile(model) is model
    assert model._compiled_call_impl is not None
    # no `_orig_mod.` prefix, so the best state and the save are unchanged
    assert list(model.state_dict()) == names
    tok = common.Tokenizer({t: i for i, t in enumerate(common.SPECIAL_TOKENS)})
    common.save_pretrained(model, tmp_path, tok)
    assert all("_orig_mod" not in k for k
               in common.read_safetensors(tmp_path / "model.safetensors"))


@pytest.mark.parametrize("module", METHOD_MODULES, ids=lambda m: m.__name__)
def test_every_method_compiles_right_before_the_run_starts(module):
    assert module.Config().compile is False
    source = open(module.__file__).read()
    assert re.search(r"\n    run\.compile\(model\)\n    start, stats = run\.start\(checkpointed, "
                     r"total\)", source)
