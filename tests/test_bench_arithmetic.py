"""The arithmetic of tests/tools/bench/bench.py: GPU peaks by name, MFU, the epoch projection from
the evaluations a run makes, the matmul parameter count, and the GPU report's lines. The oracle:
the numbers worked by hand from the vendors' data sheets and the run's evaluation schedule."""
import pytest
import torch

import bench
from common import Bert, BertConfig


def test_gpu_peaks_by_name():
    assert bench.peak_tflops("NVIDIA H100 80GB HBM3") == 989
    assert bench.peak_tflops("NVIDIA H100 PCIe") == 756
    assert bench.peak_tflops("NVIDIA H200") == 989
    assert bench.peak_tflops("NVIDIA A100-SXM4-80GB") == 312
    assert bench.peak_tflops("Some Future GPU") is None
    # no bf16 tensor cores: 125 is its fp16 figure
    assert bench.peak_tflops("Tesla V100-SXM2-16GB") is None
    assert bench.peak_tflops("Tesla V100-SXM2-16GB",
                             "fp16") == 125 and bench.peak_tflops("Tesla T4", "fp16") == 65
    assert bench.peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") is None


def test_mfu_arithmetic():
    # bert-base: 85M matmul parameters, SimCSE: 2 x 64 x 32 tokens with gradient
    flops = bench.train_flops(85e6, 2 * 64 * 32)
    assert flops == 6 * 85e6 * 4096
    assert bench.train_flops(10, 100, 50) == 6 * 10 * 100 + 2 * 10 * 50
    assert bench.mfu(flops, flops / 989e12, 989) == pytest.approx(1.0)
    assert bench.mfu(flops, 0.01, 989) == pytest.approx(2.089e12 / 989e12 / 0.01, rel=1e-3)


def test_epoch_projection_counts_the_evaluations_run_makes():
    evals = sum(1 for s in range(bench.EPOCH_STEPS + 1) if s == 0 or s % 125 == 0
                or s == bench.EPOCH_STEPS)
    assert evals == 126
    assert bench.epoch_seconds(0.03, 2.0) == pytest.approx(15625 * 0.03 + 126 * 2.0)
    # 0, 125, 250, 300
    assert bench.epoch_seconds(1.0, 1.0, steps=300, eval_every=125, test_s=5) == 300 + 4 + 5


def test_matmul_params_leave_out_the_embedding_tables():
    model = Bert(BertConfig.tiny())
    embeddings = sum(p.numel() for p in model.embeddings.parameters())
    assert bench.matmul_params(model) == sum(p.numel() for p in model.parameters()) - embeddings


def test_gpu_report_prints_mfu_and_the_epoch(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    model = Bert(BertConfig.tiny())
    args = type("Args", (), {"peak_tflops": 0, "batch_size": 64, "precision": "bf16"})()
    step = 6 * bench.matmul_params(model) * 2 * 64 * 32 / (0.4 * 989e12)  # the step time of 40% MFU
    bench.report_gpu(args, model, {"ours simcse": step, "HF eager fp16 (official)": 2.5 * step},
                     1.5, 30.0, model, 32)
    out = capsys.readouterr().out
    assert "ours simcse                  MFU  40.0%" in out and "MFU  16.0%" in out
    assert f"epoch {(15625 * step + 126 * 1.5 + 30) / 60:6.1f} min" in out and "2.50x" in out


def test_simcsepp_compiled_beside_simcse_on_cuda_is_refused_before_any_work(monkeypatch, capsys):
    """The pair that crashes torch 2.11 on a GPU (docs/speed.md): one line and exit 2, not a
    segmentation fault after minutes; other sets, the CPU and eager runs have no conflict."""
    assert "segmentation fault" in bench.compile_conflict(bench.METHODS, True, "cuda")
    assert bench.compile_conflict(["simcse", "esimcse", "diffcse"], True, "cuda") == ""
    assert bench.compile_conflict(bench.METHODS, False, "cuda") == ""
    assert bench.compile_conflict(bench.METHODS, True, "cpu") == ""
    monkeypatch.setattr(bench.common, "resolve_device", lambda name: torch.device("cuda"))
    with pytest.raises(SystemExit) as stop:
        bench.main(["--compile", "--model", "bert-base"])
    assert stop.value.code == 2 and "--methods esimcse,diffcse" in capsys.readouterr().err
