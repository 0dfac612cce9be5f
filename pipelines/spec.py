"""What a `dpsynth generate` run is asked to do, as typed values.

The command line turns its flags into one ``GenerateSpec`` (see
``dpsynth.pipelines.cli.generate.spec_from_args``); everything below the command line
(``dpsynth.pipelines.job``, the Beam transforms) takes these values, never parsed
flags. Python callers (the Airflow DAG, benchmarks, notebooks) build them
directly and call ``dpsynth.pipelines.api.generate``. Every field is public
configuration: nothing here is read from the private data.

This module imports neither Beam nor TensorFlow, so building a spec is
instant.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from dpsynth.dp_ops.config import GeneratorConfig
# numpy only: Keras loads inside the trainers.
from dpsynth.models.classifiers import MLPConfig

# Read in byte ranges of this size (TFRecord, Parquet): dpsynth.transforms.io's
# SPLIT_BYTES, repeated here so that this module stays free of Beam.
DEFAULT_SPLIT_BYTES = 64 << 20


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

    path: Optional[str] = None  # glob of .npz / TFRecord / Parquet / CSV; None: demo
    format: Optional[str] = None  # default: from the file extension
    embedding_feature: str = "embedding"
    label_feature: str = "label"
    non_finite: str = "reject"
    block_size: int = 4096
    split_bytes: int = DEFAULT_SPLIT_BYTES
    embedding_dim: Optional[int] = None  # default: from the files' schema
    num_classes: Optional[int] = None  # labels 0..N-1
    labels: Optional[tuple[int, ...]] = None  # or an explicit label set
    images: Optional[ImageOptions] = None


@dataclasses.dataclass(frozen=True)
class GeneratorOptions:
    """The privacy target and the generator (``dpsynth.dp_ops.config``'s
    ``GeneratorConfig`` without the label set, which comes with the input).
    ``noise_seed``: SECRET seed of reproducible noise, for tests and audits
    only: the release is then marked not private."""

    epsilon: float = GeneratorConfig.epsilon
    delta: float = GeneratorConfig.delta
    allow_large_delta: bool = False
    accountant: str = GeneratorConfig.accountant
    budget_weights: Optional[dict] = None
    noise_seed: Optional[int] = None
    clusters: int = GeneratorConfig.clusters
    clip_norm: float = GeneratorConfig.clip_norm
    normalize: str = GeneratorConfig.normalize
    center: bool = GeneratorConfig.center
    cluster_dim: int = GeneratorConfig.cluster_dim
    tree_depth: int = GeneratorConfig.tree_depth
    branch_threshold: Optional[float] = GeneratorConfig.branch_threshold
    lloyd_rounds: int = GeneratorConfig.lloyd_rounds
    variance_floor: float = GeneratorConfig.variance_floor
    covariance_rank: int = GeneratorConfig.covariance_rank
    covariance: str = "auto"  # the CLI default: the adaptive plan
    samples_per_class: Optional[int] = GeneratorConfig.samples_per_class
    seed: int = GeneratorConfig.seed
    vote_filter: bool = GeneratorConfig.vote_filter
    vote_threshold: Optional[float] = GeneratorConfig.vote_threshold
    vote_oversample: float = GeneratorConfig.vote_oversample
    vote_share: Optional[float] = GeneratorConfig.vote_share
    vote_max_candidates: Optional[int] = GeneratorConfig.vote_max_candidates

    def config(self, labels: tuple[int, ...]) -> GeneratorConfig:
        """The generator configuration for the public label set."""
        names = {f.name for f in dataclasses.fields(GeneratorConfig)}
        values = {k: v for k, v in dataclasses.asdict(self).items()
                  if k in names}
        return GeneratorConfig(labels=tuple(labels), **values)


@dataclasses.dataclass(frozen=True)
class OutputOptions:
    """Where and how the release is written."""

    path: Optional[str] = None  # default: dpsynth-releases/<run id>
    overwrite: bool = False  # replace a release of ANOTHER run id
    run_id: Optional[str] = None  # default: random
    rows_per_shard: int = 50_000
    format: str = "tfrecord"  # or "parquet"


@dataclasses.dataclass(frozen=True)
class BudgetOptions:
    """The lifetime budget store (None: no lifetime accounting)."""

    store: Optional[str] = None  # directory or gs:// prefix
    dataset_id: Optional[str] = None
    lifetime_epsilon: Optional[float] = None  # pins the cap on first use
    lifetime_delta: Optional[float] = None


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the job runs (none of it changes the release's bits)."""

    beam_args: tuple[str, ...] = ()  # Beam pipeline options (--runner ...)
    materialise_blocks: bool = False
    verbose: bool = False
    # Operator diagnostics, NOT differentially private: exact row counts on
    # the progress lines, wall times at the end.
    show_row_counts: bool = False
    record_timings: bool = False
    # Where the launcher puts the run's secret noise key for the workers
    # (a prefix readable only by the job's service account), instead of
    # pickling it into the job graph; required on DataflowRunner.
    noise_key_location: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class GenerateSpec:
    """One `dpsynth generate` run."""

    input: InputOptions = InputOptions()
    generator: GeneratorOptions = GeneratorOptions()
    output: OutputOptions = OutputOptions()
    budget: BudgetOptions = BudgetOptions()
    run: RunOptions = RunOptions()


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
    training sets (see ``dpsynth.pipelines.cli.evaluate.scaled_learning_rate``)."""

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
    output: str = "evaluation.json"
    overwrite: bool = False
    verbose: bool = False
