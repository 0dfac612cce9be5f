"""benchmarks/floor_scaling.py: P processes share the job's work without
overlap or gaps, and f is Amdahl's."""

import numpy as np
import pytest

from benchmarks import floor_scaling as fs
from benchmarks import scaling


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return scaling.make_data(str(tmp_path_factory.mktemp("cache")), 3_000, 16)


def test_the_processes_read_every_row_once(data):
    def labels(index, processes):
        blocks, dim = fs._blocks(data, index, processes)
        assert dim == 16
        return [y for _, y in blocks()]
    whole = np.concatenate(labels(0, 1))
    split = np.concatenate([y for i in range(3) for y in labels(i, 3)])
    assert len(whole) == len(split) == 3_000
    np.testing.assert_array_equal(np.bincount(whole), np.bincount(split))


def test_serial_fraction_is_amdahls():
    assert fs.serial_fraction(10.0, 5.0, 2) == pytest.approx(0.0)
    assert fs.serial_fraction(10.0, 6.0, 2) == pytest.approx(0.2)
    assert fs.serial_fraction(10.0, 10.0, 4) == pytest.approx(1.0)


def test_a_round_times_every_part_and_reports_f(data, tmp_path):
    runs = fs.measure(data, 3_000, [1, 2], 1, str(tmp_path))
    assert [r["processes"] for r in runs] == [1, 2]
    for r in runs:
        assert set(r["times"]) == set(fs.PARTS)
        assert all(t > 0 for t in r["times"].values())
    text = fs.report(runs, 3_000, str(tmp_path))
    assert "| part | P = 1 s | P = 2 s | f, P = 2 |" in text
    # header + parts + total
    assert text.count("\n| ") == 1 + len(fs.PARTS) + 1
    assert list(tmp_path.iterdir()) == []  # the release files are removed
