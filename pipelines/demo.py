"""The embedded demo dataset: scikit-learn's bundled digits (no download).

1,797 real 8x8 handwritten digit images, 10 classes, shipped inside
scikit-learn. Public feature map: the 64 pixel intensities divided by 16
(so each coordinate is in [0, 1]). Split: a fixed permutation (seed 0) puts
80 % in the private training file and 20 % in the held-out test file.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np

DEMO_LABELS = tuple(range(10))


def demo_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits
    digits = load_digits()
    x = digits.data.astype(np.float64) / 16.0
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return x[train], y[train], x[test], y[test]


def demo_folder() -> str:
    """This user's folder for the demo's files: ``$XDG_CACHE_HOME`` (else
    ``~/.cache``) ``/dpsynth-demo``. Never a fixed folder in /tmp, which the
    first account to run the demo owns (the next one cannot write there)
    and anyone can plant files in; a fresh private temporary folder where
    the cache is not writable. The folder is always named dpsynth-demo
    (``evaluate`` knows a demo release by it)."""
    base = (os.environ.get("XDG_CACHE_HOME")
            or os.path.join(os.path.expanduser("~"), ".cache"))
    folder = os.path.join(base, "dpsynth-demo")
    try:
        os.makedirs(folder, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return os.path.join(tempfile.mkdtemp(prefix="dpsynth-"), "dpsynth-demo")


def demo_files(directory: str | None = None) -> tuple[str, str]:
    """Writes (once) and returns the demo train/test .npz paths."""
    directory = directory or demo_folder()
    os.makedirs(directory, exist_ok=True)
    train = os.path.join(directory, "digits-train.npz")
    test = os.path.join(directory, "digits-test.npz")
    if not (os.path.exists(train) and os.path.exists(test)):
        xtr, ytr, xte, yte = demo_arrays()
        for path, x, y in ((train, xtr, ytr), (test, xte, yte)):
            tmp = path + f".tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                np.savez(f, embeddings=x, labels=y)
            os.replace(tmp, path)
    return train, test


def utility_line(release: str, test_path: str, train_path: str) -> str:
    """Same classifier on real vs synthetic data, scored on held-out test.

    This reads the (public) demo data, so printing the real-data accuracy is
    fine here; on private data use ``dpsynth evaluate`` on public test data.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from dpsynth.dp_ops.clipping import normalize_rows
    from dpsynth.pipelines.release import load_release
    from dpsynth.transforms.io import load_arrays

    xs, ys, manifest = load_release(release)
    xtr, ytr = load_arrays(train_path)
    xte, yte = load_arrays(test_path)
    norm = manifest["config"]["normalize"]
    prep = lambda x: normalize_rows(x, norm)

    def score(x, y) -> float:
        if len(np.unique(y)) < 2:
            return float("nan")
        clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
        return clf.fit(prep(x), y).score(prep(xte), yte)

    real, synth = score(xtr, ytr), score(xs, ys)
    return (f"utility (logistic regression, scored on {len(yte)} held-out demo "
            f"rows): trained on real {real:.3f}, trained on synthetic "
            f"{synth:.3f} ({len(ys)} synthetic rows)")
