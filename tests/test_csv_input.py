"""CSV input (issue 51): a header row, a label column and either one list
column or one column per dimension; the header is checked like a Parquet
schema and a bad row fails the run in one line naming file, row and column
(never a value), with nothing published."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dpsynth.pipelines import cli
from dpsynth.pipelines.release import reading
from dpsynth.transforms import io
from tests.conftest import gmm_data

HEADER = "label,embedding_0,embedding_1"


def _numbers(row) -> list[str]:
    return [repr(float(v)) for v in row]  # exact float64 round trip


def _dims_csv(path, x, y) -> str:
    names = [f"embedding_{i}" for i in range(x.shape[1])]
    lines = ["label," + ",".join(names)]
    lines += [f"{label}," + ",".join(_numbers(row)) for row, label in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _list_csv(path, x, y) -> str:
    lines = ["id,embedding,label"]  # other columns are ignored
    lines += [f'{i},"[{", ".join(_numbers(row))}]",{label}'
              for i, (row, label) in enumerate(zip(x, y))]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("write", [_dims_csv, _list_csv])
def test_both_layouts_read_the_exact_rows(write, tmp_path):
    x, y = gmm_data(60, d=5)
    path = write(tmp_path / "data.csv", x, y)
    spec = io.InputSpec(path, block_size=7)
    got_x, got_y = io.load_arrays(path)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    assert io.input_schema([path], spec) == (5, path)


def test_spaces_and_a_space_separated_list_read(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text('label,embedding\n 1 ,"0.5 -2"\n0," [1e-3,4] "\n')
    x, y = io.load_arrays(str(path))
    np.testing.assert_array_equal(x, [[0.5, -2.0], [1e-3, 4.0]])
    np.testing.assert_array_equal(y, [1, 0])


def test_a_header_only_file_records_its_dimension(tmp_path):
    path = tmp_path / "empty.csv"
    path.write_text(HEADER + "\n")
    assert io.input_schema([str(path)], io.InputSpec(str(path))) == (
        2, str(path))
    assert io.load_arrays(str(path))[0].shape == (0, 2)


BAD = {
    "short_row": (HEADER + "\n1,0.5,0.5\n2,0.1\n",
                  "row 1 (line 3) has 2 fields, expected 3"),
    "not_a_number": (HEADER + "\n1,0.5,0.5\n2,0.1,0x7q\n",
                     "row 1: column 'embedding_1' is not a number"),
    "empty_cell": (HEADER + "\n1,,0.5\n", "row 0: column 'embedding_0' is "
                   "not a number"),
    "label_text": (HEADER + "\n1,0.5,0.5\ncat,0.1,0.2\n",
                   "row 1: column 'label' is not a number"),
    "label_fraction": (HEADER + "\n1.5,0.1,0.2\n",
                       "row 0 has non-integer label 1.5"),
    "label_unknown": (HEADER + "\n7,0.1,0.2\n", "row 0 has label 7"),
    "nan": (HEADER + "\n1,nan,0.2\n", "row 0 has NaN or infinite values"),
    "list_length": ('label,embedding\n1,"[1,2]"\n0,"[1]"\n',
                    "row 1 has 1 embedding values, expected 2"),
    "list_value": ('label,embedding\n1,"[1,2]"\n0,"[1,zz]"\n',
                   "row 1: column 'embedding' is not a list of numbers"),
    "no_label": ("lab,embedding_0\n1,2\n", "no column 'label'"),
    "no_embedding": ("label,emb_0\n1,2\n", "no column 'embedding' (a list "
                     "per row) or embedding_0"),
    "gap": ("label,embedding_0,embedding_2\n1,2,3\n",
            "column 'embedding_2' does not follow 'embedding_0'"),
    "empty_file": ("", "empty CSV file"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_rows_and_headers_are_one_line(case, tmp_path):
    text, expect = BAD[case]
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(io.InputError) as err:
        _load(str(path))
    message = str(err.value)
    assert message.startswith(f"{path}: ") and expect in message, message
    assert "\n" not in message and "0x7q" not in message and "zz" not in message


def _load(path: str) -> None:
    spec = io.InputSpec(path, labels=(0, 1, 2))
    dim, source = io.input_schema([path], spec)
    for _ in io.read_file_blocks(path, spec, dim, source):
        pass


def _generate(*argv) -> int:
    try:
        return cli.main(["generate", *map(str, argv)])
    except SystemExit as stop:
        return int(stop.code)


def test_generate_on_csv_is_the_release_of_the_same_npz(tmp_path):
    """The CSV reader hands the job the rows an .npz does: same seeded
    release."""
    x, y = gmm_data(300, d=6)
    csv_path = _dims_csv(tmp_path / "train.csv", x, y)
    npz_path = tmp_path / "train.npz"
    np.savez(npz_path, embeddings=x, labels=y)
    for name, path in (("csv", csv_path), ("npz", npz_path)):
        assert _generate("--input", path, "--num-classes", 3, "--output",
                         tmp_path / name, "--noise-seed", 5,
                         "--epsilon", 4) == 0
    a, b = (reading.load_release(str(tmp_path / n))[:2] for n in ("csv", "npz"))
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_generate_refuses_a_bad_row_in_one_line(tmp_path, capsys):
    path = tmp_path / "train.csv"
    path.write_text(HEADER + "\n0,0.5,0.5\n1,0.5\n")
    out = tmp_path / "out"
    assert _generate("--input", path, "--num-classes", 2, "--output",
                     out) == 2
    err = capsys.readouterr().err
    assert f"{path}: row 1 (line 3) has 2 fields, expected 3" in err, err
    assert "Traceback" not in err and not os.path.exists(out)
