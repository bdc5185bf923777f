"""SimCSE's senteval.tar from the stand-in hub: the recorded layout (members at the top) unpacks
every task we read; a re-packed tar (under downstream/) works too; members that would escape are
refused. The oracle: the recorded senteval.tar layout (fixtures/hub_facts.py)."""
import io
import os
import tarfile

import pytest

import common
from fixtures import hub_facts as facts
from test_download import TAR


# --- senteval.tar ---------------------------------------------------------------------------------

def test_the_recorded_senteval_tar_unpacks_every_task_we_read(hub):
    """Members at the top (STS/..., CR/...), as the real tar holds them: the STS table's and the
    transfer tasks' folders land under downstream/, SNLI is left out, no temporary folder stays."""
    root = common.download_senteval()
    assert root == common.CACHE / "senteval" / "downstream"
    common.check_senteval(root, "test"), common.check_senteval(root, "dev")
    common.check_senteval(root, "transfer")  # every file the transfer tasks read [issue 29]
    wanted = [m for m in facts.SENTEVAL_MEMBERS if not m.endswith("/") and m.split("/")[0]
              in common.SENTEVAL_TASKS]
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file()) == sorted(wanted)
    assert sorted(p.name for p in root.parent.iterdir()) == ["downstream"]
    assert common.load_sts(root, "test")["STS12"]


def tar_of(members):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            else:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data or b""))
    return out.getvalue()


def repacked(prefix, hub):
    """The recorded members' contents (as the stand-in serves them), re-packed under prefix."""
    with tarfile.open(fileobj=io.BytesIO(hub.files[TAR])) as tar:
        return [(prefix + m.name, tar.extractfile(m).read()) for m in tar if m.isfile()]


@pytest.mark.parametrize("prefix", ["downstream/", "SentEval/data/downstream/", "./"])
def test_a_repacked_senteval_tar_works_too(prefix, hub):
    members = repacked(prefix, hub)
    hub.files[TAR] = tar_of(members)
    root = common.download_senteval()
    common.check_senteval(root, "test")
    assert (root / "CR" / "custrev.pos").is_file() and not (root / "SNLI").exists()


@pytest.mark.parametrize("hostile", ["../escaped.txt", "/tmp/escaped.txt", "STS/../../escaped.txt",
                                     "STS/link"], ids=["dotdot", "absolute", "inner-dotdot",
                                                       "symlink"])
def test_members_that_would_escape_are_refused(hostile, hub, tmp_path):
    members = repacked("", hub) + [(hostile, None if hostile.endswith("link") else b"x")]
    hub.files[TAR] = tar_of(members)
    with pytest.raises(common.UserError, match="refusing this archive"):
        common.download_senteval()
    assert not (common.CACHE / "senteval" / "downstream").exists()
    assert list((common.CACHE / "senteval").iterdir()) == []  # no half-unpacked folder
    assert not (tmp_path / "escaped.txt").exists() and not os.path.exists("/tmp/escaped.txt")


def test_a_tar_without_sts_is_one_line(hub):
    hub.files[TAR] = tar_of([("README", b"x")])
    with pytest.raises(common.UserError, match="holds no STS/ folder"):
        common.download_senteval()

