"""Reading a release (issue 29): one call, shuffled rows, no stray
warnings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.pipelines import cli
from dpsynth.pipelines.release import reading

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("read") / "demo")
    assert cli.main(["generate", "--output", out, "--output-format",
                     "parquet", "--noise-seed", "1"]) == 0
    return out


def test_numpy_pandas_and_tf_hold_the_same_shuffled_rows(demo):
    x0, y0, manifest = reading.load_release(demo)  # file order
    assert len(np.unique(y0[:50])) == 1  # one class per shard
    x, y = reading.load_release(demo, as_="numpy")
    assert x.dtype == np.float32 and len(y) == manifest["samples_total"]
    assert len(np.unique(y[:50])) > 3  # shuffled: mixed batches
    assert sorted(map(tuple, x.round(5))) == sorted(map(tuple, x0.astype(
        np.float32).round(5)))
    frame = reading.load_release(demo, as_="pandas")
    assert list(frame.columns) == ["embedding", "label"]
    np.testing.assert_array_equal(np.stack(frame.embedding), x)
    tf = pytest.importorskip("tensorflow")
    batch = next(iter(reading.load_release(demo, as_="tf").batch(64)))
    assert batch[0].shape == (64, x.shape[1]) and batch[0].dtype == tf.float32
    assert len(np.unique(batch[1].numpy())) > 3
    with pytest.raises(ValueError, match="as_ must be one of"):
        reading.load_release(demo, as_="arrow")


def test_tf_without_tensorflow_is_one_line_naming_the_extra(
        demo, monkeypatch):
    """The base install has no TensorFlow: one line naming the extra, not
    an import traceback (issue 51)."""
    monkeypatch.setitem(sys.modules, "tensorflow", None)  # import fails
    with pytest.raises(ImportError) as err:
        reading.load_release(demo, as_="tf")
    assert str(err.value) == ("load_release(as_='tf') needs TensorFlow: "
                              "pip install 'dpsynth[tf]'")
    assert err.value.__cause__ is None and err.value.__suppress_context__


def test_pandas_is_a_base_dependency():
    """A release opens as a DataFrame after the base install."""
    import tomllib
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    base = project["dependencies"]
    assert any(r.startswith("pandas") for r in base), base


def test_shuffled_rows_are_the_files_rows_in_the_seeded_order(
        demo, monkeypatch):
    monkeypatch.setattr(reading, "_READ_BLOCK_ROWS", 7)  # many blocks
    x0, y0, _ = reading.load_release(demo)
    for seed in (0, 3):
        order = np.random.default_rng(seed).permutation(len(y0))
        x, y = reading.load_release(demo, as_="numpy", seed=seed)
        np.testing.assert_array_equal(x, x0[order].astype(np.float32))
        np.testing.assert_array_equal(y, y0[order])
    x, y = reading.load_release(demo, as_="numpy", shuffle=False)
    np.testing.assert_array_equal(x, x0.astype(np.float32))
    np.testing.assert_array_equal(y, y0)


def test_reading_a_release_prints_nothing(demo):
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            "from dpsynth.pipelines.release import reading; "
            f"x, y = reading.load_release({demo!r}, as_='numpy')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "" and proc.stdout == ""


def test_the_readme_pandas_snippet_reads_a_parquet_release(demo):
    import re
    text = (REPO / "README.md").read_text()
    (code,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
               if "pd.read_parquet" in b]
    code = re.sub(r'^release = ".*"$', f"release = {demo!r}", code,
                  flags=re.M)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    df = scope["df"]
    _, y, manifest = reading.load_release(demo)
    assert len(df) == manifest["samples_total"]
    assert len(np.unique(df.label.to_numpy()[:50])) > 3  # shuffled
    assert sorted(df.label) == sorted(y)


def test_parquet_readers_open_the_release_in_one_call(demo):
    import pyarrow.dataset as ds
    _, y, manifest = reading.load_release(demo)
    data = f"{demo}/{manifest['root']}/data"  # as the README reads it
    table = ds.dataset(data, format="parquet").to_table()
    assert table.num_rows == manifest["samples_total"]
    assert sorted(table.column("label").to_pylist()) == sorted(y)


def test_a_release_in_the_older_layout_still_reads(demo, tmp_path):
    """Before format 3 the manifest and side files had no '_' prefix."""
    import json
    import shutil
    old = tmp_path / "old"
    shutil.copytree(demo, old)
    manifest = json.loads((old / "_manifest.json").read_text())
    root = old / manifest["root"]
    for name in ("gmm.npz", "summary.json", "schema.json"):
        (root / f"_{name}").rename(root / name)
        manifest["outputs"][name.split(".")[0]] = name
    manifest["format"] = "dpsynth-release/2"
    del manifest["files"]  # listed since format 3's file digests
    (old / "manifest.json").write_text(json.dumps(manifest))
    (old / "_manifest.json").unlink()
    with pytest.warns(UserWarning, match="read unchecked"):  # no digests
        x, y, read = reading.load_release(str(old))
    assert read["format"] == "dpsynth-release/2"
    assert len(y) == manifest["samples_total"]
    assert reading.load_gmm(str(old)) is not None


# demo: Parquet shards; sample_source (tests/conftest.py): TFRecord
@pytest.mark.parametrize("which", ["demo", "sample_source"])
def test_a_shard_is_parsed_from_the_bytes_it_was_checked_on(
        which, request, tmp_path, monkeypatch):
    """The reader hashes each shard's bytes and parses those very bytes
    (in memory, no copy on disk): a shard changed on disk after its
    check is never parsed, so the release read is the one checked."""
    import os
    import shutil
    import tempfile
    src = tmp_path / "release"
    shutil.copytree(request.getfixturevalue(which), src)
    x0, y0, _ = reading.load_release(str(src), shuffle=False)
    real = reading._checked_bytes
    changed = []

    def check_then_change(shard, root, files):
        data = real(shard, root, files)
        with open(shard, "r+b") as f:  # same size, other bytes
            f.write(bytes(len(data)))
        changed.append(shard)
        return data
    monkeypatch.setattr(reading, "_checked_bytes", check_then_change)
    before = set(os.listdir(tempfile.gettempdir()))
    x, y, _ = reading.load_release(str(src), shuffle=False)
    assert changed, "no shard was checked"
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(y, y0)
    assert set(os.listdir(tempfile.gettempdir())) == before  # no copies
    # the files as they are now are not the release: read again, refused
    monkeypatch.undo()
    with pytest.raises(Exception, match="differs"):
        reading.load_release(str(src))


def test_read_file_blocks_parses_given_bytes_not_the_file(demo, tmp_path):
    """``io.read_file_blocks(path, spec, data=...)`` reads ``data``; the
    path only names the file (here it no longer exists)."""
    from dpsynth.pipelines.release import release
    from dpsynth.transforms import io
    manifest = release.read_manifest(demo)
    shard = reading.release_files(demo, manifest)[0]
    spec = io.InputSpec(shard, "parquet", block_size=1 << 16)
    want = list(io.read_file_blocks(shard, spec))
    with open(shard, "rb") as f:
        data = f.read()
    gone = str(tmp_path / "gone.parquet")
    got = list(io.read_file_blocks(gone, spec, data=data))
    assert len(got) == len(want)
    for (xa, ya, _), (xb, yb, _) in zip(got, want):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    with pytest.raises(io.InputError, match="in-memory"):
        list(io.read_file_blocks(str(tmp_path / "x.npz"),
                                 io.InputSpec("x.npz"), data=b"PK"))
