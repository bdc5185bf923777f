"""The one rule of outputs [issue 63]: nothing is written or deleted through a link (a saved model's
1_Pooling and 2_Dense included); --overwrite removes only the run's own files, after every check;
a command's outputs never collide; only the temporaries a command made itself are cleaned up."""
import importlib

import pytest

import common
from tiny_world import make_world


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    world = make_world(tmp_path_factory.mktemp("output-rule"))
    return {k: world[k] for k in ("model", "data", "senteval")}


def train(world, out, **kw):
    module = importlib.import_module("simcse_min")
    return module.train(module.Config(**world, device="cpu", batch_size=8, max_steps=1,
                                      eval_every=1, test="none", out_dir=str(out), **kw))


def files(folder):
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("name", ["1_Pooling", "2_Dense"])
def test_a_saved_models_folder_that_is_a_link_is_refused_before_any_work(world, tmp_path, name,
                                                                         overwrite):
    """The run wrote its config.json through the link, outside --out_dir (exit 0); --overwrite
    deleted the files there, even in an unsupervised run that never writes 2_Dense."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "config.json").write_text("somebody's\n")
    (elsewhere / "model.safetensors").write_text("somebody's\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / name).symlink_to(elsewhere)
    with pytest.raises(common.UserError, match=f"{name} is a link"):
        train(world, out, overwrite=overwrite)
    assert files(elsewhere) == {elsewhere / n: b"somebody's\n"
                                for n in ("config.json", "model.safetensors")}
    assert sorted(p.name for p in out.iterdir()) == [name]


def test_a_dangling_link_loses_no_run(world, tmp_path):
    """A dangling 2_Dense: FileExistsError at the save, after --overwrite had removed the old run's
    model and results.json."""
    out = tmp_path / "out"
    train(world, out)
    before = files(out)
    (out / "2_Dense").symlink_to(tmp_path / "nowhere")
    with pytest.raises(common.UserError, match="2_Dense is a link"):
        train(world, out, overwrite=True)
    assert files(out) == before


def test_only_the_runs_own_temporaries_are_cleaned_up(world, tmp_path):
    """Any name like .X.abcdefgh.tmp was deleted, a user's .notes.20261128.tmp too; a folder of
    that shape was an IsADirectoryError traceback."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".notes.20261128.tmp").write_text("a user's notes\n")
    (out / ".results.json.abcd1234.tmp").mkdir()  # a folder, never a killed write's file
    (out / ".log.txt.0a1b2c3d.tmp").write_text("a killed write")  # ours: cleared
    train(world, out, overwrite=True)
    assert (out / ".notes.20261128.tmp").read_text() == "a user's notes\n"
    assert (out / ".results.json.abcd1234.tmp").is_dir()
    assert not (out / ".log.txt.0a1b2c3d.tmp").exists()


def test_a_users_file_named_like_a_temporary_is_not_a_runs(world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".notes.20261128.tmp").write_text("a user's notes\n")
    with pytest.raises(common.UserError, match="not a run's"):
        train(world, out)
    assert (out / ".notes.20261128.tmp").read_text() == "a user's notes\n"


def test_encode_cleans_up_only_its_own_temporaries(world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".vec.backup.tmp").write_text("a user's backup\n")
    (out / ".vec.npy.0a1b2c3d.tmp").write_bytes(b"a killed encode's")  # ours: cleared
    (tmp_path / "in.txt").write_text("a man .\na dog .\n")
    common.main_guard(common.cli, ["encode", "--model", world["model"], "--input",
                                   str(tmp_path / "in.txt"), "--out", str(out / "vec.npy"),
                                   "--device", "cpu"])
    assert (out / ".vec.backup.tmp").read_text() == "a user's backup\n"
    assert sorted(p.name for p in out.iterdir()) == [".vec.backup.tmp", "vec.json", "vec.npy"]


@pytest.mark.parametrize("name", ["x.json", "x.JSON"])
def test_encodes_two_outputs_never_share_a_name(world, tmp_path, name, capsys):
    """x.JSON and its JSON x.json are one file where names ignore case (macOS, Windows)."""
    (tmp_path / "in.txt").write_text("a man .\na dog .\n")
    with pytest.raises(SystemExit):
        common.main_guard(common.cli, ["encode", "--model", world["model"], "--input",
                                       str(tmp_path / "in.txt"), "--out", str(tmp_path / name),
                                       "--device", "cpu"])
    assert "--out" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_temporary_is_a_name_of_the_command_with_its_random_part(tmp_path, monkeypatch):
    for name in (".log.txt.0a1b2c3d.tmp", ".notes.20261128.tmp", ".log.txt.backup00.tmp",
                 ".log.txt.0a1b2c3d.tmp.x", "log.txt.0a1b2c3d.tmp", ".results.json.0a1b2c3d.tmp"):
        (tmp_path / name).write_text("")
    assert common.temporaries([tmp_path / "log.txt"]) == [tmp_path / ".log.txt.0a1b2c3d.tmp"]
    monkeypatch.delattr(common.os, "O_TMPFILE")  # not Linux: atomic_write names its file
    with common.atomic_write(tmp_path / "log.txt") as f:
        f.write("a line\n")
        named = set(common.temporaries([tmp_path / "log.txt"]))
        assert len(named - {tmp_path / ".log.txt.0a1b2c3d.tmp"}) == 1
    assert (tmp_path / "log.txt").read_text() == "a line\n"
    assert [p.name for p in named if p.exists()] == [".log.txt.0a1b2c3d.tmp"]
