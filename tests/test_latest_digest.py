"""LATEST.json pins the verified release by its manifest's sha256: a folder
re-published after deploy/publish.py verified it (``--overwrite``, a
rewritten ``_manifest.json``) is refused by ``load_latest``, not read as the
verified release."""

from __future__ import annotations

import hashlib
import math
import json
import shutil

import numpy as np
import pytest

import dpsynth
from dpsynth.deploy import publish
from dpsynth.pipelines.release import reading, release
from tests.test_deploy_scripts import _fake_release

RUN = "nightly-2026-01-01"


@pytest.fixture
def published(tmp_path):
    """(output root, release folder) after publish verified the release."""
    root = tmp_path / "releases"
    out = root / "2026-01-01"
    _fake_release(out, RUN)
    assert publish.main(["--output", str(out), "--run-id", RUN,
                         "--output-root", str(root)]) == 0
    return root, out


def _sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_publish_records_the_verified_manifest_digest(published, capsys):
    root, out = published
    latest = json.loads((root / "LATEST.json").read_text())
    assert latest["release"] == str(out)
    assert latest["manifest_sha256"] == _sha256(out / "_manifest.json")
    assert publish.main(["--output", str(out), "--run-id", RUN,
                         "--output-root", str(root)]) == 0  # the summary too
    assert json.loads(capsys.readouterr().out)["manifest_sha256"] == \
        latest["manifest_sha256"]


def test_load_latest_reads_the_verified_release(published):
    root, _ = published
    x, y, manifest = reading.load_latest(str(root))
    assert manifest["run_id"] == RUN and len(x) == len(y) == 0
    x, y = dpsynth.load_latest(str(root), as_="numpy")  # load_release kwargs
    assert x.dtype == np.float32 and len(y) == 0
    assert "load_latest" in dir(dpsynth)


def test_a_folder_republished_since_is_refused_in_one_line(published,
                                                           tmp_path):
    root, out = published
    other = tmp_path / "other"  # another run's release, as --overwrite
    _fake_release(other, "someone-else")  # would place it in the folder
    shutil.rmtree(out)
    shutil.copytree(other, out)
    # The path alone now names the other run's release ...
    assert reading.load_release(str(out))[2]["run_id"] == "someone-else"
    # ... which the pinned reader refuses.
    with pytest.raises(release.ReleaseChanged) as e:
        reading.load_latest(str(root))
    assert str(e.value).startswith(f"{out}: ")
    assert "not the one pinned" in str(e.value) and "\n" not in str(e.value)


def test_load_release_refuses_a_wrong_digest(published):
    root, out = published
    with pytest.raises(release.ReleaseChanged, match="not the one pinned"):
        reading.load_release(str(out), manifest_sha256="0" * 64)
    # The right one reads (the same bytes are hashed and parsed).
    pinned = reading.load_release(
        str(out), manifest_sha256=_sha256(out / "_manifest.json"))
    assert pinned[2]["run_id"] == RUN


def test_latest_without_a_digest_is_refused_not_read_unpinned(published):
    root, out = published
    (root / "LATEST.json").write_text(json.dumps({"release": str(out)}))
    with pytest.raises(release.ReleaseError, match="no release with its "
                       "manifest_sha256"):
        reading.load_latest(str(root))


def test_publish_refuses_a_manifest_rewritten_while_it_reads(
        published, monkeypatch, capsys):
    """The digest LATEST.json records is of the manifest publish verified:
    one that changes between its digest and its parse is refused."""
    root, out = published
    (root / "LATEST.json").unlink()
    monkeypatch.setattr(release, "manifest_digest", lambda folder: "0" * 64)
    assert publish.main(["--output", str(out), "--run-id", RUN,
                         "--output-root", str(root)]) == 1
    assert "not the one pinned" in capsys.readouterr().err
    assert not (root / "LATEST.json").exists()


def test_latest_edited_to_name_a_non_private_release_is_refused(
        published, tmp_path, monkeypatch):
    """Issue 58 item 7: publish never points LATEST at an --epsilon inf
    release; a LATEST.json edited by hand to name one (with its correct
    digest) is refused in one line, before any of its rows are read."""
    root, _ = published
    debug = tmp_path / "debug-release"
    _fake_release(debug, "debug-inf")
    manifest = json.loads((debug / "_manifest.json").read_text())
    manifest.update(private=False, privacy={"spent": {"epsilon": math.inf}})
    (debug / "_manifest.json").write_text(json.dumps(manifest))
    assert publish.main(["--output", str(debug), "--run-id", "debug-inf",
                         "--output-root", str(root)]) == 1  # never by publish
    assert json.loads((root / "LATEST.json").read_text())["run_id"] == RUN
    (root / "LATEST.json").write_text(json.dumps({
        "release": str(debug), "run_id": "debug-inf",
        "manifest_sha256": _sha256(debug / "_manifest.json")}))
    reads = []
    monkeypatch.setattr(reading, "_all_blocks",
                        lambda *a, **k: reads.append(a) or ([], []))
    with pytest.raises(release.ReleaseError) as err:
        reading.load_latest(str(root))
    assert type(err.value) is release.ReleaseError
    assert "NOT PRIVATE" in str(err.value) and "\n" not in str(err.value)
    assert str(debug) in str(err.value)
    assert reads == []  # refused before reading a row
    # A manifest with no private flag at all is refused the same way.
    del manifest["private"]
    (debug / "_manifest.json").write_text(json.dumps(manifest))
    (root / "LATEST.json").write_text(json.dumps({
        "release": str(debug), "run_id": "debug-inf",
        "manifest_sha256": _sha256(debug / "_manifest.json")}))
    with pytest.raises(release.ReleaseError, match="NOT PRIVATE"):
        reading.load_latest(str(root))
    assert reads == []
