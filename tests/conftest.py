"""Shared test fixtures: the real checkpoint and data in ../shared, found through environment
variables.

A test that needs them is skipped with a reason when they are not set, except in CI
(SIMCSE_REQUIRE_DATA=1), where a missing path is an error, so nothing is silently skipped there.
"""
import contextlib
import os
import sys
from pathlib import Path

import pytest

import shutil
import tempfile

os.environ["SIMCSE_CACHE"] = tempfile.mkdtemp(prefix="simcse-test-cache-")  # never the user's cache
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
FIXTURES = Path(__file__).resolve().parent / "fixtures"


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


@pytest.fixture(scope="session", autouse=True)
def no_temporary_folders_left(tmp_path_factory):
    """The suite leaves nothing in the temporary folder: its cache and pytest's own folders go at
    the end."""
    yield
    shutil.rmtree(os.environ["SIMCSE_CACHE"], ignore_errors=True)
    base = tmp_path_factory.getbasetemp()
    shutil.rmtree(base, ignore_errors=True)
    for link in base.parent.glob("pytest-*current"):
        link.unlink()
    with contextlib.suppress(OSError):
        base.parent.rmdir()  # pytest-of-<user>, once empty
