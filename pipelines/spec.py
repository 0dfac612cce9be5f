"""What a `dpsynth generate` run is asked to do, as typed values.

The command line turns its flags into one ``GenerateSpec`` (see
``dpsynth.pipelines.cli.generate.spec_from_args``); everything below the
command line (``dpsynth.pipelines.job``, the Beam transforms) takes these
values, never parsed flags. Python callers (the Airflow DAG, benchmarks,
notebooks) build them directly and call ``dpsynth.pipelines.api.generate``.
Every field is public configuration: nothing here is read from the private
data.

Each `dpsynth generate` option is declared once, here, by its field
(``option``): the field's default is the flag's (the generator's are
``GeneratorConfig``'s, referenced), and the field carries its flag, help
and how its text is read (type, choices, a switch). ``cli.generate``
builds its parser from the fields and reads the parsed flags back through
them. (The image and encoder flags, shared with `dpsynth encode`, are
still declared in ``cli.image_flags``.)

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
from dpsynth.models.classifiers import MLPConfig
from dpsynth.transforms.formats import (FORMATS, NON_FINITE_POLICIES,
                                        OUTPUT_FORMATS, SPLIT_BYTES)


def option(flag: str, default: Any = None, *, help: str,
           type: Optional[Callable[[str], Any]] = None,
           parse: Optional[Callable[[str], Any]] = None,
           choices: Optional[Sequence[str]] = None,
           metavar: Optional[str] = None, switch: bool = False,
           negatable: bool = False,
           to_spec: Optional[Callable[[Any], Any]] = None) -> Any:
    """A spec field and its command-line flag, declared once: ``default``
    is the field's and the flag's. The flag's text is read by ``type``
    (int, float: the parser's own error) or ``parse`` (dpsynth's reader: its
    ValueError is the one-line error); ``switch``: a flag without a value
    that sets True; ``negatable``: --x / --no-x; ``to_spec`` turns the
    parsed value into the field's (default: as parsed)."""
    return dataclasses.field(default=default, metadata={
        "flag": flag, "help": help, "type": type, "parse": parse,
        "choices": choices, "metavar": metavar, "switch": switch,
        "negatable": negatable, "to_spec": to_spec})


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


# ---------------------------------------------------------------- generate

@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """`generate --images`: images encoded by a public encoder in the
    workers, then the DP job on the embeddings."""

    path: str  # folder-per-class ROOT, or a glob of .tfrecord / .npz files
    encoder: str = "efficientnet-lite0"
    encoder_weights: Optional[str] = None
    image_size: Optional[tuple[int, int]] = None
    pixel_scale: Optional[str] = None
    resize_mode: Optional[str] = None
    encoder_output_key: Optional[str] = None
    encoder_threads: Optional[int] = None
    batch_size: int = 64
    l2_normalize: bool = False
    bad_images_report: Optional[str] = None
    classes: Optional[tuple[str, ...]] = None  # folder names in label order
    layout: Optional[str] = None
    image_feature: Optional[str] = None
    label_feature: Optional[str] = None


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
    output: str  # OUT.npz or OUT.tfrecord, local or gs://
    num_shards: int = 1  # TFRecord output shards
    keep_source_ids: bool = False  # also store each row's source file
    max_bad_images: int = 0  # stop the run above this many unreadable images
    beam_args: tuple[str, ...] = ()  # Beam pipeline options (--runner ...)
    verbose: bool = False


# ---------------------------------------------------------------- evaluate

@dataclasses.dataclass(frozen=True)
class MLPOptions:
    """The paper's two-layer MLP (App. C.3 defaults). ``epochs`` None: the
    protocol's; ``learning_rate`` None: the paper's, raised on small
    training sets (see
    ``dpsynth.pipelines.evaluation.scaled_learning_rate``)."""

    hidden: int = MLPConfig.hidden
    epochs: Optional[int] = None
    batch_size: int = MLPConfig.batch_size
    learning_rate: Optional[float] = None
    momentum: float = MLPConfig.momentum
    dropout: float = MLPConfig.dropout
    label_smoothing: float = MLPConfig.label_smoothing
    weight_decay: float = MLPConfig.weight_decay
    batch_norm: bool = MLPConfig.batch_norm
    cosine_decay: bool = MLPConfig.cosine_decay


@dataclasses.dataclass(frozen=True)
class EvaluateSpec:
    """One `dpsynth evaluate` run: a synthetic release scored on real data.
    The report reads the real training data and is NOT differentially
    private."""

    synthetic: str  # release directory, or a labelled data file or glob
    real_train: Optional[str] = None  # None: the demo's, for a demo release
    real_test: Optional[str] = None
    demo: bool = False  # score on the embedded demo's split
    real_holdout: Optional[str] = None  # None: real_test
    input_format: Optional[str] = None  # of the real files; None: from names
    embedding_feature: str = "embedding"
    label_feature: str = "label"
    normalize: str = "auto"  # auto: the release's config
    labels: Optional[tuple[int, ...]] = None  # None: the release's, or seen
    protocol: str = "quick"  # or "full"
    seeds: Optional[int] = None  # None: the protocol's
    models: Optional[tuple[str, ...]] = None  # None: mlp (with Keras), logreg
    size_policy: Optional[str] = None  # None: paper; none on the demo
    ceiling: bool = True  # also train on the real rows
    distribution: bool = True  # Fréchet / precision-recall / DCR
    metrics_max_rows: int = 2000
    knn_k: int = 3
    mlp: MLPOptions = MLPOptions()
    logreg_c: Optional[float] = None  # None: LogRegConfig's; 1 on the demo
    output: Optional[str] = None  # None: <release>-evaluation.json beside it
    overwrite: bool = False
    verbose: bool = False

