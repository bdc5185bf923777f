"""The released models by name [issue 53]: princeton-nlp's eight SimCSE models and voidism's four
DiffCSE models, fetched from the stand-in hub (stand_in_hub.py) through the hub code every known
name uses; what each repository holds is recorded with its source in fixtures/hub_facts.py. Each
gets its own test vector as eval's default (SimCSE's tool.py: sup -> cls, unsup ->
cls_before_pooler; DiffCSE: cls_before_pooler), and DiffCSE's file, its whole training model, loads
its encoder and says in one line what it leaves."""
import json

import pytest

import common
from fixtures import hub_facts as facts
from tiny_world import make_senteval

RELEASED = facts.SIMCSE_RELEASED + facts.DIFFCSE_RELEASED


def test_the_twelve_names_are_the_recorded_ones():
    assert len(facts.SIMCSE_RELEASED) == 8 and len(facts.DIFFCSE_RELEASED) == 4
    assert sorted(common.RELEASED) == sorted(RELEASED)
    for name in RELEASED:  # each file one the repository holds, the weights in LFS
        held = [f.removesuffix(":L") for f in facts.MODEL_FILES[name]]
        assert common.KNOWN_MODELS[name] == [f for f in held if f != "pytorch_model.bin"] + [
            "pytorch_model.bin"], name
        assert "pytorch_model.bin:L" in facts.MODEL_FILES[name]
    assert all("model.safetensors" not in common.KNOWN_MODELS[n] for n in RELEASED)


@pytest.mark.parametrize("name", RELEASED)
def test_each_name_resolves_on_the_hub_with_its_test_vector(name, hub, capsys):
    model = common.Bert.from_pretrained(name)
    tok = common.Tokenizer.from_pretrained(name)
    asked = [(m, host, p.rsplit("/", 1)[1]) for m, host, p, _ in hub.requests if host == "hub"]
    assert asked == [(m, "hub", f) for f in common.KNOWN_MODELS[name] for m in ("HEAD", "GET")
                     if m == "HEAD" or f != "pytorch_model.bin"]  # the weights: from the CDN
    assert [p for m, host, p, _ in hub.requests if host == "cdn"] != []
    assert model.cfg.model_type == ("roberta" if "roberta" in name else "bert")
    assert len(tok.vocab) == model.cfg.vocab_size or "roberta" in name
    simcse = name.startswith("princeton-nlp/")
    assert (model.pooler is not None) == simcse  # SimCSE's MLP as BERT's pooler; DiffCSE: none
    assert common.default_pooler(name) == ("cls" if "/sup-" in name else "cls_before_pooler")
    unused = [x for x in capsys.readouterr().err.splitlines() if "not used" in x]
    assert len(unused) == (0 if simcse else 1), unused  # SimCSE's file: the model alone


@pytest.mark.parametrize("name", facts.DIFFCSE_RELEASED[::3])
def test_diffcse_says_in_one_line_what_it_leaves(name, hub, capsys):
    common.Bert.from_pretrained(name)
    line, = [x for x in capsys.readouterr().err.splitlines() if "not used" in x]
    for part in ("discriminator.* (", "generator.* (", "mlp.* (10 tensors)",
                 "electra_head.* (2 tensors)", "lm_head.* (5 tensors)"):
        assert part in line, line
    assert "encoder.layer" not in line and "training model" in line, line
    tensors = common.read_tensors(common.CACHE / "models" / name)
    kind = "roberta" if "roberta" in name else "bert"
    prefixes = {k.split(".")[0] for k in tensors}
    assert prefixes == {kind, *(p.split(".")[0] for p in facts.DIFFCSE_PARTS)}


def test_eval_uses_the_releases_own_pooler_unless_told(hub, tmp_path, capsys):
    """eval of a supervised release uses its pooler (cls) unless --pooler says otherwise; cls on a
    DiffCSE release, which has none, is one line."""
    root = make_senteval(tmp_path / "senteval")
    name = "princeton-nlp/sup-simcse-bert-base-uncased"
    tables = {}
    for pooler in ("", "cls", "cls_before_pooler"):
        out = tmp_path / f"{pooler or 'default'}.json"
        common.cli(["eval", "--model", name, "--senteval", str(root), "--device", "cpu",
                    *(["--pooler", pooler] if pooler else []), "--json", str(out)])
        tables[pooler] = json.loads(out.read_text())["Avg"]
    assert tables[""] == tables["cls"] != tables["cls_before_pooler"], tables
    with pytest.raises(common.UserError, match="pooler"):
        common.cli(["eval", "--model", facts.DIFFCSE_RELEASED[0], "--senteval", str(root),
                    "--device", "cpu", "--pooler", "cls"])


def test_analyze_gives_each_model_its_own_pooler(hub, tmp_path):
    """analyze --model unsup --compare sup: each release's own test vector, as eval's, not the
    first model's for all (before: cls_before_pooler for both, or cls for both swapped)."""
    root = make_senteval(tmp_path / "senteval")
    sup, unsup = facts.SIMCSE_RELEASED[4], facts.SIMCSE_RELEASED[0]
    assert (common.RELEASED[sup], common.RELEASED[unsup]) == ("cls", "cls_before_pooler")
    for names in ([unsup, sup], [sup, unsup]):
        out = tmp_path / "-".join(n.split("/")[1] for n in names)
        common.cli(["analyze", "--model", names[0], "--compare", names[1], "--senteval", str(root),
                    "--device", "cpu", "--out", str(out)])
        models = json.loads((out / "analysis.json").read_text())["models"]
        assert [m["pooler"] for m in models] == [common.RELEASED[n] for n in names]
    cls = tmp_path / "cls"
    common.cli(["analyze", "--model", unsup, "--compare", sup, "--senteval", str(root),
                "--device", "cpu", "--out", str(cls), "--pooler", "cls_before_pooler"])
    told = json.loads((cls / "analysis.json").read_text())["models"]
    assert [m["pooler"] for m in told] == ["cls_before_pooler"] * 2  # --pooler: every model's
    assert told[1]["test"]["stsb_spearman"] != models[0]["test"]["stsb_spearman"]
