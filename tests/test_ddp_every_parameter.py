"""Under torchrun every module the loop wraps in DistributedDataParallel must give each of its
parameters a gradient at every step, or DDP stops the run at the next one [issue 57: DiffCSE's
discriminator carried the checkpoint's pooler]. Checked in one process on a checkpoint that carries
BERT's pooler, as bert-base-uncased and every released model do: Run.ddp records what it would wrap,
and one real step of each method's train() is inspected between backward and the optimizer. An
option that adds a module (or leaves a part idle) is covered as soon as train() wraps it. The
oracle: each wrapped parameter's .grad after a real backward."""
import importlib

import pytest
import torch

import common
from conftest import tiny_config

METHODS = ["simcse", "esimcse", "simcsepp", "diffcse"]
# the message DDP's reducer raises at the step after an unused parameter [torch reducer.cpp,
# strings of libtorch_cpu.so 2.13: "Expected to have finished reduction ..."]
REDUCER_ERROR = ("Expected to have finished reduction in the prior iteration before starting a new "
                 "one. This error indicates that your module has parameters that were not used in "
                 "producing loss. You can enable unused parameter detection by passing the keyword "
                 "argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedData"
                 "Parallel` ... Parameter indices which did not receive grad for rank 0: 101 102"
                 "\n In addition, you can set the environment variable TORCH_DISTRIBUTED_DEBUG ...")


def params_without_gradient(method, world, tmp_path, monkeypatch):
    """{wrapped module's class: [its parameters without a gradient]} after train()'s first step."""
    module = importlib.import_module(f"{method}_min")
    wrapped, unused = [], {}

    def ddp(run, m):  # what Run.ddp would wrap under torchrun
        wrapped.append(m)
        return m

    def step(loss, opt, sched, amp):  # optimizer_step's backward, then a look, then no update
        loss.backward()
        for m in wrapped:
            names = [n for n, p in m.named_parameters() if p.requires_grad and p.grad is None]
            unused[type(m).__name__] = names
        opt.zero_grad(set_to_none=True)

    monkeypatch.setattr(common.Run, "ddp", ddp)
    monkeypatch.setattr(module, "optimizer_step", step)
    module.train(tiny_config(module, world, tmp_path / "out", max_steps=1, eval_every=100,
                             test="none"))
    return unused


@pytest.mark.parametrize("method", METHODS)
def test_every_wrapped_parameter_gets_a_gradient(method, world, tmp_path, monkeypatch):
    unused = params_without_gradient(method, world, tmp_path, monkeypatch)
    assert "Bert" in unused  # the encoder, with the method's head as its pooler
    if method == "diffcse":
        assert "Discriminator" in unused  # a second BERT, wrapped on its own
    assert unused == {name: [] for name in unused}


def test_the_discriminator_drops_the_checkpoints_pooler(world):
    """The pooler is gone, the embeddings and layers are the checkpoint's."""
    diffcse_min = importlib.import_module("diffcse_min")
    folder = world["model"]
    bert = common.Bert.from_pretrained(folder)
    assert bert.pooler is not None
    disc = diffcse_min.Discriminator(common.Bert.from_pretrained(folder))
    assert disc.bert.pooler is None
    assert not [n for n, _ in disc.named_parameters() if "pooler" in n]
    torch.testing.assert_close(disc.bert.embeddings.word_embeddings.weight,
                               bert.embeddings.word_embeddings.weight)


def test_ddps_reducer_error_is_one_line_naming_the_parameters(capsys):
    def step():
        raise RuntimeError(REDUCER_ERROR)
    with pytest.raises(SystemExit) as e:
        common.main_guard(step)
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert "indices 101 102" in err and "TORCH_DISTRIBUTED_DEBUG=INFO" in err


def test_another_runtime_error_is_not_taken_for_ddps():
    def step():
        raise RuntimeError("shapes do not match")
    with pytest.raises(RuntimeError, match="shapes do not match"):
        common.main_guard(step)
