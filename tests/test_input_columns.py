"""Inputs as users write them (issue 72): Parquet from pandas/pyarrow (a
variable-length list column) without --embedding-dim, and feature
columns named however the user named them (--embedding-columns)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from dpsynth.pipelines import cli

DIM = 6


def _generate(*argv) -> int:
    try:
        return cli.main(["generate", *map(str, argv), "--accountant", "rdp",
                         "--noise-seed", "1"])
    except SystemExit as stop:
        return int(stop.code)


def _rows(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, DIM)), np.arange(n) % 2


def _manifest(out) -> dict:
    return json.loads((out / "_manifest.json").read_text())


def _pandas_parquet(path, x, y, **kwargs) -> str:
    pd.DataFrame({"embedding": list(x), "label": y}).to_parquet(
        path, **kwargs)
    return str(path)


def test_a_pandas_parquet_needs_no_embedding_dim(tmp_path):
    x, y = _rows()
    path = _pandas_parquet(tmp_path / "train.parquet", x.astype(np.float32), y)
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 2,
                     "--output", out) == 0
    assert _manifest(out)["embedding_dim"] == DIM


def test_the_schema_is_read_once_per_run(tmp_path, monkeypatch):
    """The input's schema is checked once, before the charge, and both
    phases' readers are built from that check (job.input_schema), not
    by reading it again."""
    from dpsynth.transforms.io import read
    calls = []
    real = read.release_schema

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)
    monkeypatch.setattr(read, "release_schema", counted)
    x, y = _rows()
    path = _pandas_parquet(tmp_path / "train.parquet", x, y)
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 2,
                     "--output", out) == 0
    assert _manifest(out)["adaptive_plan"]  # two phases, two readers
    assert calls == [[path]]


def test_a_charged_release_takes_no_dimension_from_a_row(tmp_path, capsys):
    """With a budget store the dimension must be public configuration: an
    empty input would be refused where a one-row input is released, so
    whether a charged release exists would depend on n."""
    x, y = _rows()
    path = _pandas_parquet(tmp_path / "train.parquet", x.astype(np.float32), y)
    store = tmp_path / "budgets"
    common = ["generate", "--input", path, "--num-classes", "2",
              "--budget-store", str(store), "--dataset-id", "d",
              "--lifetime-epsilon", "10", "--accountant", "rdp"]
    assert cli.main([*common, "--output", str(tmp_path / "a")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--embedding-dim" in err[0], err
    assert "budget store" in err[0] and not (tmp_path / "a").exists()
    from dpsynth.pipelines.budget import store as budget_store
    assert budget_store.history(str(store), "d") == []  # nothing charged
    assert cli.main([*common, "--embedding-dim", str(DIM),
                     "--output", str(tmp_path / "b")]) == 0


@pytest.mark.parametrize("row_group_size", [None, 8])
def test_a_parquet_row_of_another_length_is_refused_naming_it(
        tmp_path, capsys, row_group_size):
    x, y = _rows()
    rows = list(x)
    rows[13] = rows[13][:5]
    path = str(tmp_path / "train.parquet")
    pd.DataFrame({"embedding": rows, "label": y}).to_parquet(
        path, row_group_size=row_group_size)
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 2,
                     "--output", out) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "row 13" in err[-1] and "5" in err[-1], err
    assert not out.exists()


def test_embedding_dim_still_checks_a_parquet_list(tmp_path, capsys):
    x, y = _rows()
    path = _pandas_parquet(tmp_path / "train.parquet", x, y)
    assert _generate("--input", path, "--num-classes", 2, "--output",
                     tmp_path / "out", "--embedding-dim", DIM + 1) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "row 0" in err[-1] and f"expected {DIM + 1}" in err[-1], err


def _table(tmp_path, ext: str, x, y) -> str:
    """Columns id, x0..x5 (dimensions), label: as SDV or a TFX schema
    might name them."""
    df = pd.DataFrame({"id": np.arange(len(y))})
    for i in range(x.shape[1]):
        df[f"x{i}"] = x[:, i]
    df["label"] = y
    path = tmp_path / f"train.{ext}"
    if ext == "csv":
        df.to_csv(path, index=False)
    else:
        df.to_parquet(path)
    return str(path)


@pytest.mark.parametrize("ext", ["csv", "parquet"])
@pytest.mark.parametrize("columns, picked", [
    ("x*", [0, 1, 2, 3, 4, 5]),   # a prefix
    ("x[1-3]", [1, 2, 3]),        # a pattern
    ("x5,x0", [5, 0]),            # a list, in its order
])
def test_embedding_columns_pick_the_named_columns(tmp_path, ext, columns,
                                                  picked):
    from dpsynth.transforms import io
    x, y = _rows()
    path = _table(tmp_path, ext, x, y)
    spec = io.InputSpec(path, embedding_columns=tuple(columns.split(",")))
    dim, _ = io.release_schema([path], spec)  # from the header, no row read
    assert dim == len(picked)
    got = np.concatenate([b[0] for b in io.read_file_blocks(path, spec, dim)])
    np.testing.assert_allclose(got, x[:, picked])


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_generate_reads_embedding_columns(tmp_path, ext):
    x, y = _rows()
    out = tmp_path / "out"
    assert _generate("--input", _table(tmp_path, ext, x, y), "--num-classes",
                     2, "--embedding-columns", "x*", "--output", out) == 0
    assert _manifest(out)["embedding_dim"] == DIM


@pytest.mark.parametrize("ext", ["csv", "parquet"])
def test_an_unmatched_column_pattern_is_refused_naming_the_flag(
        tmp_path, capsys, ext):
    x, y = _rows()
    out = tmp_path / "out"
    assert _generate("--input", _table(tmp_path, ext, x, y), "--num-classes",
                     2, "--embedding-columns", "f*", "--output", out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--embedding-columns 'f*' matches no column" \
        in err[0], err
    assert not out.exists()


def test_embedding_columns_are_refused_for_npz(tmp_path, capsys):
    x, y = _rows()
    path = tmp_path / "train.npz"
    np.savez(path, embeddings=x, labels=y)
    assert _generate("--input", path, "--num-classes", 2,
                     "--embedding-columns", "x*", "--output",
                     tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--embedding-columns" in err[0], err
