"""Issue 71 (release integrity, round 5), tried as an attacker would.

1. A budget document older than the label rule (releases, no
   ``label_rule``) pinned whatever rule the next run brought, so a
   relabelling of the same records passed the cap again: it now pins
   only a rule it can check (no class partition recorded) and otherwise
   refuses in one line naming the admin command that sets the rule.
4. ``load_release`` hashed each file, then opened it again to parse it: a
   shard swapped between the two reads was returned. Each shard is now
   read once, and the bytes hashed are the bytes parsed.
7. The lifetime cap's delta and epsilon are bounded like a run's
   (``MAX_DELTA``, ``MAX_EPSILON``), also when read from a document.
8. ``dpsynth sample``: ``--rows`` bounded by what the source states; the
   source reached through another path (a bind mount, a link) is found
   by device and inode, not by its spelling.
Gap: the writers' digest record rewritten with no tag at all is refused.
Local, and gs:// on the emulator where the item touches storage.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from apache_beam.io.filesystems import FileSystems

from dpsynth.dp_ops.ledger import Mechanism
from dpsynth.pipelines.budget import record
from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines.budget.storage import _dumps

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)
from tests.test_label_rule import DELTA, store  # noqa: E402,F401 (fixture)


def _mech(label: int) -> list[Mechanism]:
    """One class's mechanism of epsilon 0.93 at delta 1e-5; two of one
    class compose to 1.36, over the cap of 1.2 the tests use."""
    return [Mechanism(f"class={label}/count", "moments", f"class={label}",
                      1.0, 4.0)]


def _document(store: str, dataset_id: str) -> dict:
    return bs._backend(store, dataset_id).read()


def _put_document(store: str, dataset_id: str, doc: dict) -> None:
    """The document as an older dpsynth (or the test) left it."""
    uri = bs._document_uri(store, dataset_id)
    if not uri.startswith("gs://"):
        os.makedirs(os.path.dirname(uri), exist_ok=True)
    with FileSystems.create(uri) as f:
        f.write(_dumps(doc).encode())


# ----------------------------------------- 7. the lifetime cap's bounds

@pytest.mark.parametrize("eps,delta,flag", [
    (1.0, 0.5, "--lifetime-delta"), (1.0, 1e-3, "--lifetime-delta"),
    (1e300, DELTA, "--lifetime-epsilon"), (1001.0, DELTA, "--lifetime-epsilon")])
def test_a_cap_out_of_the_run_bounds_is_refused(store, eps, delta, flag):
    with pytest.raises(ValueError) as err:
        bs.reserve(store, "d", "r1", _mech(0), 1.0, DELTA, eps, delta)
    assert flag in str(err.value) and "\n" not in str(err.value)
    assert _document(store, "d") is None  # nothing written
    with pytest.raises(ValueError, match=flag):
        bs.set_cap(store, "d", eps, delta, "widen")
    assert _document(store, "d") is None


def test_a_cap_of_delta_half_admits_no_release(store):
    """The attack: three epsilon-1 releases under a store made with
    --lifetime-delta 0.5 (each measured 0.0000 there)."""
    with pytest.raises(ValueError, match="--lifetime-delta"):
        for i in range(3):
            bs.reserve(store, "d", f"r{i}", _mech(0), 1.0, DELTA, 1.2, 0.5)
    assert _document(store, "d") is None


def test_a_pinned_cap_out_of_bounds_is_not_trusted(store):
    bs.reserve(store, "d", "r0", _mech(0), 1.0, DELTA, 1.2, DELTA)
    doc = _document(store, "d")
    doc["lifetime_cap"]["delta"] = 0.5  # pinned by an older dpsynth
    _put_document(store, "d", doc)
    for run in ("r1", "r2"):
        with pytest.raises(bs.CapConflict) as err:
            bs.reserve(store, "d", run, _mech(0), 1.0, DELTA, None, None)
        assert "set-cap" in str(err.value) and "\n" not in str(err.value)
    assert _document(store, "d") == doc  # nothing charged
    bs.set_cap(store, "d", 1.2, DELTA, "the cap of the dataset's policy")
    with pytest.raises(bs.BudgetExceeded):
        bs.reserve(store, "d", "r1", _mech(0), 1.0, DELTA, None, None)


def test_budget_check_refuses_a_cap_out_of_bounds(tmp_path, capsys):
    store = str(tmp_path / "budgets")
    code = bs.main(["check", "--budget-store", store, "--dataset-id", "d",
                    "--lifetime-epsilon", "1", "--lifetime-delta", "0.5",
                    "--num-classes", "2", "--epsilon", "1"])
    err = capsys.readouterr().err
    assert code == 3 and "--lifetime-delta" in err and "Traceback" not in err
    code = bs.main(["set-cap", "--budget-store", store, "--dataset-id", "d",
                    "--lifetime-epsilon", "1e300", "--lifetime-delta", "1e-5",
                    "--reason", "x"])
    err = capsys.readouterr().err
    assert code == 2 and "--lifetime-epsilon" in err and "Traceback" not in err
    assert not os.path.exists(bs._document_uri(store, "d"))


@pytest.mark.parametrize("flags", [["--lifetime-delta", "0.5"],
                                   ["--lifetime-epsilon", "1e300"]])
def test_generate_with_a_cap_out_of_bounds_reads_nothing(
        tmp_path, capsys, monkeypatch, flags):
    from dpsynth.pipelines.release import protocol, reading, release
    from test_release_integrity import _data, _generate, _one_line_error
    data, out = _data(tmp_path), str(tmp_path / "out")
    store = str(tmp_path / "budgets")
    steps: list = []
    monkeypatch.setattr(protocol, "checkpoint", steps.append)
    capsys.readouterr()
    rc = _generate(data, out, "--epsilon", "1", "--run-id", "r",
                   "--budget-store", store, "--dataset-id", "d",
                   *(["--lifetime-epsilon", "1.2"] if "0.5" in flags else []),
                   *flags)
    err = _one_line_error(capsys)
    assert rc == 2 and flags[0] in err, err
    assert "running" not in steps  # no data read
    assert not release.release_exists(out)
    assert release.staging_folders(out, "r") == {}
    assert not os.path.exists(bs._document_uri(store, "d"))


# ------------------------- 1. a document older than the label rule

RULE = {"label_feature": "label", "labels": [0, 1]}


def _legacy_document(store: str, dataset_id: str = "d") -> dict:
    """A document as dpsynth wrote it before rules were pinned: one
    release of class 0, no ``label_rule``."""
    bs.reserve(store, dataset_id, "r1", _mech(0), 1.0, DELTA, 1.2, DELTA,
               label_rule=RULE)
    doc = _document(store, dataset_id)
    del doc["label_rule"]
    _put_document(store, dataset_id, doc)
    return doc


@pytest.mark.parametrize("rule", [
    {"label_feature": "label2", "labels": [0, 1]},  # the relabelling
    {"label_feature": "label", "labels": [1]}, RULE])
def test_an_unlabelled_document_pins_no_rule_it_cannot_check(store, rule):
    doc = _legacy_document(store)
    with pytest.raises(record.LabelRuleConflict) as err:
        bs.reserve(store, "d", "r2", _mech(1), 1.0, DELTA, None, None,
                   label_rule=rule)
    message = str(err.value)
    assert "\n" not in message and "nothing charged" in message
    assert "set-label-rule" in message and "--dataset-id d" in message
    assert _document(store, "d") == doc  # nothing pinned, nothing charged


def test_the_admin_command_sets_the_rule_once(store, capsys):
    _legacy_document(store)
    base = ["set-label-rule", "--budget-store", store, "--dataset-id", "d",
            "--label-feature", "label"]
    # A rule missing a recorded class cannot be the one its releases used.
    assert bs.main([*base, "--labels", "1", "--reason", "x"]) == 2
    assert "class(es) [0]" in capsys.readouterr().err
    assert "label_rule" not in _document(store, "d")
    assert bs.main([*base, "--labels", "0,1", "--reason", "audit"]) == 0
    doc = _document(store, "d")
    assert doc["label_rule"]["label_feature"] == "label"
    assert doc["label_rule_changes"][0]["reason"] == "audit"
    # Now the relabelling is refused as for any pinned rule ...
    with pytest.raises(record.LabelRuleConflict, match="pinned"):
        bs.reserve(store, "d", "r2", _mech(1), 1.0, DELTA, None, None,
                   label_rule={"label_feature": "label2", "labels": [0, 1]})
    # ... the rule is never changed by the command ...
    assert bs.main([*base[:-1], "label2", "--labels", "0,1",
                    "--reason", "x"]) == 2
    assert "never changed" in capsys.readouterr().err
    # ... and a run under the recorded rule is accounted as before.
    bs.reserve(store, "d", "r2", _mech(1), 1.0, DELTA, None, None,
               label_rule=dict(RULE))
    with pytest.raises(bs.BudgetExceeded):
        bs.reserve(store, "d", "r3", _mech(0), 1.0, DELTA, None, None,
                   label_rule=dict(RULE))
    # A document whose releases spent on no class can pin a rule: nothing
    # recorded relied on one.
    glob = [Mechanism("global/centre", "centre", "global", 1.0, 8.0)]
    bs.reserve(store, "e", "r1", glob, 1.0, DELTA, 1.2, DELTA)
    assert "label_rule" not in _document(store, "e")
    bs.reserve(store, "e", "r2", _mech(0), 1.0, DELTA, None, None,
               label_rule=RULE)
    assert _document(store, "e")["label_rule"]["labels"] == [0, 1]


def test_generate_relabelling_an_unlabelled_document_is_refused(
        store, tmp_path, capsys, monkeypatch):
    """Round 3's attack on a document older than the rule: 1.0071
    accounted, 1.4650 true, cap 1.2."""
    from dpsynth.pipelines.release import protocol, reading, release
    from test_label_rule import _generate, _two_label_table
    data = _two_label_table(tmp_path)
    assert _generate(data, str(tmp_path / "first"), store, "--labels", "0",
                     "--label-feature", "label") == 0
    doc = _document(store, "patients")
    del doc["label_rule"]  # as an older dpsynth left it
    _put_document(store, "patients", doc)
    steps: list = []
    monkeypatch.setattr(protocol, "checkpoint", steps.append)
    capsys.readouterr()
    second = str(tmp_path / "second")
    code = _generate(data, second, store, "--labels", "1",
                     "--label-feature", "label2")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert "set-label-rule" in lines[0]
    assert _document(store, "patients") == doc  # nothing charged
    assert "running" not in steps
    assert not release.release_exists(second)
    assert not [p for p in os.listdir(tmp_path) if ".staging-" in p]


# ------------------------------------------------------ 8. dpsynth sample

# ``sample_source``: the seeded demo release of tests/conftest.py (shared
# with tests/test_sample.py).


from tests.test_sample import _tree  # noqa: E402 (every file's bytes)


def _no_huge_draw(monkeypatch) -> None:
    """The old code listed 1e20 rows' shards until memory ran out: fail
    fast instead of growing."""
    from dpsynth.transforms import write
    real = write.shard_bounds

    def bounds(total, rows_per_shard):
        assert total <= 10**9, f"drew {total} rows of one class"
        return real(total, rows_per_shard)
    monkeypatch.setattr(write, "shard_bounds", bounds)


def test_sample_rows_are_bounded_in_one_line(sample_source, tmp_path,
                                             capsys, monkeypatch):
    from dpsynth.dp_ops import config
    from dpsynth.pipelines import cli
    from dpsynth.pipelines.release import sample
    assert sample.MAX_SAMPLES_PER_CLASS == config.MAX_SAMPLES_PER_CLASS
    assert sample.MAX_ROWS == config.MAX_SAMPLES_PER_CLASS * config.MAX_CLASSES
    _no_huge_draw(monkeypatch)
    out = tmp_path / "more"
    classes = len(json.loads(Path(sample_source, "_manifest.json")
                             .read_text())["classes"])
    for rows in ("99999999999999999999",  # the report's
                 str(10**9 * classes + 1)):  # more than the source holds
        capsys.readouterr()
        try:
            code = cli.main(["sample", sample_source, "--rows", rows,
                             "--output", str(out)])
        except SystemExit as stop:  # argparse's own one line
            code = stop.code
        err = capsys.readouterr().err.strip()
        assert code == 2 and "--rows" in err, err
        assert len(err.splitlines()) == 1 or err.splitlines()[-1].startswith(
            "dpsynth sample: error: argument --rows"), err
        assert not out.exists()
        assert not [p for p in os.listdir(tmp_path) if ".staging-" in p]


def _alias(monkeypatch, tmp_path: Path, target: Path) -> Path:
    """A second path to ``target`` that its spelling does not reveal: a
    link whose resolution the spelling check is not allowed to see (as a
    bind mount, which realpath cannot see either)."""
    from dpsynth.pipelines.release import reading, release
    alias = tmp_path / "alias"
    alias.symlink_to(target)
    real = release._path_forms
    monkeypatch.setattr(release, "_path_forms", lambda p: {
        os.path.abspath(p.removeprefix("file://"))}
        if release.is_local(p) or p.startswith("file://") else real(p))
    return alias


@pytest.mark.parametrize("where", ["self", "parent", "inside"])
def test_sample_output_through_another_path_to_the_source_is_refused(
        sample_source, tmp_path, monkeypatch, where):
    import shutil
    from dpsynth.pipelines.release import sample
    src = tmp_path / "area" / "rel"
    src.parent.mkdir()
    shutil.copytree(sample_source, src)
    before = _tree(tmp_path / "area")
    alias = _alias(monkeypatch, tmp_path, src.parent)
    output = {"self": alias / "rel", "parent": alias,
              "inside": alias / "rel" / "inside"}[where]
    _no_huge_draw(monkeypatch)
    with pytest.raises(sample.SampleError, match="source release") as err:
        sample.run(sample.SampleSpec(str(src), str(output), 10,
                                     overwrite=True))
    assert "\n" not in str(err.value)
    assert _tree(tmp_path / "area") == before  # the source is untouched
    # A sibling through the same alias is fine.
    sample.run(sample.SampleSpec(str(src), str(alias / "rel-2"), 10))


def test_sample_through_a_real_bind_mount_is_refused(sample_source,
                                                     tmp_path):
    """The report's attack, with a real bind mount in a private mount
    namespace (skipped where unshare/mount are not allowed)."""
    import shutil
    import subprocess
    src = tmp_path / "area" / "rel"
    src.parent.mkdir()
    shutil.copytree(sample_source, src)
    mount = tmp_path / "mnt"
    mount.mkdir()
    probe = subprocess.run(["unshare", "-m", "sh", "-c",
                            f"mount --bind {src.parent} {mount}"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no private mount namespace here")
    before = _tree(tmp_path / "area")
    code = ("import sys; from dpsynth.pipelines import cli; "
            f"sys.exit(cli.main(['sample', {str(src)!r}, '--rows', '10', "
            f"'--output', {str(mount / 'rel')!r}, '--overwrite']))")
    proc = subprocess.run(
        ["unshare", "-m", "sh", "-c",
         f"mount --bind {src.parent} {mount} && exec {sys.executable} "
         f"-c \"{code}\""], capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "source release" in errors[0]
    assert _tree(tmp_path / "area") == before


# ------------------------- gap: the writers' record rewritten with no tag

def test_a_record_without_its_tag_is_refused(tmp_path):
    import hashlib
    from dpsynth.transforms import digests
    staging, key = str(tmp_path / "s"), os.urandom(32)
    os.makedirs(staging)
    files = {"data/a": {"bytes": 3,
                        "sha256": hashlib.sha256(b"abc").hexdigest()}}
    digests.put_record(staging, files, key)
    record = json.loads(Path(staging, digests.RECORD).read_text())
    for drop in ("hmac_sha256", None):
        doc = dict(record, files={"data/a": {"bytes": 3, "sha256": "0" * 64}})
        if drop:
            del doc[drop]
        else:
            doc["hmac_sha256"] = None  # a tag of the wrong type
        Path(staging, digests.RECORD).write_text(json.dumps(doc))
        with pytest.raises(digests.ForgedRecord):
            digests.read_record(staging, key)


@pytest.mark.parametrize("where", ["local", "gcs"])
def test_shards_and_an_untagged_record_are_never_published(
        monkeypatch, tmp_path, capsys, request, where):
    """The attacker of test_written_digests, who kept the tag, here drops
    it: the shards rewritten with real rows and the record rewritten to
    list them, with no tag at all."""
    from dpsynth.pipelines.release import protocol, reading, release
    from dpsynth.transforms import digests
    from test_written_digests import (RUN, _data, _everything_under,
                                      _generate, _one_line_error, _put,
                                      _rewrite_shards, _store, _where)
    data = _data(tmp_path)
    out, store = _where(tmp_path, request, where)
    planted: dict = {}

    def checkpoint(step):
        if step != "pipeline-done":
            return
        for folder in release.staging_folders(out, RUN).values():
            planted.update(_rewrite_shards(folder, data))
            files = release.file_digests(folder)
            files.pop(digests.RECORD, None)
            _put(folder, digests.RECORD, json.dumps(
                {"format": digests._FORMAT, "files": files}).encode())
    monkeypatch.setattr(protocol, "checkpoint", checkpoint)
    capsys.readouterr()
    rc = _generate(data, out, *_store(store))
    assert planted, "the attack found no staged shard"
    err = _one_line_error(capsys)
    assert rc == 2 and "not written by this run's workers" in err, err
    assert not release.release_exists(out)
    (entry,) = bs.history(store, "d")
    assert entry["status"] == bs.FAILED  # refused, its spend stays
    assert not set(planted.values()) & set(_everything_under(out))


# ---------------------------- 4. readers parse the bytes they verified

def _same_size_fake(name: str, body: bytes, data: Path) -> bytes:
    """``body`` (a TFRecord shard) as real input rows of its class, the
    same number of rows: the same size, so only the sha256 tells."""
    from dpsynth.transforms import write
    from test_written_digests import _real_rows
    x, y = _real_rows(data)
    label = int(name.split("class")[1].split("-")[0])
    per_row = write.record_bytes(x.shape[1], label)
    rows = np.resize(x[y == label], (len(body) // per_row, x.shape[1]))
    fake = write.tfrecord_bytes(rows, label)
    assert len(fake) == len(body) and fake != body
    return fake


def _swap_between_check_and_parse(monkeypatch, where: str, root: str,
                                  data: Path, planted: dict) -> None:
    """The attacker swaps shards (same size, real input rows) once the
    reader has checked them: locally the first shard read, right after
    that read (which gets the release's own bytes); on gs:// every shard,
    right after the listing whose md5s vouched for the objects."""
    from dpsynth.pipelines.release import reading, release
    from test_written_digests import _put, _rewrite_shards
    if where == "gcs":
        real_list = release._stored_md5s

        def listed(folder):
            found = real_list(folder)
            if not planted:
                planted.update(_rewrite_shards(root, data))
            return found
        monkeypatch.setattr(release, "_stored_md5s", listed)
        return
    real_open = FileSystems.open

    def open_(path, *args, **kwargs):
        if "/data/" not in path or planted:
            return real_open(path, *args, **kwargs)
        import io as stdio
        with real_open(path, *args, **kwargs) as f:
            body = f.read()
        name = path[len(root.rstrip("/")) + 1:]
        planted[name] = _same_size_fake(name, body, data)
        _put(root, name, planted[name])
        return stdio.BytesIO(body)
    monkeypatch.setattr(FileSystems, "open", staticmethod(open_))


@pytest.mark.parametrize("reader", ["load_release", "load_latest"])
@pytest.mark.parametrize("where", ["local", "gcs"])
def test_a_shard_swapped_after_its_check_is_never_returned(
        tmp_path, request, monkeypatch, where, reader):
    from dpsynth.pipelines.release import reading, release
    from test_written_digests import _data, _generate, _put, _where
    data = _data(tmp_path)
    out, _ = _where(tmp_path, request, where)
    assert _generate(data, out, "--epsilon", "1") == 0
    x0, y0, _ = reading.load_release(out)
    base = out.rsplit("/", 1)[0]
    _put(base, "LATEST.json", json.dumps(
        {"release": out,
         "manifest_sha256": release.manifest_digest(out)}).encode())
    planted: dict = {}
    _swap_between_check_and_parse(monkeypatch, where,
                                  release.release_root(out), data, planted)
    read = ((lambda: reading.load_release(out)) if reader == "load_release"
            else (lambda: reading.load_latest(base)))
    if where == "gcs":  # every object changed after the listing
        with pytest.raises(release.ReleaseChanged, match="differs"):
            read()
    else:  # the bytes checked are the bytes parsed: exactly the release
        x, y, _ = read()
        np.testing.assert_array_equal(x, x0)
        np.testing.assert_array_equal(y, y0)
    assert planted, "the attack swapped nothing"
