"""What the tests share, each once: the real checkpoint and data in ../shared, found through
environment variables; one tiny world, built once a session; the stand-in hub; and the helpers
every subject uses (a cosine, the command line in this process, its one-line error, a run's
Config on the tiny world).

A test that needs the real data is skipped with a reason when its variable is not set, except in
CI (SIMCSE_REQUIRE_DATA=1), where a missing path is an error, so nothing is silently skipped there.
"""
import atexit
import importlib
import os
import socket
import sys
import types
from pathlib import Path

import pytest

import shutil
import tempfile
import torch

# One temporary folder holds all a session writes: the cache (never the user's) and pytest's own
# folders (pytest_configure); it goes at exit. A pytest that a test starts (exercise.py check)
# makes its folder inside this one, so a child that is killed leaves nothing once the session ends.
_outer = Path(os.environ.get("SIMCSE_CACHE", "")).parent
TEMP = Path(tempfile.mkdtemp(prefix="simcse-tests-",
                             dir=_outer if _outer.name.startswith("simcse-tests-") else None))
atexit.register(shutil.rmtree, TEMP, True)
os.environ["SIMCSE_CACHE"] = str(TEMP / "cache")
(TEMP / "cache").mkdir()
if os.environ.get("PYTEST_XDIST_WORKER"):  # `-n auto`: the workers share the cores, one thread
    os.environ["OMP_NUM_THREADS"] = "1"  # each, the commands they start too [docs/testing.md]
    torch.set_num_threads(1)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.environ["SIMCSE_CACHE"],
                                                              "inductor"))
ROOT = Path(__file__).resolve().parent.parent
# absolute: the tests run in a temporary folder (away_from_the_checkout)
for _var in ("SIMCSE_TEST_MODEL", "SIMCSE_SENTEVAL", "SIMCSE_TEST_DATA"):
    if os.environ.get(_var):
        os.environ[_var] = os.path.abspath(os.environ[_var])
sys.path.insert(0, str(ROOT))
# scripts the tests also import (bad_inputs, make_generator)
sys.path.insert(1, str(ROOT / "tests" / "tools"))
# the benchmarks the tests check the arithmetic of (bench.py)
sys.path.insert(2, str(ROOT / "tests" / "tools" / "bench"))
FIXTURES = Path(__file__).resolve().parent / "fixtures"
import common  # noqa: E402  (after SIMCSE_CACHE is set: common reads it on import)
from tiny_world import make_world  # noqa: E402


def _shared_path(var):
    value = os.environ.get(var)
    if value and Path(value).exists():
        return Path(value)
    if os.environ.get("SIMCSE_REQUIRE_DATA") == "1":
        pytest.fail(f"{var} is not set to an existing path, and CI requires it")
    pytest.skip(f"{var} not set (point it at ../shared, as .ci/run does)")


def same_bytes(a, b):
    """a == b for file contents, without pytest's difflib explanation of two large byte strings on a
    failure (under CI=true pytest diffs them in full: minutes for a model file)."""
    return a == b


# --- the tiny world -------------------------------------------------------------------------------

def fingerprint(folder):
    """{path: (size, mode, mtime)} of everything under folder: any write, removal, new file or
    chmod changes it (a stat a file, no reading: cheap enough for every test)."""
    stats = {str(p.relative_to(folder)): p.lstat() for p in Path(folder).rglob("*")}
    return {path: (st.st_size, st.st_mode, st.st_mtime_ns) for path, st in stats.items()}


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory):
    """tiny_world.make_world, built once a session: a 2-layer BERT with BERT's pooler and MLM head
    (as bert-base-uncased and every released checkpoint [issue 57]), DiffCSE's generator, 48
    training sentences and a SentEval folder. Read-only: the mapping cannot be changed, and the
    files must end as they were built (a test that changes one works on a copy in its tmp_path)."""
    root = tmp_path_factory.mktemp("tiny-world")
    paths = make_world(root, pooler=True, mlm_head=True)
    built = fingerprint(root)
    yield types.MappingProxyType(paths)
    assert fingerprint(root) == built, "a test changed the shared tiny world's files"


@pytest.fixture
def world(tiny_world):
    """The tiny world's paths for one test (model, generator, data, senteval), a dict of its own;
    after the test, its files are checked: a test that changed one fails here, by name."""
    built = fingerprint(Path(tiny_world["data"]).parent)
    yield dict(tiny_world)
    assert fingerprint(Path(tiny_world["data"]).parent) == built, \
        "this test changed the shared tiny world's files: copy them to tmp_path first"


def tiny_config(method, world, out_dir, **kw):
    """METHOD's (a name or a module) Config on the tiny world: the CPU, batches of 8, 2 steps with a
    dev evaluation at each, DiffCSE's generator for DiffCSE alone; kw sets the rest."""
    module = importlib.import_module(f"{method}_min") if isinstance(method, str) else method
    paths = {k: v for k, v in world.items()
             if k != "generator" or module.__name__ == "diffcse_min"}
    return module.Config(**{"device": "cpu", "batch_size": 8, "max_steps": 2, "eval_every": 1,
                            "out_dir": str(out_dir), **paths, **kw})


# --- helpers --------------------------------------------------------------------------------------

def cos(a, b):
    """The cosine of two vectors as the papers write sim(a, b): the loss oracles' own."""
    return (a @ b) / (a.norm() * b.norm())


def cli(*argv):
    """`python common.py ARGV... --device cpu`, in this process as main_guard runs it: -> what the
    command returns (what it prints stays in capsys)."""
    return common.main_guard(common.cli, [*argv, "--device", "cpu"])


def cli_output(capsys, argv):
    """cli(*argv) -> what it printed on stdout."""
    cli(*argv)
    return capsys.readouterr().out


def nowhere():
    """http://127.0.0.1:PORT where nothing listens (a port just freed): a hub that is offline."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def one_line(capsys, argv, main=common.cli):
    """main(argv) as main_guard runs it (default: common.py's command line) must stop with exit
    status 2 and one stderr line, "error: ..." -> that line."""
    with pytest.raises(SystemExit) as e:
        common.main_guard(main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err.strip()


def help_text(capsys, entry, *argv):
    """entry(*argv) must print its --help and exit 0 -> the help."""
    with pytest.raises(SystemExit) as e:
        entry(*argv)
    assert e.value.code == 0
    return capsys.readouterr().out


# --- the stand-in hub -----------------------------------------------------------------------------

LARGE = "org/model/model.safetensors"  # the download tests' one large file


def one_file_hub(blob, small=None, **modes):
    """The stand-in hub holding org/model's model.safetensors = blob as a large (LFS) file, and the
    small files {path: bytes} given: the download tests' repository (modes: StandInHub's)."""
    from stand_in_hub import StandInHub
    return StandInHub({LARGE: blob, **(small or {})}, lfs={LARGE}, **modes)


def url(hub, file="model.safetensors"):
    """org/model's FILE on the stand-in hub, as common.download asks for it."""
    return f"{hub.url}/org/model/resolve/main/{file}"


# --- the real checkpoint and data -----------------------------------------------------------------

@pytest.fixture(scope="session")
def model_dir():
    return _shared_path("SIMCSE_TEST_MODEL")


@pytest.fixture(scope="session")
def senteval_dir():
    root = _shared_path("SIMCSE_SENTEVAL")
    return root / "downstream" if (root / "downstream").is_dir() else root


@pytest.fixture(scope="session")
def wiki_path():
    return _shared_path("SIMCSE_TEST_DATA")


@pytest.fixture(scope="session")
def minilm(model_dir):
    import common
    return (
        common.Tokenizer.from_pretrained(model_dir),
        common.Bert.from_pretrained(model_dir).eval(),
    )


@pytest.fixture(scope="session")
def recorded_hub_files(tmp_path_factory):
    """Every recorded repository's files, cut small (stand_in_hub.hub_files): built once."""
    from stand_in_hub import hub_files
    return hub_files(tmp_path_factory.mktemp("hub-files"))


@pytest.fixture
def hub(recorded_hub_files, tmp_path, monkeypatch):
    """The stand-in hub serving the recorded repositories; common pointed at it, with an empty cache
    of its own and an empty Hugging Face cache."""
    import common
    from fixtures.hub_facts import HUB_CACHE_ENV
    from stand_in_hub import StandInHub
    with StandInHub(recorded_hub_files) as h:
        monkeypatch.setattr(common, "HF_ENDPOINT", h.url)
        monkeypatch.setattr(common, "CACHE", tmp_path / "cache")
        for var in HUB_CACHE_ENV:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
        yield h


@pytest.fixture(autouse=True)
def unused_tensors_noted_anew():
    """common.note_unused says a checkpoint's unused tensors once a process; each test is its own
    command, so each test sees the note as a user's run does, whatever ran before it."""
    common.note_unused.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def away_from_the_checkout(tmp_path_factory):
    """The suite runs in an empty temporary folder, so that a default --out_dir (runs/METHOD) lands
    there, never in the checkout's runs/, where the user's own run may be going [issue 55]; the
    cache is SIMCSE_CACHE's temporary folder (above), never ~/.cache/simcse-min. Session-wide:
    module fixtures run before any test's own (test_ddp.py's two processes build a Run)."""
    before = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(before)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """pytest's folders (tmp_path) inside TEMP, not /tmp/pytest-of-<user>; pytest-xdist gives its
    workers theirs inside the one set here."""
    if config.option.basetemp is None:
        config.option.basetemp = str(TEMP / "pytest")
