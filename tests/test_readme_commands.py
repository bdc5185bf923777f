"""The first run on a fresh machine: an empty home (no ~/.cache, no Hugging Face cache, no
SIMCSE_CACHE), the project's files in an empty folder as a clone leaves them, and HF_ENDPOINT
pointing at the stand-in hub, which serves what the real hub holds (fixtures/hub_facts.py, files cut
small). The README's commands run as written, in subprocesses: the quick start, the four mission
commands, `download senteval` and `eval` of a known name. Afterwards the cache holds complete files
only, each equal to what the hub served."""
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import ROOT
from fixtures import hub_facts as facts
from stand_in_hub import StandInHub

LEFT_OUT = ("SIMCSE_CACHE", "TORCHINDUCTOR_CACHE_DIR", "HF_ENDPOINT", *facts.HUB_CACHE_ENV)
# appended to the GPU commands: argparse keeps the last
FAST = " --device cpu --max_steps 2 --eval_every 1"


def readme_blocks(section):
    """The ```bash blocks of a README section, each a list of commands (continued lines joined)."""
    text = (ROOT / "README.md").read_text().split(f"## {section}")[1].split("\n## ")[0]
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    return [[c.strip() for c in b.replace("\\\n", " ").splitlines() if c.strip()] for b in blocks]


QUICK_START, MISSION = readme_blocks("Quick start")[0], readme_blocks("On a GPU")[0]


@pytest.fixture(scope="module")
def machine(recorded_hub_files, tmp_path_factory):
    """(run, home, hub): run(command) runs one shell line in the clone, as a user would type it."""
    home, clone, bin_dir = (tmp_path_factory.mktemp(n) for n in ("home", "clone", "bin"))
    for f in ROOT.glob("*.py"):
        shutil.copy(f, clone)
    # this interpreter, its venv
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in LEFT_OUT and not k.startswith("SIMCSE_")}
    env |= {"HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
            "PYTHONDONTWRITEBYTECODE": "1"}
    with StandInHub(recorded_hub_files) as hub:
        env["HF_ENDPOINT"] = hub.url

        def run(command, status=0):
            done = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True,
                                  text=True,
                                  timeout=300)
            assert (
                done.returncode == status
            ), f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            assert "Traceback" not in done.stderr, done.stderr[-3000:]
            return done.stdout + done.stderr
        yield run, home, hub, clone


def assert_cache_complete(home, hub):
    """Nothing in ~/.cache but complete files: no .part, no half-unpacked folder; each download
    equal to what the hub served; each unpacked SentEval file equal to its member of
    senteval.tar."""
    cache = home / ".cache" / "simcse-min"
    left = [p for p in home.rglob("*") if p.name.endswith(".part")
            or p.name.startswith(".unpacking")]
    assert not left, left
    assert {p.name for p in home.iterdir()} <= {".cache"}, list(home.iterdir())
    for p in (cache / "models").rglob("*") if (cache / "models").exists() else ():
        if p.is_file():
            name = p.relative_to(cache / "models").parent.as_posix()
            repo = facts.RENAMED.get(name, name)
            assert p.read_bytes() == hub.files[f"{repo}/{p.name}"], p
    for p in (cache / "data").iterdir() if (cache / "data").exists() else ():
        assert (
            p.read_bytes() == hub.files[f"datasets/princeton-nlp/datasets-for-simcse/{p.name}"]
        ), p
    root = cache / "senteval" / "downstream"
    if root.exists():
        with tarfile.open(fileobj=io.BytesIO(hub.files["datasets/princeton-nlp/datasets-for-simcse/"
                                                       "senteval.tar"])) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
        for p in root.rglob("*"):
            assert p.is_dir() or p.read_bytes() == members[p.relative_to(root).as_posix()], p


def test_the_readme_shows_the_commands_this_test_runs():
    assert QUICK_START[0] == "python common.py download wiki1m_for_simcse.txt"
    assert len(QUICK_START) == 4
    assert [c.split()[1] for c in MISSION] == ["simcse_min.py", "esimcse_min.py", "simcsepp_min.py",
                                               "diffcse_min.py"]
    assert all(c.endswith("--data wiki1m.txt --device cuda") for c in MISSION)


def test_the_quick_start_as_written(machine):
    run, home, hub, clone = machine
    outputs = [run(command) for command in QUICK_START]
    assert "wiki1m_for_simcse.txt" in outputs[0]
    assert (clone / "wiki1m_head.txt").read_bytes() == hub.files[
        "datasets/princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"
    ]  # shorter than 11,914
    assert "downloading SimCSE's senteval.tar" in outputs[2]
    table = r"^ +STS12 \|.*\| +Avg\n( +-?\d+\.\d\d \|){7} +-?\d+\.\d\d$"
    assert re.search(table, outputs[2], re.M), outputs[2]  # the run's: STS12 ... SICK-R, Avg
    found = outputs[3].splitlines()  # the trained model's search: a query, its ten nearest lines
    assert found[0] == "query: A man is playing a guitar." and len(found) == 11, outputs[3]
    assert all(re.match(r" +\d+ +-?\d\.\d{4}  line \d+: ", line) for line in found[1:]), found
    assert (clone / "runs" / "simcse" / "results.json").is_file()
    shutil.rmtree(clone / "runs")  # the mission commands write there too
    assert_cache_complete(home, hub)


@pytest.mark.parametrize("command", MISSION, ids=[c.split()[1] for c in MISSION])
def test_each_mission_command_runs_to_a_test_table(command, machine):
    """The defaults: --model bert-base-uncased (a renamed repository on the hub), --data wiki1m.txt,
    no
    --senteval, DiffCSE's --generator distilbert-base-uncased; only the device and the length are
    changed."""
    run, home, hub, clone = machine
    out = run(command + FAST)
    assert "STS12" in out and "Avg" in out and "best stsb_dev" in out
    method = command.split()[1].removesuffix("_min.py")
    assert (clone / "runs" / method / "model.safetensors").is_file()
    shutil.rmtree(clone / "runs" / method)
    models = home / ".cache" / "simcse-min" / "models"
    assert (models / "bert-base-uncased" / "model.safetensors").is_file()
    assert (
        method != "diffcse" or (models / "distilbert-base-uncased" / "model.safetensors").is_file()
    )
    assert_cache_complete(home, hub)


def test_download_senteval_and_eval_of_a_known_name(machine):
    run, home, hub, clone = machine
    out = run("python common.py download senteval")
    root = home / ".cache" / "simcse-min" / "senteval" / "downstream"
    assert str(root) in out and (root / "STS" / "STSBenchmark" / "sts-test.csv").is_file()
    # the transfer tasks' folders are unpacked too
    assert (root / "TREC" / "train_5500.label").is_file()
    out = run("python common.py eval --model bert-base-uncased --device cpu")
    assert "STS-B" in out and "Avg" in out
    assert_cache_complete(home, hub)


def test_simcse_cache_that_is_a_file_is_one_line_at_the_command_line(machine, tmp_path):
    run, home, hub, clone = machine
    (tmp_path / "cache-file").write_text("")
    out = run(f"SIMCSE_CACHE={tmp_path / 'cache-file'} python common.py download bert-base-uncased",
              status=2)
    assert out.count("\n") == 1 and out.startswith("error: ") and "SIMCSE_CACHE" in out, out
