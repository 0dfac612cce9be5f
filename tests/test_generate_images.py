"""`dpsynth generate --images`: encode in the workers, then the DP job.

The label set is public configuration on this path too (``--classes``);
unreadable images are skipped one by one, so whether a release exists does
not depend on how many there are.
"""

import io
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from dpsynth.pipelines import cli
from dpsynth.pipelines.cli import generate
from tests.conftest import shared_image_subset
from tests.test_encoders import _tiny_keras


def _release_args(tmp_path, root, *extra):
    model = tmp_path / "tiny.keras"
    if not model.exists():
        _tiny_keras(model)
    return ["generate", "--images", str(root), "--encoder", f"keras:{model}",
            "--embedding-dim", "6", "--image-size", "16,16",
            "--epsilon", "8", "--noise-seed", "1", *map(str, extra)]


def test_generate_from_images_end_to_end(tmp_path):
    root = shared_image_subset("train", 12, tmp_path / "images")
    (root / "cat" / "broken.jpg").write_bytes(b"not an image")  # skipped
    out = tmp_path / "release"
    assert cli.main(_release_args(tmp_path, root, "--classes", "cat,ship",
                                  "--clusters", "2", "--output", out)) == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["embedding_dim"] == 6
    assert manifest["config"]["labels"] == [0, 1]
    assert manifest["privacy"]["spent"]["epsilon"] <= 8
    assert manifest["input"]["pattern"] == str(root)
    assert "broken" not in (out / "_manifest.json").read_text()


def test_folder_layout_without_classes_is_refused_before_reading(tmp_path,
                                                                  capsys):
    root = tmp_path / "empty-on-purpose"  # never listed: refused first
    rc = cli.main(_release_args(tmp_path, root, "--output", tmp_path / "r"))
    assert rc == 2
    assert "--classes" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.full((8, 8, 3), seed, np.uint8)).save(buf, "PNG")
    return buf.getvalue()


def _tree(root, counts: dict):
    for name, n in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(n):
            (root / name / f"{i}.png").write_bytes(_png(10 * i + len(name)))
    return root


def _plan(root, classes):
    parser = generate.parser()
    args = parser.parse_args(["--images", str(root), "--classes", classes,
                              "--encoder", "keras:/nowhere.keras",
                              "--embedding-dim", "6", "--output",
                              str(root) + "-out", "--epsilon", "2"])
    from dpsynth.pipelines import job_plan
    job = job_plan.prepare(generate.spec_from_args(args))
    return job.cfg.labels, [m.to_dict() for m in job.ledger.mechanisms]


def _labelled_files(root, classes):
    from dpsynth.transforms.images import _class_files
    return {p[len(str(root)):]: label
            for label, name in enumerate(classes)
            for p, label in _class_files((str(root), name, label))}


def test_neighbouring_image_trees_get_the_same_labels_and_plan(tmp_path):
    """Two trees differing by one image, here the only image of 'dog': the
    same label set, the same mechanisms, the same label for every other
    image; the empty class still gets its noisy outputs."""
    a = _tree(tmp_path / "a", {"cat": 2, "dog": 1, "bird": 2})
    b = tmp_path / "b"
    shutil.copytree(a, b)
    (b / "dog" / "0.png").unlink()
    classes = "cat,dog,bird"
    assert _plan(a, classes) == _plan(b, classes)
    files_a = _labelled_files(a, classes.split(","))
    files_b = _labelled_files(b, classes.split(","))
    assert files_b == {k: v for k, v in files_a.items() if k != "/dog/0.png"}
    assert files_a["/bird/0.png"] == 2
    shutil.rmtree(b / "dog")  # a missing class folder: an empty class
    assert _labelled_files(b, classes.split(",")) == files_b
    assert _plan(b, classes) == _plan(a, classes)


def test_unreadable_images_never_decide_whether_a_release_exists(tmp_path):
    """n readable images and any number of unreadable ones: a release, with
    every configured class; the skipped count goes to the operator counter
    and the report file only."""
    root = _tree(tmp_path / "imgs", {"cat": 3, "dog": 0})
    for i in range(4):
        (root / "dog" / f"bad{i}.jpg").write_bytes(b"corrupt")
    out, report = tmp_path / "r", tmp_path / "bad.tsv"
    assert cli.main(_release_args(tmp_path, root, "--classes", "cat,dog",
                                  "--bad-images-report", report,
                                  "--output", out)) == 0
    manifest = json.loads((out / "_manifest.json").read_text())
    assert [c["label"] for c in manifest["classes"]] == [0, 1]
    assert len(report.read_text().splitlines()) == 4  # operator file
    for name in ("bad0", "corrupt", "4 "):
        assert name not in (out / "_manifest.json").read_text()


def test_generate_has_no_max_bad_images_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(_release_args(tmp_path, tmp_path, "--classes", "a",
                               "--max-bad-images", "3"))
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "--max-bad-images is an encode-only flag" in err
    assert len(err.splitlines()) == 1
