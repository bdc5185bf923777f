"""Embedding-space analysis: alignment, uniformity and singular values against answers known in
closed form or by numerical integration, the per-group statistics against numpy, the SVG writer
through an XML parser, the training log's alignment/uniformity, and `common.py analyze` end to end
on a tiny BERT."""
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import scipy.integrate
import torch

import common
import simcse_min
from conftest import ROOT, tiny_config
from tiny_world import make_model, make_senteval, stsb_dev, tokenizer

SVG_NS = "{http://www.w3.org/2000/svg}"


def test_alignment_is_zero_for_identical_pairs_at_any_scale():
    x = torch.randn(20, 16)
    assert common.alignment(x, x) == 0.0
    # vectors are L2-normalised first
    assert common.alignment(x, 3 * x) == pytest.approx(0.0, abs=1e-12)


def test_alignment_known_values():
    e = torch.eye(4)
    assert common.alignment(e[:1], e[1:2]) == pytest.approx(2.0)  # orthogonal: |e1 - e2|^2 = 2
    assert common.alignment(e[:2], -e[:2]) == pytest.approx(4.0)  # opposite
    assert common.alignment(e[:2], torch.stack([e[1], -e[1]])) == pytest.approx((2.0 + 4.0) / 2)
    x, y = torch.randn(50, 8), torch.randn(50, 8)
    cos = torch.nn.functional.cosine_similarity(x.double(), y.double())
    # unit vectors: |u-v|^2 = 2-2cos
    assert common.alignment(x, y) == pytest.approx((2 - 2 * cos).mean().item())


def test_uniformity_known_values_and_distinct_pairs_only():
    e = torch.eye(3)
    # one pair at squared distance 2: log exp(-4)
    assert common.uniformity(e[:2]) == pytest.approx(-4.0)
    angles = torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3])
    # 3 unit vectors 120 degrees apart: |x-y|^2 = 3
    triangle = torch.stack([angles.cos(), angles.sin()], 1)
    assert common.uniformity(triangle) == pytest.approx(-6.0)
    # collapsed: the worst uniformity
    assert common.uniformity(torch.ones(5, 4)) == pytest.approx(0.0)


def sphere_uniformity(d):
    """log E exp(-2|x-y|^2) = log E exp(4t - 4) for x, y uniform on S^(d-1), t = x.y with density
    proportional to (1 - t^2)^((d-3)/2), by numerical integration."""
    weight = lambda t: (1 - t * t) ** ((d - 3) / 2)  # noqa: E731
    top = scipy.integrate.quad(lambda t: math.exp(4 * t - 4) * weight(t), -1, 1)[0]
    return math.log(top / scipy.integrate.quad(weight, -1, 1)[0])


@pytest.mark.parametrize("d", [3, 32])
def test_uniformity_of_points_spread_on_the_sphere_approaches_the_analytic_value(d):
    if d == 3:  # closed form: t ~ U[-1, 1] on S^2, so E exp(4t - 4) = exp(-4) sinh(4) / 4
        assert sphere_uniformity(3) == pytest.approx(-4 + math.log(math.sinh(4) / 4), abs=1e-9)
    torch.manual_seed(0)
    # Gaussian directions, any norms: uniform on the sphere
    x = torch.randn(2000, d) * torch.rand(2000, 1).add(0.5)
    assert common.uniformity(x) == pytest.approx(sphere_uniformity(d), abs=0.02)


def test_rank_k_matrix_has_k_nonzero_singular_values():
    torch.manual_seed(0)
    x = torch.randn(60, 3, dtype=torch.float64) @ torch.randn(3, 20, dtype=torch.float64)  # rank 3
    s = common.singular_values(x)
    assert s.shape == (20,) and s[0] == pytest.approx(1.0) and np.all(np.diff(s) <= 1e-12)
    assert np.all(s[:3] > 1e-3) and np.all(s[3:] < 1e-10)


def test_similarity_by_score_groups_against_numpy():
    gold = np.array([0.0, 0.5, 1.0, 1.9, 2.5, 3.99, 4.0, 4.5, 5.0, 5.0])
    sims = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    groups = common.similarity_by_score(sims, gold)
    assert [g["group"] for g in groups] == ["0-1", "1-2", "2-3", "3-4", "4-5"]
    # 1.0 opens 1-2, 4.0 opens 4-5, 5.0 closes 4-5
    assert [g["count"] for g in groups] == [2, 2, 1, 1, 4]
    last = sims[6:]
    assert groups[4]["mean"] == pytest.approx(last.mean())
    assert groups[4]["std"] == pytest.approx(last.std())
    assert groups[4]["median"] == pytest.approx(np.median(last))
    assert groups[4]["q25"] == pytest.approx(0.775)


def test_svg_writer_makes_well_formed_xml_with_the_expected_elements(tmp_path):
    fig = common.Plot(300, 200, (0.0, 1.0), (0.01, 1.0), ylog=True)
    fig.frame("a <title> & more", "x label", "y label")
    fig.polyline([(fig.px(0.1), fig.py(0.5)), (fig.px(0.9), fig.py(0.02))], "#123456")
    fig.circle(fig.px(0.5), fig.py(0.1), 4, "#abcdef", "#000")
    fig.legend([("model \"A\"", "#123456", "line"), ("B", "#abcdef", "point")])
    fig.save(tmp_path / "f.svg")
    root = ET.parse(tmp_path / "f.svg").getroot()
    assert root.tag == SVG_NS + "svg" and root.get("viewBox") == "0 0 820 300"
    texts = [t.text for t in root.iter(SVG_NS + "text")]
    assert {"a <title> & more", "x label", "y label", "model \"A\"", "B"} <= set(texts)
    # log y, linear x ticks
    assert {"0.01", "0.1", "1"} <= set(texts) and "0.0" in texts and "1.0" in texts
    assert len(list(root.iter(SVG_NS + "polyline"))) == 1 and len(list(root.iter(SVG_NS
                                                                                 + "circle"))) == 2
    assert fig.py(0.1) == pytest.approx(40 + 100)  # log scale: 0.1 halfway between 0.01 and 1


def test_dev_set_align_uniform_matches_analyze_model_on_dev(tmp_path):
    root, tok = make_senteval(tmp_path / "senteval", n=40), tokenizer()
    torch.manual_seed(0)
    model = common.Bert(common.BertConfig.tiny(vocab_size=len(tok.vocab))).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name.lower():  # LayerNorms stay 1 and 0
                # large random weights: [CLS] vectors that differ from sentence to sentence
                p.normal_(0, 0.5)
    dev = common.evaluate_dev(model, common.DevSet(tok, stsb_dev(root), model.cfg.max_tokens))
    expected = common.analyze_model(model, tok, root, "cls_before_pooler", "dev")
    assert expected["positive_pairs"] > 0 and expected["uniformity"] < -0.1
    want = (expected["alignment"], expected["uniformity"])
    assert (dev["align"], dev["uniform"]) == pytest.approx(want, abs=1e-5)


@pytest.fixture(scope="module")
def trained(tiny_world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("analysis")
    cfg = tiny_config(simcse_min, tiny_world, tmp / "run")
    return tiny_world, tmp / "run", simcse_min.train(cfg)


def test_training_logs_alignment_and_uniformity_at_every_evaluation(trained):
    _, run, results = trained
    assert [s for s, _, _ in results["align_uniform"]] == [s for s, _
                                                           in results["dev_history"]] == [0, 1, 2]
    assert (
        json.loads((run / "results.json").read_text())["align_uniform"] == results["align_uniform"]
    )
    assert results["align_uniform_on"] == "STS-B dev"
    assert " align " in (run / "log.txt").read_text()


def test_analyze_cli_end_to_end(trained, tmp_path, capsys):
    world, run, _ = trained
    other = make_model(tmp_path / "other", seed=1)
    common.cli(["analyze", "--model", world["model"], "--compare", str(run), str(other), "--runs",
                str(run / "results.json"), "--senteval", world["senteval"], "--out",
                str(tmp_path / "out"),
                "--device", "cpu"])
    out = tmp_path / "out"
    analysis = json.loads((out / "analysis.json").read_text())
    assert [m["name"] for m in analysis["models"]] == ["model", "run", "other"]
    # the run folder's own results.json is the one given: drawn once
    assert len(analysis["runs"]) == 1
    assert analysis["runs"][0]["color"] == analysis["models"][1]["color"]
    for m in analysis["models"]:
        assert set(m) >= {"test", "dev"} and len(m["test"]["similarity_by_score"]) == 5
    plane = ET.parse(out / "align_uniform.svg").getroot()
    assert len(list(plane.iter(SVG_NS + "polyline"))) == 1
    assert "simcse (run): steps 0→2" in [t.text for t in plane.iter(SVG_NS + "text")]
    assert len(list(ET.parse(out / "singular_values.svg").getroot().iter(SVG_NS + "polyline"))) == 3
    assert ET.parse(out / "similarity_by_score.svg").getroot().find(SVG_NS + "rect") is not None
    assert "uniform test" in capsys.readouterr().out


def test_analyze_bad_runs_file_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_text('{"method": "simcse"}')
    with pytest.raises(SystemExit) as e:
        common.main_guard(common.cli, ["analyze", "--model", str(make_model(tmp_path / "m")),
                                       "--runs", str(bad), "--senteval",
                                       str(make_senteval(tmp_path / "se")), "--out",
                                       str(tmp_path / "out")])
    assert e.value.code == 2 and "not a finished training run" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_analysis_output_is_ignored_by_git():
    assert "analysis/" in (ROOT / ".gitignore").read_text().split()
