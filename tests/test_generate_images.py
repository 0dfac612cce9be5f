"""`dpsynth generate --images`: encode in the workers, then the DP job."""

import json

from pipelines import cli
from tests.conftest import shared_image_subset
from tests.test_encoders import _tiny_keras


def test_generate_from_images_end_to_end(tmp_path):
    root = shared_image_subset("train", 12, tmp_path / "images")
    model = tmp_path / "tiny.keras"
    _tiny_keras(model)
    out = tmp_path / "release"
    assert cli.main(["generate", "--images", str(root), "--encoder",
                     f"keras:{model}", "--embedding-dim", "6",
                     "--image-size", "16,16", "--output", str(out),
                     "--epsilon", "8", "--clusters", "2",
                     "--noise-seed", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["embedding_dim"] == 6
    assert manifest["config"]["labels"] == [0, 1]
    assert manifest["privacy"]["spent"]["epsilon"] <= 8
    assert manifest["input"]["files"] == [str(root)]
