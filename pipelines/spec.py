"""What a `dpsynth generate` run is asked to do, as typed values.

The command line turns its flags into one ``GenerateSpec`` (see
``dpsynth.pipelines.cli.generate.spec_from_args``); everything below the
command line (``dpsynth.pipelines.job``, the Beam transforms) takes these
values, never parsed flags. Python callers (the Airflow DAG, benchmarks,
notebooks) build them directly and call ``dpsynth.pipelines.api.generate``.
Every field is public configuration: nothing here is read from the private
data.

Each option of `dpsynth generate`, `encode` and `evaluate` is declared
once, here, by its field (``option``): the field's default is the flag's
(the generator's are ``GeneratorConfig``'s, the MLP's ``MLPConfig``'s,
referenced), and the field carries its flag, help and how its text is read
(type, choices, a switch). The commands build their parsers from the
fields and read the parsed flags back through them
(``dpsynth.pipelines.cli.spec_flags``).

This module imports neither Beam nor TensorFlow, so building a spec is
instant.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional, Sequence

from dpsynth.dp_ops.clipping import NORMALIZATIONS
from dpsynth.dp_ops.config import (COVARIANCE_MODES, GeneratorConfig,
                                   parse_epsilon, parse_weights)
from dpsynth.dp_ops.ledger import ACCOUNTANTS
# numpy only: Keras loads inside the trainers.
from dpsynth.models.classifiers import LogRegConfig, MLPConfig
# names only: each encoder's framework loads when it is built.
from dpsynth.models.encoders.registry import list_encoders
from dpsynth.transforms.formats import (FORMATS, IMAGE_LAYOUTS,
                                        NON_FINITE_POLICIES, OUTPUT_FORMATS,
                                        SPLIT_BYTES, ImageInputError)


def option(flag: str, default: Any = None, *, help: str,
           type: Optional[Callable[[str], Any]] = None,
           parse: Optional[Callable[[str], Any]] = None,
           choices: Optional[Sequence[str]] = None,
           metavar: Optional[str] = None, switch: bool = False,
           off_switch: bool = False, negatable: bool = False,
           required: bool = False,
           to_spec: Optional[Callable[[Any], Any]] = None) -> Any:
    """A spec field and its command-line flag, declared once: ``default``
    is the field's and the flag's. The flag's text is read by ``type``
    (int, float: the parser's own error) or ``parse`` (dpsynth's reader: its
    ValueError is the one-line error); ``switch``: a flag without a value
    that sets True; ``off_switch``: one that sets False (``--no-x`` of a
    field that is on by default); ``negatable``: --x / --no-x;
    ``required``: the field has no default and the flag must be given;
    ``to_spec`` turns the parsed value into the field's (default: as
    parsed; its ValueError is raised when the spec is built)."""
    metadata = {
        "flag": flag, "help": help, "type": type, "parse": parse,
        "choices": choices, "metavar": metavar, "switch": switch,
        "off_switch": off_switch, "negatable": negatable,
        "required": required, "to_spec": to_spec}
    if required:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# ------------------------------------------------ the flags' value readers

def _epsilon(text: str) -> float:
    try:
        return parse_epsilon(text)
    except ValueError as err:
        raise ValueError(str(err).replace("--epsilon ", "")) from None


def _lifetime_epsilon(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):  # a cap of inf is no cap
        raise ValueError(f"must be a finite number > 0, got {text}")
    return value


def _labels(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"expected comma-separated integers, got {text!r}") from None


def _tuple_or_none(values: Optional[list]) -> Optional[tuple]:
    return tuple(values) if values else None


def _columns(text: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in text.split(","))
    if not all(names):
        raise ValueError(
            f"expected comma-separated column names or patterns, got {text!r}")
    return names


def _weights(text: str) -> dict:
    try:
        return parse_weights(text)
    except ValueError as err:
        raise ValueError(
            str(err).replace("--budget-weights: ", "")) from None


def _image_size(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    try:
        size = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--image-size must be H,W or S, got {text!r}") from None
    size = size * 2 if len(size) == 1 else size
    if len(size) != 2 or min(size) < 1:
        raise ValueError(f"--image-size must be H,W or S, got {text!r}")
    return size


def _classes(text: Optional[str]) -> Optional[tuple[str, ...]]:
    """--classes as a tuple of names (None when not given); duplicates are
    refused (ImageInputError, when the spec is built)."""
    if not text:
        return None
    names = [c.strip() for c in text.split(",") if c.strip()]
    if len(set(names)) != len(names):
        raise ImageInputError(f"--classes has duplicates: {text!r}")
    return tuple(names) if names else None


def _evaluate_labels(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """evaluate's --labels 0,1,2 as integers (None when not given)."""
    if text is None:
        return None
    try:
        return tuple([int(v) for v in text.split(",") if v.strip()])
    except ValueError:
        raise ValueError(f"--labels: expected integers, got {text!r}") from None


# ---------------------------------------------------------------- generate

@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """`generate --images`: images encoded by a public encoder in the
    workers, then the DP job on the embeddings (and `dpsynth encode`'s
    images; the help that differs in `generate` is ``cli.image_flags``')."""

    # folder-per-class ROOT, or a glob of .tfrecord / .npz files
    path: str = option(
        "--images", required=True,
        help="ROOT of a folder-per-class layout (ROOT/<class>/*.jpg|png), or a glob of .tfrecord "
             "files (tf.train.Example: encoded image + int64 label) or .npz files (images uint8, "
             "labels); local or gs://")
    encoder: str = option(
        "--encoder", "efficientnet-lite0",
        help="encoder name: " + ", ".join(list_encoders()) + " (default efficientnet-lite0)")
    encoder_weights: Optional[str] = option(
        "--encoder-weights",
        help="local or gs:// copy of a named encoder's weights (CLIP: a keras-hub preset folder)")
    image_size: Optional[tuple[int, int]] = option(
        "--image-size", parse=_image_size,
        help="H,W input size for keras:/onnx: models")
    pixel_scale: Optional[str] = option(
        "--pixel-scale",
        help="pixel scaling for keras:/onnx: models: raw, unit (default), symmetric, effnet, "
             "imagenet, clip")
    resize_mode: Optional[str] = option(
        "--resize-mode", choices=("resize", "resize_crop"),
        help="keras:/onnx: models: plain resize (default) or shorter side + centre crop")
    encoder_output_key: Optional[str] = option(
        "--encoder-output-key", help="output name of a multi-output SavedModel")
    encoder_threads: Optional[int] = option(
        "--encoder-threads", type=int,
        help="framework threads per worker (default: CPU cores / DirectRunner workers)")
    batch_size: int = option(
        "--batch-size", 64, type=int,
        help="images per RunInference batch (default 64)")
    l2_normalize: bool = option(
        "--l2-normalize", False, switch=True,
        help="L2-normalise each embedding (public, per-row)")
    bad_images_report: Optional[str] = option(
        "--bad-images-report",
        help="write the unreadable files (name, reason) here: an operator file naming private "
             "files (default for encode: next to output)")
    # folder names in label order
    classes: Optional[tuple[str, ...]] = option(
        "--classes", to_spec=_classes,
        help="comma-separated class folder names in label order (default: all folders, sorted)")
    layout: Optional[str] = option(
        "--image-layout", choices=IMAGE_LAYOUTS,
        help="override layout detection")
    image_feature: Optional[str] = option(
        "--image-feature", help="TFRecord image bytes feature (default: auto)")
    # generate: its own --label-feature (InputOptions')
    label_feature: Optional[str] = option(
        "--label-feature", help="TFRecord int64 label feature (default: auto)")


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """The private input and its public schema."""

    # glob of .npz / TFRecord / Parquet / CSV; None: demo
    path: Optional[str] = option(
        "--input",
        help="glob of .npz / TFRecord / Parquet / CSV files (local or "
             "gs://); default: the embedded digits demo")
    format: Optional[str] = option(
        "--input-format", choices=FORMATS,
        help="default: from the file extension")
    embedding_feature: str = option(
        "--embedding-feature", "embedding",
        help="TFRecord feature / Parquet column of the vector (CSV: a list "
             "column, or columns <name>_0, <name>_1, ...)")
    label_feature: str = option(
        "--label-feature", "label",
        help="TFRecord feature / Parquet or CSV column of the label (with "
             "--images: the image TFRecords' label feature)")
    non_finite: str = option(
        "--non-finite", "reject", choices=NON_FINITE_POLICIES,
        help="rows with NaN/inf: fail the run (default) or drop them (a "
             "per-record rule, DP-safe)")
    block_size: int = option(
        "--block-size", 4096, type=int,
        help="rows per numpy block moved between stages")
    split_bytes: int = option(
        "--split-bytes", SPLIT_BYTES, type=int,
        help="input files are read in byte ranges of this size, spread over "
             "the workers (default 64 MiB); a compressed .npz is read whole")
    # default: from the files' schema
    embedding_dim: Optional[int] = option(
        "--embedding-dim", type=int,
        help="the embedding dimension (public). Every row must have it, and "
             "an input with no rows is still released (default: the .npz "
             "header, a fixed-size Parquet list, or the first row of a "
             "Parquet list column, when an empty input is refused; REQUIRED "
             "for TFRecord and CSV list columns, which do not say it). "
             "--images with a keras:/onnx: encoder: its output dimension")
    # CSV/Parquet: one column per dimension, by name or glob ("f*")
    embedding_columns: Optional[tuple[str, ...]] = option(
        "--embedding-columns", parse=_columns, metavar="COLS",
        help="CSV/Parquet: one numeric column per dimension, named "
             "(x0,x1,x2) or by glob pattern ('f*', 'dim_*'; in the file's "
             "column order, the label column never); instead of "
             "--embedding-feature's column(s)")
    # labels 0..N-1
    num_classes: Optional[int] = option(
        "--num-classes", type=int,
        help="labels are 0..N-1 (public); REQUIRED with --input unless "
             "--labels")
    # or an explicit label set
    labels: Optional[tuple[int, ...]] = option(
        "--labels", parse=_labels, to_spec=_tuple_or_none,
        help="explicit public label list, e.g. 0,1,7 (instead of "
             "--num-classes)")
    images: Optional[ImageOptions] = None


@dataclasses.dataclass(frozen=True)
class GeneratorOptions:
    """The privacy target and the generator (``dpsynth.dp_ops.config``'s
    ``GeneratorConfig`` without the label set, which comes with the input).
    ``noise_seed``: SECRET seed of reproducible noise, for tests and audits
    only: the release is then marked not private."""

    epsilon: float = option(
        "--epsilon", GeneratorConfig.epsilon, parse=_epsilon,
        help="total epsilon of the release ('inf': no noise, NOT private, "
             "for debugging)")
    delta: float = option(
        "--delta", GeneratorConfig.delta, type=float,
        help="delta of the release; values above 1e-4 are refused unless "
             "--allow-large-delta (delta must be far below 1/n, and n is "
             "private)")
    allow_large_delta: bool = option(
        "--allow-large-delta", False, switch=True,
        help="accept a delta above 1e-4 (testing only)")
    accountant: str = option(
        "--accountant", GeneratorConfig.accountant, choices=ACCOUNTANTS,
        help="how the mechanisms are composed: privacy loss distributions "
             "(tight) or Renyi DP")
    budget_weights: Optional[dict] = option(
        "--budget-weights", parse=_weights,
        help="share of the budget per stage, naming exactly the enabled "
             "stages and summing to 1; the default stages are centre, "
             "moments, covariance, e.g. "
             "centre=0.02,moments=0.38,covariance=0.6 (+tree, lloyd with "
             "--clusters > 1, +vote with --vote-filter; defaults: centre "
             "0.01, tree 0.1, lloyd 0.15, moments 0.3, covariance 0.45, vote "
             "0.1, renormalised over the enabled stages)")
    noise_seed: Optional[int] = option(
        "--noise-seed", type=int,
        help="SECRET seed for reproducible noise (tests and audits): the "
             "release is marked NOT private; refused with --budget-store. "
             "Default: secure non-reproducible noise")
    clusters: int = option(
        "--clusters", GeneratorConfig.clusters, type=int,
        help="k per class (DP k-means: LSH-tree coreset + Lloyd)")
    clip_norm: float = option(
        "--clip-norm", GeneratorConfig.clip_norm, type=float,
        help="L2 clip radius R applied to every (centred) record")
    normalize: str = option(
        "--normalize", GeneratorConfig.normalize, choices=NORMALIZATIONS,
        help="public per-record normalisation before clipping")
    center: bool = option(
        "--center", GeneratorConfig.center,
        negatable=True,
        help="subtract a DP mean of all rows (stage 'centre') before "
             "clipping to --clip-norm")
    cluster_dim: int = option(
        "--cluster-dim", GeneratorConfig.cluster_dim, type=int,
        help="dimension of the public random projection used for clustering")
    tree_depth: int = option(
        "--tree-depth", GeneratorConfig.tree_depth, type=int,
        help="levels of the LSH prefix tree of DP k-means")
    branch_threshold: Optional[float] = option(
        "--branch-threshold", GeneratorConfig.branch_threshold, type=float,
        help="noisy count a tree node needs to branch (default: 3 x its "
             "noise sigma)")
    lloyd_rounds: int = option(
        "--lloyd-rounds", GeneratorConfig.lloyd_rounds, type=int,
        help="DP Lloyd rounds after the tree's centres")
    variance_floor: float = option(
        "--variance-floor", GeneratorConfig.variance_floor, type=float,
        help="smallest variance of a mixture component, as a fraction of "
             "clip-norm^2 / d")
    covariance_rank: int = option(
        "--covariance-rank", GeneratorConfig.covariance_rank, type=int,
        help="add rank-r covariance factors (DP second-moment matrix, stage "
             "'covariance'); 0: diagonal only")
    # the CLI default: the adaptive plan
    covariance: str = option(
        "--covariance", "auto", choices=COVARIANCE_MODES,
        help="'auto' (default): a small budget on noisy class counts, then a "
             "public rule picks shared, shared + class subspace or per-class "
             "matrices and the mean / covariance split (docs/method.md: "
             "Covariance defaults; needs --clusters 1, --center, no "
             "--budget-weights, embedding input, else it is "
             "'shared'); 'shared': one matrix of all records; 'subspace': "
             "the shared matrix plus each class's matrix in its top subspace "
             "(the two-phase plan with this structure fixed); 'per-class': "
             "one matrix per class (which wins where: README: What the job "
             "does)")
    samples_per_class: Optional[int] = option(
        "--samples-per-class", GeneratorConfig.samples_per_class, type=int,
        help="default: the noisy class count")
    seed: int = option(
        "--seed", GeneratorConfig.seed, type=int,
        help="public seed: hyperplanes, projections, sampling")
    vote_filter: bool = option(
        "--vote-filter", GeneratorConfig.vote_filter, switch=True,
        help="DP nearest-neighbour vote: each record votes for its nearest "
             "candidate; the release draws its rows (as many as without the "
             "vote) from the candidates in proportion to the noisy votes. "
             "In the adaptive plan it runs only where its noise lets a "
             "candidate's votes show (a public rule of epsilon, delta and "
             "the candidates per row; otherwise the plain release, said in "
             "the log and the manifest)")
    vote_threshold: Optional[float] = option(
        "--vote-threshold", GeneratorConfig.vote_threshold, type=float,
        help="legacy rule instead: keep each candidate with at least this "
             "many noisy votes, once (the release shrinks as epsilon grows)")
    vote_share: Optional[float] = option(
        "--vote-share", GeneratorConfig.vote_share, type=float,
        help="share of the budget (of mu^2) for the vote in the adaptive "
             "plan (default: 0.05; giving it runs the vote whatever its "
             "noise)")
    vote_oversample: float = option(
        "--vote-oversample", GeneratorConfig.vote_oversample, type=float,
        help="candidates generated per wanted sample")
    vote_max_candidates: Optional[int] = option(
        "--vote-max-candidates", GeneratorConfig.vote_max_candidates, type=int,
        help="public cap on vote candidates per class (the nearest-neighbour "
             "search costs n x candidates x d)")

    def config(self, labels: tuple[int, ...]) -> GeneratorConfig:
        """The generator configuration for the public label set."""
        names = {f.name for f in dataclasses.fields(GeneratorConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items()
                  if k in names}
        return GeneratorConfig(labels=tuple(labels), **values)


@dataclasses.dataclass(frozen=True)
class OutputOptions:
    """Where and how the release is written."""

    # default: dpsynth-releases/<run id>
    path: Optional[str] = option(
        "--output",
        help="release directory (local or gs://); default: "
             "./dpsynth-releases/<run id>")
    # replace a release of ANOTHER run id
    overwrite: bool = option(
        "--overwrite", False, switch=True,
        help="replace a release of another run id at --output")
    run_id: Optional[str] = option(
        "--run-id",
        help="names this run in the manifest and the budget store; "
             "re-running a run id re-publishes its staged release or does "
             "nothing if published (default: random)")
    rows_per_shard: int = option(
        "--rows-per-shard", 50_000, type=int,
        help="at most this many synthetic rows per data file (a class's rows "
             "are split evenly over as few files as that allows)")
    # or "parquet"
    format: str = option(
        "--output-format", "tfrecord", choices=OUTPUT_FORMATS,
        help="data shards: TFRecord of tf.train.Example (default) or "
             "Parquet; _schema.json describes either")


@dataclasses.dataclass(frozen=True)
class BudgetOptions:
    """The lifetime budget store (None: no lifetime accounting)."""

    store: Optional[str] = option(
        "--budget-store",
        help="directory or gs:// prefix of the lifetime budget ledger; "
             "enables the lifetime cap")
    dataset_id: Optional[str] = option(
        "--dataset-id",
        help="names the private dataset in the budget store")
    # pins the cap on first use
    lifetime_epsilon: Optional[float] = option(
        "--lifetime-epsilon", parse=_lifetime_epsilon,
        help="lifetime epsilon cap of --dataset-id: needed the first time, "
             "then pinned in the store (a larger value is refused; `dpsynth "
             "budget set-cap` changes it)")
    lifetime_delta: Optional[float] = option(
        "--lifetime-delta", type=float,
        help="delta at which the lifetime epsilon is measured, pinned with "
             "the cap (default: --delta)")


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the job runs (none of it changes the release's bits)."""

    beam_args: tuple[str, ...] = ()  # Beam pipeline options (--runner ...)
    materialise_blocks: bool = option(
        "--materialise-blocks", False, switch=True,
        help="read the input once and keep the blocks in the runner between "
             "passes (default: every pass re-reads the files, so memory does "
             "not grow with n)")
    verbose: bool = option(
        "--verbose", False, switch=True,
        help="also show Beam's and other libraries' logs, and the matched "
             "input file names")
    # Operator diagnostics, NOT differentially private: exact row counts on
    # the progress lines, wall times at the end.
    show_row_counts: bool = option(
        "--show-row-counts", False, switch=True,
        help="progress lines show the exact rows each pass has read "
             "(operator diagnostics: exact counts are private and NOT "
             "differentially private; off by default because schedulers "
             "forward the console to shared logs)")
    record_timings: bool = option(
        "--record-timings", False, switch=True,
        help="print the wall times of the run's steps on the console "
             "(operator diagnostics: they grow with n, so they are NOT "
             "differentially private and never go into the release)")
    # Where the launcher puts the run's secret noise key for the workers
    # (a prefix readable only by the job's service account), instead of
    # pickling it into the job graph; required on DataflowRunner.
    noise_key_location: Optional[str] = option(
        "--noise-key-location",
        help="a prefix (gs://...) readable only by the job's service "
             "account: the launcher writes the run's secret noise key there "
             "for the workers and deletes it after the run, so the key is "
             "not in the job graph the service stores. Required with "
             "DataflowRunner")


@dataclasses.dataclass(frozen=True)
class GenerateSpec:
    """One `dpsynth generate` run."""

    input: InputOptions = InputOptions()
    generator: GeneratorOptions = GeneratorOptions()
    output: OutputOptions = OutputOptions()
    budget: BudgetOptions = BudgetOptions()
    run: RunOptions = RunOptions()

    @property
    def secure_noise(self) -> bool:
        """Whether the run draws private noise (no --noise-seed, finite
        epsilon): then its key must stay out of any graph others read."""
        return (self.generator.noise_seed is None
                and not math.isinf(self.generator.epsilon))


# ------------------------------------------------------------------ encode

@dataclasses.dataclass(frozen=True)
class EncodeSpec:
    """One `dpsynth encode` run: labelled images -> embeddings + labels
    (data preparation inside the trust boundary, not a release).
    ``images.bad_images_report`` None: next to the output."""

    images: ImageOptions
    # OUT.npz or OUT.tfrecord, local or gs://
    output: str = option(
        "--output", required=True,
        help="OUT.npz or OUT.tfrecord (local or gs://); a labels JSON is written next to it")
    # TFRecord output shards
    num_shards: int = option(
        "--num-shards", 1, type=int,
        help="TFRecord output shards (1: exactly --output; more: OUT-SSSSS-of-NNNNN)")
    # also store each row's source file
    keep_source_ids: bool = option(
        "--keep-source-ids", False, switch=True,
        help="also store each row's source file (npz array `sources`, TFRecord bytes `source`)")
    # stop the run above this many unreadable images
    max_bad_images: int = option(
        "--max-bad-images", 0, type=int,
        help="stop the run if more images than this cannot be read or decoded")
    beam_args: tuple[str, ...] = ()  # Beam pipeline options (--runner ...)
    verbose: bool = option(
        "--verbose", False, switch=True,
        help="also show Beam's and other libraries' logs")


# ---------------------------------------------------------------- evaluate

SIZE_POLICIES = ("paper", "match", "none")

# Training budget per protocol; --seeds / --mlp-epochs override either.
# quick keeps the paper's 50 MLP epochs: 10 epochs under-fit by ~4 points on
# the CIFAR-10 release (0.703 vs 0.741, measured), so one seed is the saving.
PROTOCOLS = {
    "quick": {"seeds": 1, "mlp_epochs": MLPConfig().epochs},
    "full": {"seeds": 3, "mlp_epochs": MLPConfig().epochs},
}
# The paper's CIFAR-10 recipe makes 98 batches of 512 x 50 epochs = 4,900
# SGD steps; at lr 1e-3 a small set's few steps under-fit (the demo's 1,437
# real rows: 150 steps, 0.66 test accuracy; 0.975 with lr scaled up).
REFERENCE_STEPS = 4900
MAX_AUTO_LR = 0.1
# generate's demo utility line: scikit-learn's LogisticRegression defaults.
DEMO_LOGREG_C = 1.0


@dataclasses.dataclass(frozen=True)
class MLPOptions:
    """The paper's two-layer MLP (App. C.3 defaults). ``epochs`` None: the
    protocol's; ``learning_rate`` None: the paper's, raised on small
    training sets (see
    ``dpsynth.pipelines.evaluation.scaled_learning_rate``)."""

    hidden: int = option(
        "--mlp-hidden", MLPConfig.hidden, type=int, help="hidden units")
    epochs: Optional[int] = option(
        "--mlp-epochs", type=int,
        help="training epochs (default: the protocol's)")
    batch_size: int = option(
        "--mlp-batch-size", MLPConfig.batch_size, type=int,
        help="batch size")
    learning_rate: Optional[float] = option(
        "--mlp-lr", type=float,
        help="initial SGD learning rate (default: the paper's "
             "%g, raised on small sets to %g x %d / SGD steps, at "
             "most %g, so that they train as much as the paper's "
             "CIFAR-10 runs: its 50,000 rows / batch 512 x 50 epochs "
             "= %d steps; the demo's 1,437 rows make %d)" % (
                 MLPConfig.learning_rate, MLPConfig.learning_rate,
                 REFERENCE_STEPS, MAX_AUTO_LR,
                 REFERENCE_STEPS, 3 * MLPConfig.epochs))
    momentum: float = option(
        "--mlp-momentum", MLPConfig.momentum, type=float, help="SGD momentum")
    dropout: float = option(
        "--mlp-dropout", MLPConfig.dropout, type=float,
        help="dropout after the hidden layer")
    label_smoothing: float = option(
        "--mlp-label-smoothing", MLPConfig.label_smoothing, type=float,
        help="label smoothing")
    weight_decay: float = option(
        "--mlp-weight-decay", MLPConfig.weight_decay, type=float,
        help="weight decay")
    batch_norm: bool = option(
        "--mlp-no-batch-norm", MLPConfig.batch_norm, off_switch=True,
        help="no batch normalisation after the hidden layer")
    cosine_decay: bool = option(
        "--mlp-no-cosine", MLPConfig.cosine_decay, off_switch=True,
        help="constant learning rate instead of cosine decay")


@dataclasses.dataclass(frozen=True)
class EvaluateSpec:
    """One `dpsynth evaluate` run: a synthetic release scored on real data.
    The report reads the real training data and is NOT differentially
    private."""

    # release directory, or a labelled data file or glob
    synthetic: str = option(
        "--synthetic", required=True,
        help="release directory (_manifest.json + data/), or a "
             "labelled .npz/TFRecord/Parquet file or glob")
    # None: the demo's, for a demo release
    real_train: Optional[str] = option(
        "--real-train",
        help="real training rows the release was made from "
             "(default: the demo's train file, for a demo release)")
    real_test: Optional[str] = option(
        "--real-test",
        help="held-out real rows used for scoring (default: "
             "the demo's test file, for a demo release)")
    # score on the embedded demo's split
    demo: bool = option(
        "--demo", False, switch=True,
        help="score on the embedded demo's split (the rows "
             "`dpsynth generate` with no --input uses; see above)")
    # None: real_test
    real_holdout: Optional[str] = option(
        "--real-holdout",
        help="real rows for the memorisation check "
             "(default: --real-test)")
    # of the real files; None: from names
    input_format: Optional[str] = option(
        "--input-format", choices=("npz", "tfrecord", "parquet", "csv"),
        help="format of the real files (default: from the name)")
    embedding_feature: str = option(
        "--embedding-feature", "embedding",
        help="TFRecord/Parquet embedding feature of the real files")
    label_feature: str = option(
        "--label-feature", "label",
        help="TFRecord/Parquet label feature of the real files")
    # auto: the release's config
    normalize: str = option(
        "--normalize", "auto", choices=("auto",) + NORMALIZATIONS,
        help="public per-record transform of "
             "real rows; auto: the release's config")
    # None: the release's, or seen
    labels: Optional[tuple[int, ...]] = option(
        "--labels", to_spec=_evaluate_labels,
        help="public label set, e.g. 0,1,2 "
             "(default: the release's, else the labels seen)")
    # or "full"
    protocol: str = option(
        "--protocol", "quick", choices=tuple(PROTOCOLS),
        help="quick: %d seed, MLP %d epochs (minutes on "
             "CIFAR-10-size data, no std); full: the paper's "
             "protocol, %d seeds, MLP %d epochs, mean and std "
             "(about twice as long)" % (
                 PROTOCOLS["quick"]["seeds"],
                 PROTOCOLS["quick"]["mlp_epochs"],
                 PROTOCOLS["full"]["seeds"],
                 PROTOCOLS["full"]["mlp_epochs"]))
    # None: the protocol's
    seeds: Optional[int] = option(
        "--seeds", type=int,
        help="training seeds per model (default: the "
             "protocol's)")
    # None: mlp (with Keras), logreg; the flag's text is read by
    # ``evaluation.parse_models`` (cli.evaluate), which knows the trainers
    models: Optional[tuple[str, ...]] = option(
        "--models",
        help="comma list of mlp, logreg (default: both; "
             "logreg alone where Keras/TensorFlow is not installed"
             ", e.g. the base install)")
    # None: paper; none on the demo
    size_policy: Optional[str] = option(
        "--size-policy", choices=SIZE_POLICIES,
        help="paper: cut synthetic sets larger than the real "
             "train set to its size; match: also repeat smaller "
             "ones up to it; none: use as is (default: paper; "
             "none on the demo, like generate's utility line)")
    # also train on the real rows
    ceiling: bool = option(
        "--no-ceiling", True, off_switch=True,
        help="skip the models trained on real data")
    # Fréchet / precision-recall / DCR
    distribution: bool = option(
        "--no-distribution", True, off_switch=True,
        help="skip Fréchet / precision-recall / DCR")
    metrics_max_rows: int = option(
        "--metrics-max-rows", 2000, type=int,
        help="rows per class and set for the metrics")
    knn_k: int = option(
        "--knn-k", 3, type=int, help="k of the k-NN precision/recall")
    mlp: MLPOptions = MLPOptions()
    # None: LogRegConfig's; 1 on the demo
    logreg_c: Optional[float] = option(
        "--logreg-c", type=float,
        help="inverse L2 strength of the logistic-regression "
             "probe (default: %g, the reference probe of CIFAR-10 / "
             "20 Newsgroups; %g on the demo, scikit-learn's default "
             "that generate's utility line uses)" % (
                 LogRegConfig().C, DEMO_LOGREG_C))
    # None: <release>-evaluation.json beside it
    output: Optional[str] = option(
        "--output",
        help="JSON report path; an existing file is kept unless "
             "--overwrite (default: beside what it evaluates, "
             "<release>-evaluation.json, never inside the release: "
             "the report is not DP; a gs:// release's in "
             "~/.cache/dpsynth-evaluations)")
    overwrite: bool = option(
        "--overwrite", False, switch=True,
        help="replace an existing --output file")
    verbose: bool = option(
        "--verbose", False, switch=True,
        help="show TensorFlow's own start-up and warning lines")
