"""Who can open a release (issue 72): every released file, the manifest and
LATEST.json included, gets the shards' mode (0666 less the umask), so
another account reads it with ``load_release`` or a plain open."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from dpsynth.deploy import publish
from dpsynth.pipelines import cli
from dpsynth.pipelines.release import reading

RUN = "access-1"
NOBODY = 65534


@pytest.fixture(scope="module")
def published():
    """(output root, release) under a folder others may enter (the suite's
    TMPDIR is mkdtemp's 0700), written under umask 022."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="dpsynth-access-"))
    base.chmod(0o755)
    old = os.umask(0o022)
    try:
        root = base / "releases"
        out = root / "r1"
        assert cli.main(["generate", "--output", str(out), "--output-format",
                         "parquet", "--run-id", RUN]) == 0
        assert publish.main(["--output", str(out), "--run-id", RUN,
                             "--output-root", str(root)]) == 0
        yield root, out
    finally:
        os.umask(old)
        shutil.rmtree(base, ignore_errors=True)


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode)
            for p in root.rglob("*") if p.is_file()}


def test_every_released_file_has_the_shards_mode(published):
    root, out = published
    modes = _files(root)
    assert modes["LATEST.json"] == 0o644
    assert modes["r1/_manifest.json"] == 0o644
    shards = [n for n in modes if n.endswith(".parquet")]
    assert shards and all(modes[n] == 0o644 for n in shards)
    assert set(modes.values()) == {0o644}, modes


def _as_nobody(read) -> str:
    """Runs ``read()`` in a forked child as uid/gid 65534; returns '' or
    the child's error. A fork, not a new interpreter: this one lives under
    /root, which nobody may not enter."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            # the other account's own temporary folder, not the suite's
            # private one (a reader may copy what it checks there)
            os.environ["TMPDIR"] = tempfile.mkdtemp(dir="/tmp")
            tempfile.tempdir = None
            read()
            code = 0
        except BaseException as e:  # noqa: BLE001 (reported to the parent)
            os.write(wfd, f"{type(e).__name__}: {e}".encode()[:4000])
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        error = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == (1 if error else 0), error
    return error


@pytest.mark.skipif(os.geteuid() != 0,
                    reason="switching to another account needs root")
def test_another_account_reads_the_release(published):
    root, out = published
    x, y, _ = reading.load_release(str(out))  # imports what the child uses
    assert len(y)

    def read() -> None:
        got = reading.load_release(str(out))
        assert len(got[1]) == len(y)
        reading.load_latest(str(root))
        for p in root.rglob("*"):  # the README's recipe: plain file reads
            if p.is_file():
                p.read_bytes()

    assert _as_nobody(read) == ""
