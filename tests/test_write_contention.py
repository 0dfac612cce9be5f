"""benchmarks/write_contention.py: each part does the write stage's work
(the files it writes hold the rows the pipeline would draw), and its flags
are checked before anything runs."""

import os

import numpy as np
import pytest

from benchmarks import write_contention as wc
from dpsynth.dp_ops import generator
from dpsynth.dp_ops.config import GeneratorConfig


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(wc, "SHARD", 4_000)  # 10,000 rows: three shards


def _files(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder))


def test_release_files_hold_the_drawn_rows(tmp_path, small_shards):
    import pyarrow.parquet as pq
    wc.run_mode("release", 10_000, str(tmp_path))
    files = _files(tmp_path)
    assert len(files) == 3
    rows = np.concatenate([
        np.stack(pq.read_table(f).column("embedding").to_pylist())
        for f in files]).astype(np.float32)
    cfg = GeneratorConfig(labels=(0,))
    expected = generator.sample_rows(wc._mixture(), cfg, 10_000, 0, 10_000)
    np.testing.assert_array_equal(rows, expected)


def test_file_part_writes_the_same_bytes_and_the_others_none(
        tmp_path, small_shards):
    (tmp_path / "file").mkdir()
    wc.run_mode("file", 10_000, str(tmp_path / "file"))
    sizes = [os.path.getsize(f) for f in _files(tmp_path / "file")]
    assert sizes == [4_000 * wc.DIM * 4] * 2 + [2_000 * wc.DIM * 4]
    for mode in ("draw", "encode"):
        folder = tmp_path / mode
        folder.mkdir()
        wc.run_mode(mode, 10_000, str(folder))
        assert _files(folder) == []


@pytest.mark.parametrize("argv, message", [
    (["--modes", "draw,paint"], "--modes: unknown paint"),
    (["--rows", "0"], "--rows and --processes must be at least 1"),
    (["--dir", "/no/such/folder"], "--dir /no/such/folder: not a folder"),
])
def test_bad_flags_are_refused_before_any_run(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        wc.main(argv + ["--no-save"])
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def test_report_gives_each_part_its_ratio():
    text = wc.report([{"mode": "release", "alone_s": 9.0, "alone_cpu_s": 9.0,
                       "together_s": 12.6, "together_cpu_s": 12.5,
                       "ratio": 1.4}], 2_000_000, 2, "/tmp", "check")
    assert "| release | 9.00 | 9.00 | 12.60 | 12.50 | 1.40x |" in text
    assert "2,000,000 rows x 384 float32 a process" in text
