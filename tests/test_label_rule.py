"""Issue 58 item 3: the budget store pins a dataset's label rule.

Classes compose in parallel only when each record is in one class. The same
Parquet records released once by one label column and once by another are
two views of every record: the store accounted ``--labels 0 --label-feature
label`` then ``--labels 1 --label-feature label2`` (epsilon 1 each) as
disjoint classes (1.007) while the true loss is 1.465, passing a cap of
1.2. Now the first release pins the rule (label feature, label set) and
another rule is refused in one line before any data is read, nothing
charged or written. Local and gs:// (emulator) stores.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.dp_ops.ledger import Mechanism
from dpsynth.pipelines.budget import record
from dpsynth.pipelines.budget import store as bs
from dpsynth.pipelines import cli, job_plan
from dpsynth.pipelines.release import protocol
from tests.conftest import gmm_data

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import gcs, gcs_server  # noqa: E402,F401  (fixtures)

DELTA = 1e-5


@pytest.fixture(params=["local", "gcs"])
def store(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "budgets")
    return request.getfixturevalue("gcs").uri("budgets")


def _two_label_table(tmp_path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    x, _ = gmm_data(240, d=4, classes=2)
    # Every record is class 0 by one column and class 1 by the other.
    path = tmp_path / "records.parquet"
    pq.write_table(pa.table({"embedding": x.tolist(),
                             "label": np.zeros(len(x), np.int64),
                             "label2": np.ones(len(x), np.int64)}),
                   str(path))
    return path


def _generate(data: Path, out: str, store: str, *flags: str) -> int:
    return cli.main(["generate", "--input", str(data), "--output", out,
                     "--embedding-dim", "4", "--epsilon", "1",
                     "--budget-store", store, "--dataset-id", "patients",
                     "--lifetime-epsilon", "1.2", *flags])


def test_relabelling_the_same_records_is_refused_in_one_line(
        store, tmp_path, capsys, monkeypatch):
    data = _two_label_table(tmp_path)
    first = str(tmp_path / "first")
    assert _generate(data, first, store, "--labels", "0",
                     "--label-feature", "label") == 0
    capsys.readouterr()
    (entry,) = before = bs.history(store, "patients")
    assert entry["status"] == bs.PUBLISHED
    reads = []
    monkeypatch.setattr(protocol, "checkpoint", reads.append)
    second = str(tmp_path / "second")
    code = _generate(data, second, store, "--labels", "1",
                     "--label-feature", "label2")
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "label_feature=label," in lines[0]
    assert "label_feature=label2" in lines[0]
    assert "nothing was charged" in lines[0]
    # The state: nothing charged, nothing read, nothing written.
    assert bs.history(store, "patients") == before
    assert "running" not in reads
    assert not os.path.exists(second)
    assert not [p for p in os.listdir(tmp_path) if ".staging-" in p]
    assert bs.history(store, "patients")[0]["status"] == bs.PUBLISHED


def _mech(label: int) -> list[Mechanism]:
    return [Mechanism(f"class={label}/count", "moments", f"class={label}",
                      1.0, 1.0)]


def test_the_store_pins_the_rule_at_the_first_release(store):
    rule = {"label_feature": "label", "labels": [0, 1]}
    bs.reserve(store, "d", "r1", _mech(0), 1.0, DELTA, 50, DELTA,
               label_rule=rule)
    bs.reserve(store, "d", "r2", _mech(1), 1.0, DELTA, None, None,
               label_rule=dict(rule))  # the same rule: fine
    before = bs.history(store, "d")
    for other in ({"label_feature": "label2", "labels": [0, 1]},
                  {"label_feature": "label", "labels": [1]},
                  {"label_feature": "label", "labels": [0, 1, 2]},
                  {"class_folders": ["cat", "dog"], "labels": [0, 1]}):
        with pytest.raises(record.LabelRuleConflict) as err:
            bs.reserve(store, "d", "r3", _mech(0), 1.0, DELTA, None, None,
                       label_rule=other)
        assert type(err.value) is record.LabelRuleConflict
        assert "\n" not in str(err.value)
        assert bs.history(store, "d") == before  # nothing written
    # A retry of a recorded run id under another rule is refused too.
    with pytest.raises(record.LabelRuleConflict):
        bs.reserve(store, "d", "r2", _mech(1), 1.0, DELTA, None, None,
                   label_rule={"label_feature": "x", "labels": [0, 1]})
    # Another dataset id has its own rule.
    bs.reserve(store, "e", "r1", _mech(0), 1.0, DELTA, 50, DELTA,
               label_rule={"label_feature": "label2", "labels": [0, 1]})


def test_the_rule_generate_pins_comes_from_public_flags():
    from dpsynth.pipelines.cli.generate import parser, spec_from_args
    args = parser().parse_args(["--input", "x.parquet", "--labels", "3,1",
                                "--label-feature", "y2"])
    spec = spec_from_args(args, [])
    cfg = spec.generator.config((3, 1))
    assert job_plan.label_rule(spec, cfg) == {"label_feature": "y2",
                                              "labels": [1, 3]}
