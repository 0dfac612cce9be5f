"""The evaluation of a synthetic release on real data (`dpsynth evaluate`'s
operations; ``dpsynth.pipelines.cli.evaluate`` parses its flags and prints).

Protocol (Zhou et al. 2025, arXiv 2506.16661): the paper's two-layer MLP
and a logistic-regression probe trained on the synthetic rows (cut to the
real train size) and scored on the real test set over N seeds, the
non-private ceiling (the same models trained on the real train set) and
per-class distribution metrics (Fréchet distance, k-NN precision/recall,
distance to the closest record against a real holdout). ``run(spec)``
does it all for an ``EvaluateSpec`` and writes the JSON report;
``evaluate_arrays`` scores rows already in memory.

PRIVACY: the ceiling and the distribution metrics read the real training
data and are NOT differentially private. The report is for the data owner;
do not publish it with the release.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Callable, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

from dpsynth.dp_ops.clipping import clip_rows, normalize_rows
from dpsynth.models import classifiers, metrics
# The protocols, the size policies and the learning-rate and demo constants
# are declared with evaluate's options (its flags' choices and help quote
# them).
from dpsynth.pipelines.spec import (DEMO_LOGREG_C, MAX_AUTO_LR, PROTOCOLS,
                                    REFERENCE_STEPS, SIZE_POLICIES,
                                    EvaluateSpec)

# Models whose training is deterministic given the rows (lbfgs): when the
# rows do not depend on the seed either, one fit serves every seed.
DETERMINISTIC_MODELS = ("logreg",)
# generate's demo utility line: scikit-learn's LogisticRegression defaults.
DEMO_LOGREG_MAX_ITER = 2000
PRIVACY_NOTE = ("ceiling and distribution metrics are computed on the real "
                "training data: NOT differentially private; keep this report "
                "with the data owner")


def protocol_settings(spec: EvaluateSpec) -> tuple[int, int]:
    """(seeds, MLP epochs): the protocol's, unless given explicitly."""
    if spec.protocol not in PROTOCOLS:
        raise ValueError(f"--protocol: choose from {list(PROTOCOLS)}, got "
                         f"{spec.protocol!r}")
    chosen = PROTOCOLS[spec.protocol]
    seeds = chosen["seeds"] if spec.seeds is None else spec.seeds
    epochs = (chosen["mlp_epochs"] if spec.mlp.epochs is None
              else spec.mlp.epochs)
    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    if epochs < 1:
        raise ValueError(f"--mlp-epochs must be >= 1, got {epochs}")
    return seeds, epochs


def mlp_config(spec: EvaluateSpec) -> classifiers.MLPConfig:
    """The MLP settings; with no --mlp-lr the paper's rate, which
    `scaled_learning_rate` raises per training set (see --mlp-lr)."""
    mlp = spec.mlp
    lr = (classifiers.MLPConfig().learning_rate if mlp.learning_rate is None
          else mlp.learning_rate)
    return classifiers.MLPConfig(
        hidden=mlp.hidden, epochs=protocol_settings(spec)[1],
        batch_size=mlp.batch_size, learning_rate=lr,
        momentum=mlp.momentum, dropout=mlp.dropout,
        label_smoothing=mlp.label_smoothing,
        weight_decay=mlp.weight_decay, batch_norm=mlp.batch_norm,
        cosine_decay=mlp.cosine_decay)


def sgd_steps(n_rows: int, cfg: classifiers.MLPConfig) -> int:
    return cfg.epochs * int(np.ceil(n_rows / cfg.batch_size))


def scaled_learning_rate(n_rows: int, cfg: classifiers.MLPConfig) -> float:
    """cfg's rate times REFERENCE_STEPS / steps when a run of n_rows makes
    fewer steps than the paper's CIFAR-10 run, at most MAX_AUTO_LR."""
    steps = max(sgd_steps(n_rows, cfg), 1)
    if steps >= REFERENCE_STEPS:
        return cfg.learning_rate
    return min(cfg.learning_rate * REFERENCE_STEPS / steps,
               max(MAX_AUTO_LR, cfg.learning_rate))


def keras_installed() -> bool:
    import importlib.util
    return importlib.util.find_spec("keras") is not None


def default_models() -> str:
    return "mlp,logreg" if keras_installed() else "logreg"


def parse_models(text: Optional[str]) -> list[str]:
    if text is None:
        text = default_models()
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in classifiers.TRAINERS]
    if not names or bad:
        raise ValueError(f"--models: choose from {list(classifiers.TRAINERS)},"
                         f" got {text!r}")
    if "mlp" in names and not keras_installed():
        raise ValueError("--models mlp needs Keras/TensorFlow, which the base "
                         "install leaves out: pip install 'dpsynth[tf]', or "
                         "pass --models logreg")
    return names


# ---------------------------------------------------------- the protocol

def fit_size(x: np.ndarray, y: np.ndarray, n: int, policy: str,
             seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Applies the size policy (see --size-policy)."""
    if policy not in SIZE_POLICIES:
        raise ValueError(f"--size-policy must be one of {SIZE_POLICIES}")
    if policy == "none":
        return x, y
    if len(y) > n:
        return classifiers.subsample_to(x, y, n, seed)
    if policy == "match" and 0 < len(y) < n:
        reps = int(np.ceil(n / len(y)))
        order = np.random.default_rng([seed, 0x71]).permutation(len(y) * reps)[:n]
        return np.tile(x, (reps, 1))[order], np.tile(y, reps)[order]
    return x, y


def size_uses_seed(n_rows: int, n: int, policy: str) -> bool:
    """Whether fit_size draws rows with the seed (else it returns the rows as
    they are)."""
    if policy == "none":
        return False
    return n_rows > n or (policy == "match" and 0 < n_rows < n)


def summary(values: Sequence[float]) -> dict:
    v = np.asarray(values, float)
    return {"accuracies": [float(a) for a in v], "mean": float(v.mean()),
            "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0}


def train_and_score(model: str, x: np.ndarray, y: np.ndarray,
                    x_test: np.ndarray, y_test: np.ndarray,
                    labels: Sequence[int], seed: int,
                    mlp_cfg: classifiers.MLPConfig,
                    logreg_cfg: classifiers.LogRegConfig,
                    scale_lr: bool = False) -> float:
    if model == "mlp":
        if scale_lr:
            mlp_cfg = dataclasses.replace(
                mlp_cfg, learning_rate=scaled_learning_rate(len(y), mlp_cfg))
        clf = classifiers.train_mlp(x, y, labels, mlp_cfg, seed)
    else:
        clf = classifiers.train_logreg(x, y, labels, logreg_cfg, seed)
    return clf.accuracy(x_test, y_test)


def utility(x_syn: np.ndarray, y_syn: np.ndarray, n_real: int,
            x_test: np.ndarray, y_test: np.ndarray, labels: Sequence[int],
            models: Sequence[str], seeds: Sequence[int],
            mlp_cfg: classifiers.MLPConfig,
            logreg_cfg: classifiers.LogRegConfig,
            size_policy: str = "paper",
            progress: Optional[Callable[[str], None]] = None,
            trained_on: str = "synthetic", scale_lr: bool = False) -> dict:
    """Accuracy on the real test set of models trained on (x_syn, y_syn).

    `progress` gets one line per trained model and seed (operator console).
    """
    out: dict = {}
    if len(y_syn) == 0:
        return {m: {"error": "no synthetic rows"} for m in models}
    for model in models:
        accs = []
        for seed in seeds:
            start = time.time()
            if (accs and model in DETERMINISTIC_MODELS
                    and not size_uses_seed(len(y_syn), n_real, size_policy)):
                accs.append(accs[-1])  # same rows, same lbfgs fit
            else:
                xs, ys = fit_size(x_syn, y_syn, n_real, size_policy, seed)
                accs.append(train_and_score(model, xs, ys, x_test, y_test,
                                            labels, seed, mlp_cfg, logreg_cfg,
                                            scale_lr))
            if progress:
                progress(f"{model} trained on {trained_on}, seed {seed}: "
                         f"test accuracy {accs[-1]:.4f} "
                         f"({time.time() - start:.0f} s)")
        out[model] = summary(accs)
    return out


def evaluate_arrays(x_syn: np.ndarray, y_syn: np.ndarray,
                    x_train: np.ndarray, y_train: np.ndarray,
                    x_test: np.ndarray, y_test: np.ndarray,
                    labels: Sequence[int], *, models: Sequence[str] = ("mlp", "logreg"),
                    seeds: Sequence[int] = (0, 1, 2),
                    mlp_cfg: Optional[classifiers.MLPConfig] = None,
                    logreg_cfg: Optional[classifiers.LogRegConfig] = None,
                    size_policy: str = "paper", ceiling: bool = True,
                    distribution: bool = True,
                    x_holdout: Optional[np.ndarray] = None,
                    y_holdout: Optional[np.ndarray] = None,
                    metrics_max_rows: int = 2000, knn_k: int = 3,
                    progress: Optional[Callable[[str], None]] = None,
                    scale_lr: bool = False) -> dict:
    """The whole report, on rows already in the same (normalised) space.

    `progress` (optional) receives one short line per finished step.
    `scale_lr`: raise the MLP's learning rate on small training sets (see
    `scaled_learning_rate`; the CLI's default when --mlp-lr is not given).
    """
    mlp_cfg = mlp_cfg or classifiers.MLPConfig()
    logreg_cfg = logreg_cfg or classifiers.LogRegConfig()
    timings, report = {}, {}
    t = time.time()
    report["synthetic_trained"] = utility(
        x_syn, y_syn, len(y_train), x_test, y_test, labels, models, seeds,
        mlp_cfg, logreg_cfg, size_policy, progress, "synthetic", scale_lr)
    timings["synthetic_trained"] = round(time.time() - t, 2)
    if ceiling:
        t = time.time()
        report["real_trained_ceiling"] = utility(
            x_train, y_train, len(y_train), x_test, y_test, labels, models,
            seeds, mlp_cfg, logreg_cfg, "none", progress, "real (ceiling)",
            scale_lr)
        timings["real_trained_ceiling"] = round(time.time() - t, 2)
    if distribution and len(y_syn):
        t = time.time()
        hx = x_test if x_holdout is None else x_holdout
        hy = y_test if y_holdout is None else y_holdout
        report["distribution"] = metrics.per_class_report(
            x_train, y_train, x_syn, y_syn, hx, hy, k=knn_k,
            max_rows=metrics_max_rows)
        # The same metrics for fresh real rows (the test set) against the
        # train set: the scale a good generator is read against.
        no_rows = np.zeros((0, x_train.shape[1]))
        reference = metrics.per_class_report(
            x_train, y_train, x_test, y_test, no_rows, np.zeros(0, int),
            k=knn_k, max_rows=metrics_max_rows)
        report["distribution"]["real_test_reference"] = reference["mean"]
        timings["distribution"] = round(time.time() - t, 2)
        if progress:
            progress(f"distribution metrics ({timings['distribution']:.0f} s)")
    report["protocol"] = {
        "models": list(models), "seeds": list(seeds),
        "size_policy": size_policy,
        "mlp": dataclasses.asdict(mlp_cfg),
        "mlp_learning_rate_used": {
            "synthetic": mlp_rate(len(y_syn), len(y_train), size_policy,
                                  mlp_cfg, scale_lr),
            "real_train": mlp_rate(len(y_train), len(y_train), "none",
                                   mlp_cfg, scale_lr)},
        "logreg": dataclasses.asdict(logreg_cfg),
        "rows": {"synthetic": int(len(y_syn)), "real_train": int(len(y_train)),
                 "real_test": int(len(y_test))},
        "std": "sample standard deviation over seeds (ddof=1)"}
    report["timings_s"] = timings
    report["privacy_note"] = PRIVACY_NOTE
    return report


def mlp_rate(n_rows: int, n_real: int, policy: str,
             cfg: classifiers.MLPConfig, scale_lr: bool) -> float:
    """The learning rate the MLP trains with on n_rows (after the size
    policy)."""
    if policy == "paper" or (policy == "match" and n_rows):
        n_rows = min(n_rows, n_real) if policy == "paper" else n_real
    return scaled_learning_rate(n_rows, cfg) if scale_lr else cfg.learning_rate


# --------------------------------------------------------------- loading

def _flag_error(flag: str, err: Exception) -> ValueError:
    """The reader's message, naming this command's flag (the readers say --input)."""
    text = str(err)
    if text.startswith("--input "):
        text = flag + text[len("--input"):]
    elif not text.startswith(flag):
        text = f"{flag}: {text}"
    return ValueError(text)


def _is_glob(path: str) -> bool:
    return any(c in path for c in "*?[")


def load_synthetic(path: str) -> tuple[np.ndarray, np.ndarray, Optional[dict]]:
    """A release directory (with manifest) or a labelled data file/glob."""
    from dpsynth.pipelines.release import reading, release
    from dpsynth.transforms.io import InputError, load_arrays
    if "://" not in path and not _is_glob(path) and not os.path.exists(path):
        raise ValueError(f"--synthetic {path!r}: no such release directory "
                         f"or file")
    try:
        if os.path.isdir(path) or release.release_exists(path):
            return reading.load_release(path)
        x, y = load_arrays(path)
    except (InputError, release.ReleaseError) as err:
        raise _flag_error("--synthetic", err) from None
    return x, y, None


def load_real(flag: str, path: str, **read) -> tuple[np.ndarray, np.ndarray]:
    """Real rows for `flag` (--real-train, --real-test, --real-holdout)."""
    from dpsynth.transforms.io import InputError, load_arrays
    try:
        return load_arrays(path, **read)
    except InputError as err:
        raise _flag_error(flag, err) from None


def output_path(spec: EvaluateSpec) -> str:
    """--output, else a file beside what is evaluated: never the working
    directory, where a second evaluation of another release would find the
    first one's report."""
    return spec.output or default_output(spec.synthetic)


def default_output(synthetic: str) -> str:
    """``<release>-evaluation.json`` beside a local release (a file's or
    glob's stem: ``syn-*.npz`` -> ``syn-evaluation.json``); a remote one's
    (gs://) in this user's cache folder, named by its last part."""
    import glob
    stem = synthetic.rstrip("/")
    if "://" not in stem:  # "." names the folder, not "./-evaluation.json"
        stem = os.path.abspath(stem)
    if glob.has_magic(stem):
        stem = stem[:min(stem.index(c) for c in "*?[" if c in stem)]
        stem = stem.rstrip("-_./")
    elif os.path.isfile(stem):
        stem = os.path.splitext(stem)[0]
    if "://" in stem or not os.path.basename(stem):
        base = (os.environ.get("XDG_CACHE_HOME")
                or os.path.join(os.path.expanduser("~"), ".cache"))
        folder = os.path.join(base, "dpsynth-evaluations")
        os.makedirs(folder, exist_ok=True)
        stem = os.path.join(folder, stem.rstrip("/").rsplit("/", 1)[-1]
                            or "synthetic")
    return f"{stem}-evaluation.json"


def check_output(path: str, overwrite: bool) -> None:
    """Refuses to replace a report unless asked, before any work is done."""
    if os.path.isdir(path):
        raise ValueError(f"--output {path!r} is a directory; name a .json file")
    if os.path.exists(path) and not overwrite:
        raise ValueError(f"--output {path!r} already exists; pass --overwrite "
                         f"to replace it or choose another --output")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"--output {path!r}: folder {parent!r} does not exist")


def write_report(path: str, report: dict) -> None:
    """Whole file or nothing: write a temporary file beside it, then rename."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(report, f, indent=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def resolve_normalize(flag: str, manifest: Optional[dict]) -> str:
    if flag != "auto":
        return flag
    if manifest is None:
        raise ValueError("--normalize auto needs a release directory; for a "
                         "plain data file pass --normalize unit|none")
    return manifest.get("config", {}).get("normalize", "none")


def resolve_clip(flag: str, manifest: Optional[dict]) -> Optional[float]:
    """The release's clip norm (applied to real rows too), when known.

    None for a centred release: its clip radius applies to rows minus the
    DP centre, and the synthetic rows are back in the input space.
    """
    if flag != "auto" or manifest is None:
        return None
    config = manifest.get("config", {})
    if config.get("center"):
        return None
    value = config.get("clip_norm")
    return float(value) if value else None


def resolve_labels(given: Optional[Sequence[int]], manifest: Optional[dict],
                   *ys: np.ndarray) -> list[int]:
    if given:
        return [int(v) for v in given]
    if manifest is not None and manifest.get("config", {}).get("labels"):
        return [int(v) for v in manifest["config"]["labels"]]
    return sorted(set(np.concatenate([np.asarray(y) for y in ys]).tolist()))


def release_summary(path: str, manifest: Optional[dict]) -> dict:
    if manifest is None:
        return {"path": path, "release": False}
    privacy = manifest.get("privacy", {})
    return {"path": path, "release": True, "run_id": manifest.get("run_id"),
            "epsilon_spent": privacy.get("spent", {}).get("epsilon"),
            "delta": privacy.get("spent", {}).get("delta"),
            "warnings": manifest.get("warnings", [])}


def made_from_demo(manifest: Optional[dict]) -> bool:
    """Whether a release was made by `dpsynth generate` with no --input."""
    if manifest is None:
        return False
    pattern = manifest.get("input", {}).get("pattern") or ""
    return (os.path.basename(pattern) == "digits-train.npz"
            and os.path.basename(os.path.dirname(pattern)) == "dpsynth-demo")


def resolve_real_paths(spec: EvaluateSpec,
                       manifest: Optional[dict]) -> tuple[str, str, bool]:
    """(train, test, demo): the flags, or the demo's split (see --demo)."""
    given = spec.real_train is not None or spec.real_test is not None
    if spec.demo or (not given and made_from_demo(manifest)):
        if given:
            raise ValueError("--demo picks both real files; drop --real-train "
                             "and --real-test")
        from dpsynth.pipelines import demo
        train, test = demo.demo_files()
        return train, test, True
    missing = [flag for flag, value in (("--real-train", spec.real_train),
                                        ("--real-test", spec.real_test))
               if value is None]
    if missing:
        raise ValueError(f"{' and '.join(missing)} required (only a release "
                         f"made from the embedded demo defaults to its split;"
                         f" or pass --demo)")
    return spec.real_train, spec.real_test, (
        made_from_demo(manifest) and _is_demo_split(spec.real_train,
                                                    spec.real_test))


def _is_demo_split(train: str, test: str) -> bool:
    """Whether the two paths name the demo's own train and test files."""
    from dpsynth.pipelines import demo
    same = lambda a, b: os.path.realpath(a) == os.path.realpath(b)
    demo_train, demo_test = demo.demo_files()
    return same(train, demo_train) and same(test, demo_test)


def logreg_config(spec: EvaluateSpec,
                  demo: bool) -> classifiers.LogRegConfig:
    """The reference probe, or on the demo generate's utility-line one."""
    if spec.logreg_c is not None:
        return classifiers.LogRegConfig(C=spec.logreg_c)
    if demo:
        return classifiers.LogRegConfig(C=DEMO_LOGREG_C,
                                        max_iter=DEMO_LOGREG_MAX_ITER)
    return classifiers.LogRegConfig()


def run(spec: EvaluateSpec,
        progress: Optional[Callable[[str], None]] = None) -> dict:
    """Scores the release, writes the JSON report to ``spec.output`` and
    returns it. Raises ValueError, dpsynth.transforms.io.InputError or
    dpsynth.pipelines.release.release.ReleaseError (before the report is written).
    ``progress`` gets one line per step."""
    say = progress or (lambda message: None)
    output = output_path(spec)
    check_output(output, spec.overwrite)
    models = parse_models(None if spec.models is None
                          else ",".join(spec.models))
    seeds, _ = protocol_settings(spec)
    mlp_cfg = mlp_config(spec)
    x_syn, y_syn, manifest = load_synthetic(spec.synthetic)
    real_train, real_test, demo = resolve_real_paths(spec, manifest)
    if spec.models is None and "mlp" not in models:
        say("no Keras/TensorFlow here: the logistic probe only (pip "
            "install 'dpsynth[tf]' adds the paper's MLP)")
    logreg_cfg = logreg_config(spec, demo)
    size_policy = spec.size_policy or ("none" if demo else "paper")
    norm = resolve_normalize(spec.normalize, manifest)
    read = dict(fmt=spec.input_format,
                embedding_feature=spec.embedding_feature,
                label_feature=spec.label_feature)
    x_tr, y_tr = load_real("--real-train", real_train, **read)
    x_te, y_te = load_real("--real-test", real_test, **read)
    holdout = (load_real("--real-holdout", spec.real_holdout, **read)
               if spec.real_holdout else (None, None))
    for name, x in (("--real-train", x_tr), ("--real-test", x_te)):
        if len(y_syn) and x.shape[1] != x_syn.shape[1]:
            raise ValueError(f"{name}: dimension {x.shape[1]} differs from "
                             f"the synthetic rows' {x_syn.shape[1]}")
    labels = resolve_labels(spec.labels, manifest, y_syn, y_tr, y_te)
    clip = resolve_clip(spec.normalize, manifest)
    if demo:
        say(f"real rows: the embedded demo's split, train "
            f"{real_train}, test {real_test}")
    say(f"loaded {len(y_syn)} synthetic, {len(y_tr)} real train, "
        f"{len(y_te)} real test rows; protocol {spec.protocol}: "
        f"{len(models)} model(s) x {seeds} seed(s)"
        f"{' x 2 training sets' if spec.ceiling else ''}, "
        f"MLP {mlp_cfg.epochs} epochs")

    def prep(a):
        """The release's public per-record map: normalise, then clip."""
        if a is None:
            return None
        a = normalize_rows(np.asarray(a, np.float64), norm)
        return a if clip is None else clip_rows(a, clip)[0]
    # Rebinding frees the raw copies (~0.5 GB each on CIFAR-10 size).
    x_syn, x_tr, x_te = np.asarray(x_syn, np.float64), prep(x_tr), prep(x_te)
    holdout = (prep(holdout[0]), holdout[1])
    t0 = time.time()
    report = evaluate_arrays(
        x_syn, y_syn, x_tr, y_tr, x_te, y_te, labels, models=models,
        seeds=list(range(seeds)), mlp_cfg=mlp_cfg,
        logreg_cfg=logreg_cfg, size_policy=size_policy,
        ceiling=spec.ceiling, distribution=spec.distribution,
        x_holdout=holdout[0], y_holdout=holdout[1],
        metrics_max_rows=spec.metrics_max_rows, knn_k=spec.knn_k,
        progress=progress, scale_lr=spec.mlp.learning_rate is None)
    report["protocol"]["name"] = spec.protocol
    report["synthetic"] = release_summary(spec.synthetic, manifest)
    report["real"] = {"train": real_train, "test": real_test,
                      "holdout": spec.real_holdout or real_test,
                      "normalize": norm, "clip_norm": clip, "demo": demo}
    report["labels"] = labels
    report["timings_s"]["total"] = round(time.time() - t0, 2)
    write_report(output, report)
    return report
