"""An independent attack review of the release-integrity work (issue 50
items 1-6, issue 54): each attack an attacker or a careless operator could
try, locally and on the GCS emulator. The first ones failed on the code
they review (the hole is fixed); the others held and stay as regression
tests.

Fixed holes:
- the staged manifest rewritten after the budget store recorded its digest
  (while the launch publishes) was the one published: publish now reads
  the manifest once and publishes it only if it still has the recorded
  digest;
- a published manifest stripped of its ``files`` block (plus a changed
  shard) was pointed at by ``deploy/publish.py``'s LATEST.json and read by
  ``load_release`` without a word: LATEST.json now refuses it,
  ``load_release`` warns;
- a ``files`` entry that is not a size and sha256 ended in an
  ``AttributeError`` traceback: now ``ReleaseChanged``;
- a local staging folder published to a gs:// output (API) created a local
  folder named "gs:": refused;
- the printed ``pandas.read_parquet(<output>)`` hint also read a killed
  launch's version folder beside the release (an ``--epsilon inf`` test
  run's exact rows): the hint names the version folder's data;
- a staged release of another run naming the published version folder was
  placed over the live files and broke the published release: refused;
- a broken manifest at --output (truncated, not a JSON object): an error
  without the file's name, or a traceback: one line naming it;
- a link to a folder added to a published release was not seen by the
  check (a broken link: a traceback): both are files it does not list;
- LATEST.json pointed at a release of the nightly run id made with
  ``--epsilon inf`` or ``--noise-seed`` (not private): refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest

from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines.release import publisher, reading, release

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)
from test_release_integrity import (_data, _delete_shard, _generate,  # noqa: E402
                                    _one_line_error, _put, _slow_place,
                                    _staged)


def _locations(tmp_path, gcs_or_none):
    if gcs_or_none is None:
        return str(tmp_path / "out"), str(tmp_path / "budgets")
    return gcs_or_none.uri("rel", "out"), gcs_or_none.uri("budgets")


# ------------------ fixed: the manifest swapped after its digest is recorded

def _manifest_swapped_after_commit(monkeypatch, tmp_path, capsys, out, store):
    """The attacker rewrites the staged manifest right after the store
    recorded its digest (before the files are placed)."""
    real = bs.commit_staged

    def commit_then_rewrite(reservation, folder, digest):
        real(reservation, folder, digest)
        manifest = release.staged_manifest(folder)
        manifest["note"] = "rewritten after it was recorded"
        publisher.write_manifest(folder, manifest)
    monkeypatch.setattr(bs, "commit_staged", commit_then_rewrite)
    capsys.readouterr()
    rc = _generate(_data(tmp_path), out, "--run-id", "nightly",
                   "--budget-store", store, "--dataset-id", "d",
                   "--lifetime-epsilon", "10")
    err = _one_line_error(capsys)
    assert rc == 2 and "not the manifest recorded" in err, err
    assert "new, charged attempt" in err
    assert not release.release_exists(out)
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.FAILED  # its spend stays


def test_a_manifest_rewritten_after_it_was_recorded_local(monkeypatch,
                                                          tmp_path, capsys):
    _manifest_swapped_after_commit(monkeypatch, tmp_path, capsys,
                                   *_locations(tmp_path, None))


def test_a_manifest_rewritten_after_it_was_recorded_gcs(monkeypatch, tmp_path,
                                                        capsys, gcs):
    _manifest_swapped_after_commit(monkeypatch, tmp_path, capsys,
                                   *_locations(tmp_path, gcs))


def test_publish_checks_the_recorded_digest(tmp_path):
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    recorded = release.manifest_digest(staging)
    manifest = release.staged_manifest(staging)
    manifest["privacy"] = {"spent": {"epsilon": 1.0}}
    publisher.write_manifest(staging, manifest)
    with pytest.raises(release.ReleaseChanged, match="not the manifest rec"):
        publisher.publish(staging, str(tmp_path / "out"),
                          manifest_sha256=recorded)
    assert not release.release_exists(str(tmp_path / "out"))


# ------------------------- fixed: a manifest stripped of its files block

def _strip_files(out: str) -> None:
    manifest = release.read_manifest(out)
    del manifest["files"]
    publisher.write_manifest(out, manifest)


def _stripped_release(tmp_path, gcs_or_none) -> tuple[str, str]:
    root = (str(tmp_path / "releases") if gcs_or_none is None
            else gcs_or_none.uri("releases"))
    out = f"{root}/2026-01-01"
    publisher.publish(_staged(f"{root}/s", "nightly", "v-1"), out)
    _strip_files(out)
    _delete_shard(release.release_root(out))
    return root, out


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_latest_json_refuses_a_manifest_without_digests(tmp_path, capsys,
                                                        request, where):
    from dpsynth.deploy import publish
    emulator = request.getfixturevalue("gcs") if where == "gcs" else None
    root, out = _stripped_release(tmp_path, emulator)
    assert publish.main(["--output", out, "--run-id", "nightly",
                         "--output-root", root]) == 1
    assert "lists no file digests" in capsys.readouterr().err
    assert not release.FileSystems.exists(f"{root}/LATEST.json")


def test_reading_a_release_without_digests_warns(tmp_path):
    out = str(tmp_path / "out")
    publisher.publish(_staged(str(tmp_path / "s"), "r", "v-1"), out)
    _strip_files(out)
    with pytest.warns(UserWarning, match="read unchecked"):
        reading.verify_release(out)


# --------------------------------- fixed: a malformed files entry, one line

@pytest.mark.parametrize("entry", ["abc", None, {"bytes": "1", "sha256": "x"},
                                   {"sha256": "x"}])
def test_a_malformed_files_entry_is_refused(tmp_path, entry):
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    manifest = release.staged_manifest(staging)
    manifest["files"]["_gmm.npz"] = entry
    publisher.write_manifest(staging, manifest)
    with pytest.raises(release.ReleaseChanged, match="not a size and sha256"):
        publisher.publish(staging, str(tmp_path / "out"))


# ------------------------------------------------------------------- held

@pytest.mark.parametrize("name", ["../evil", "/etc/hostname",
                                  "data/../../evil", "gs://other/evil"])
def test_a_files_entry_outside_the_folder_is_never_read(tmp_path, name):
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    _put(str(tmp_path), "evil", b"E" * 10)
    manifest = release.staged_manifest(staging)
    manifest["files"][name] = {"bytes": 10, "sha256": "0" * 64}
    publisher.write_manifest(staging, manifest)
    with pytest.raises(release.ReleaseChanged, match="is missing"):
        publisher.publish(staging, str(tmp_path / "out"))
    assert not os.path.exists(tmp_path / "out" / "v-1")


def test_a_huge_listed_size_is_refused_before_hashing(tmp_path, monkeypatch):
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    manifest = release.staged_manifest(staging)
    manifest["files"]["_gmm.npz"]["bytes"] = 1 << 50
    publisher.write_manifest(staging, manifest)
    monkeypatch.setattr(release, "_sha256_all", None)  # never reached
    with pytest.raises(release.ReleaseChanged, match="bytes, not"):
        publisher.publish(staging, str(tmp_path / "out"))


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_file_added_after_publication_is_refused(tmp_path, request, where):
    base = (str(tmp_path) if where == "local"
            else request.getfixturevalue("gcs").uri("rel"))
    out = f"{base}/out"
    publisher.publish(_staged(f"{base}/s", "r", "v-1"), out)
    _put(release.release_root(out), "data/s-9.tfrecord", b"rows")
    with pytest.raises(release.ReleaseChanged, match="not in the manifest"):
        reading.load_release(out)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_one_staged_folder_published_twice_at_once(tmp_path, monkeypatch,
                                                   request, where):
    """A publish racing a re-publish of the same staged folder (a retry
    launched while the first launch still publishes): one release, both
    see it as theirs, its files whole."""
    base = (str(tmp_path) if where == "local"
            else request.getfixturevalue("gcs").uri("rel"))
    _slow_place(monkeypatch, 0.2)
    for i in range(3):
        out = f"{base}/out-{i}"
        staging = _staged(f"{base}/s-{i}", "r", f"v-{i}")
        results: list = [None, None]

        def publish(k):
            try:
                results[k] = publisher.publish(staging, out)
            except release.ReleaseError as err:
                results[k] = err
        threads = [threading.Thread(target=publish, args=(k,))
                   for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(isinstance(r, dict) for r in results), results
        assert reading.verify_release(out)["root"] == f"v-{i}"


@pytest.mark.parametrize("store", ["./out/../out/budgets", "out/./budgets",
                                   "file://{tmp}/out/budgets",
                                   "{tmp}/link/budgets"])
def test_a_store_under_the_output_in_another_spelling(tmp_path, monkeypatch,
                                                      capsys, store):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out")
    capsys.readouterr()
    rc = _generate(_data(tmp_path), f"{tmp_path}/out", "--budget-store",
                   store.format(tmp=tmp_path), "--dataset-id", "d",
                   "--lifetime-epsilon", "2")
    err = _one_line_error(capsys)
    assert rc == 2 and "lies under --output" in err, err


def test_gcs_spellings_of_one_prefix():
    for output, path in [("gs://b/out", "gs://b//out/k"),
                         ("gs://b//out/", "gs://b/out/./k"),
                         ("gs://b/a/../out", "gs://b/out/k/")]:
        assert release.lies_under(path, output), (output, path)


def test_a_published_manifest_names_what_was_published(tmp_path):
    """The bytes at --output are exactly the recorded staged manifest."""
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    digest = release.manifest_digest(staging)
    out = str(tmp_path / "out")
    publisher.publish(staging, out, manifest_sha256=digest)
    assert json.loads(Path(out, "_manifest.json").read_text()) == \
        release.staged_manifest(staging)


def test_a_staging_on_another_file_system_is_refused(tmp_path, monkeypatch,
                                                     gcs):
    """It used to place the files into a local folder named "gs:" (under
    the working directory) and then find them missing on gs://."""
    monkeypatch.chdir(tmp_path)
    staging = _staged(str(tmp_path / "s"), "r", "v-1")
    with pytest.raises(release.ReleaseError, match="different file systems"):
        publisher.publish(staging, gcs.uri("rel", "out"))
    assert not (tmp_path / "gs:").exists()


def test_the_printed_parquet_hint_reads_only_the_published_release(tmp_path,
                                                                    capsys):
    """A careless operator's `--epsilon inf --overwrite` test run, killed
    after placing its files, leaves an exact version folder beside the
    published release: the read hint the run printed must not mix it in
    (``pandas.read_parquet(<output>)`` returned both releases' rows)."""
    import pandas as pd
    data, out = _data(tmp_path), str(tmp_path / "out")
    assert _generate(data, out, "--output-format", "parquet") == 0
    hint = [line for line in capsys.readouterr().out.splitlines()
            if "pandas.read_parquet(" in line]
    (path,) = [p.split("')")[0] for p in hint[0].split("read_parquet('")[1:]]
    published = release.read_manifest(out)
    # The killed launch's leftover: a copy of a version folder's files.
    leftover = Path(out, "v-killedlaunch")
    shutil.copytree(Path(release.release_root(out)), leftover)
    assert len(pd.read_parquet(path)) == published["samples_total"]
    assert len(reading.load_release(out)[1]) == published["samples_total"]


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_staged_release_naming_the_published_folder_is_refused(
        tmp_path, request, where):
    """A staged release of another run whose root is the published one's
    (a copied staging folder, or a crafted manifest) used to be placed over
    the live files before the switch: the switch then failed and the
    published release was left broken."""
    base = (str(tmp_path) if where == "local"
            else request.getfixturevalue("gcs").uri("rel"))
    out = f"{base}/out"
    publisher.publish(_staged(f"{base}/a", "a", "v-1", body=b"A"), out)
    other = _staged(f"{base}/b", "b", "v-1", body=b"B")
    with pytest.raises(release.ReleaseError, match="version folder this"):
        publisher.publish(other, out, overwrite=True)
    assert reading.verify_release(out)["run_id"] == "a"  # whole, untouched


@pytest.mark.parametrize("body", ['{"run_id": "x", "ro', "[1, 2]", "\xff"])
def test_a_broken_manifest_at_the_output_is_one_line_naming_it(
        tmp_path, capsys, body):
    """A truncated write (disk full) or a hand edit: before, a JSON error
    without the file's name, or an AttributeError traceback."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "_manifest.json").write_bytes(body.encode("latin-1"))
    capsys.readouterr()
    rc = _generate(_data(tmp_path), str(out), "--overwrite")
    err = _one_line_error(capsys)
    assert rc == 2 and f"{out}/_manifest.json: not a dpsynth manifest" in err
    with pytest.raises(release.ReleaseError, match="not a dpsynth manifest"):
        reading.load_release(str(out))


@pytest.mark.parametrize("target", ["folder", "nowhere"])
def test_a_link_added_to_a_published_release_is_refused(tmp_path, target):
    """A link to a folder of more shards was not listed (os.walk does not
    enter it, a Parquet reader of the folder may); a broken link ended in
    a FileNotFoundError traceback."""
    out = str(tmp_path / "out")
    publisher.publish(_staged(str(tmp_path / "s"), "r", "v-1"), out)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "s-9.tfrecord").write_bytes(b"rows")
    Path(release.release_root(out), "data", "more").symlink_to(
        tmp_path / target)
    with pytest.raises(release.ReleaseChanged, match="data/more is not in"):
        reading.load_release(out)


@pytest.mark.parametrize("flags", [("--epsilon", "inf"),
                                   ("--noise-seed", "3")])
def test_latest_json_never_points_at_a_release_that_is_not_private(
        tmp_path, capsys, flags):
    """A debugging run under the nightly run id (exact data, or noise that
    anyone with the seed cancels): LATEST.json and the webhook pointed at
    it (and wrote `Infinity` into LATEST.json for --epsilon inf)."""
    from dpsynth.deploy import publish
    root = tmp_path / "releases"
    out = str(root / "2026-01-01")
    assert _generate(_data(tmp_path), out, "--run-id", "nightly",
                     *flags) == 0
    capsys.readouterr()
    assert publish.main(["--output", out, "--run-id", "nightly",
                         "--output-root", str(root)]) == 1
    assert "NOT PRIVATE" in capsys.readouterr().err
    assert not (root / "LATEST.json").exists()
