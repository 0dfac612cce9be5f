"""dpsynth's Python API: the same job as `dpsynth generate`, without flags.

    from dpsynth.pipelines.api import (GenerateSpec, GeneratorOptions, InputOptions,
                               OutputOptions, generate)
    release = generate(GenerateSpec(
        input=InputOptions(path="gs://bucket/private/*.npz", num_classes=10),
        generator=GeneratorOptions(epsilon=4.0, delta=1e-6),
        output=OutputOptions(path="gs://bucket/releases/2026-11-27",
                             run_id="nightly-2026-11-27")))
    x, y = release.arrays()

``sample(release_path, output, rows)`` is `dpsynth sample` (more rows from a
published release's mixture: post-processing, no privacy cost).
The other commands have their own specs: ``encode(EncodeSpec(...))`` is
`dpsynth encode` (labelled images -> embeddings, inside the trust
boundary) and ``evaluate(EvaluateSpec(...))`` is `dpsynth evaluate` (a
release scored on real data; the report is NOT differentially private).

Every option is a typed, frozen value (``dpsynth.pipelines.spec``); its defaults are
the command line's. Errors are raised, not printed: ``UsageError`` and
``ValueError`` for a bad spec, ``dpsynth.transforms.io.InputError`` for bad input,
``dpsynth.pipelines.release.release.ReleaseError``, and the budget store's
``BudgetExceeded`` / ``RunConflict`` / ``CapConflict``; in each case nothing
was published.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import numpy as np

from dpsynth.pipelines.spec import (BudgetOptions, EncodeSpec, EvaluateSpec,
                            GenerateSpec, GeneratorOptions, ImageOptions,
                            InputOptions, MLPOptions, OutputOptions,
                            RunOptions)

__all__ = ["BudgetOptions", "EncodeSpec", "EvaluateSpec", "GenerateSpec",
           "GeneratorOptions", "ImageOptions", "InputOptions", "MLPOptions",
           "OutputOptions", "Release", "RunOptions", "encode", "evaluate",
           "generate", "sample"]


def _quiet_beam() -> None:
    """Beam's import-time "apitools not found" line, dropped as the command
    line drops it (importing this module stays free of Beam)."""
    from dpsynth.pipelines.quiet_beam import import_beam
    import_beam()


@dataclasses.dataclass(frozen=True)
class Release:
    """A published release: its path and its manifest."""

    path: str
    manifest: dict

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of the synthetic rows."""
        from dpsynth.pipelines.release import reading
        x, y, _ = reading.load_release(self.path)
        return x, y


def generate(spec: GenerateSpec) -> Release:
    """Runs one dpsynth job (plan, DP pipeline, atomic publication) and
    returns the published release."""
    _quiet_beam()
    from dpsynth.pipelines import job
    from dpsynth.pipelines.release import reading, release
    path = job.run(spec)
    return Release(path, release.read_manifest(path))


def encode(spec: EncodeSpec) -> dict:
    """Encodes labelled images with a public encoder in Beam workers
    (`dpsynth encode`) and writes ``spec.output`` (.npz or .tfrecord) and
    ``<output stem>.labels.json``; returns that labels JSON (label mapping
    and encoder recipe, no data-derived numbers) with its path under
    ``"labels_json"``.

        encode(EncodeSpec(images=ImageOptions(path="gs://b/imgs/*.npz",
                                              encoder="keras:gs://b/m.keras"),
                          output="gs://b/private/emb.npz"))

    The embeddings are as private as the images. Raises
    ``dpsynth.transforms.formats.ImageInputError`` for bad input or options,
    ``BadImagesError`` past ``spec.max_bad_images`` unreadable images
    (nothing is written then), and ``dpsynth.models.encoders``' ``EncoderError`` /
    ``EncoderUnavailableError``."""
    _quiet_beam()
    from dpsynth.pipelines import encode_job
    return encode_job.run(spec)


def evaluate(spec: EvaluateSpec,
             progress: Optional[Callable[[str], None]] = None) -> dict:
    """Scores a synthetic release on real data (`dpsynth evaluate`): the
    paper's MLP and a logistic probe trained on the synthetic rows, the
    real-data ceiling and distribution metrics. Writes the JSON report to
    ``spec.output`` and returns it; ``progress`` (optional) gets one line
    per step.

        report = evaluate(EvaluateSpec(synthetic="releases/2026-11-27",
                                       real_train="train.npz",
                                       real_test="test.npz",
                                       models=("logreg",)))
        report["synthetic_trained"]["logreg"]["mean"]

    The report reads the real training data and is NOT differentially
    private: keep it with the data owner. Raises ``ValueError`` for a bad
    spec, ``dpsynth.transforms.io.InputError`` for unreadable rows and
    ``dpsynth.pipelines.release.release.ReleaseError``, before any report is written."""
    _quiet_beam()
    from dpsynth.pipelines import evaluation
    return evaluation.run(spec, progress)


def sample(release_path: str, output: str, rows: int, seed: int = 1,
           overwrite: bool = False) -> Release:
    """Draws ``rows`` rows (shared by the classes in proportion to the
    noisy class counts) from the published release at ``release_path``'s
    mixture and publishes them at ``output`` (`dpsynth sample`). Post-
    processing: no private data is read and nothing is charged; the new
    manifest says ``"post_processing": true`` and names the source release.
    Raises ``dpsynth.pipelines.release.sample.SampleError`` or ``ReleaseError``."""
    _quiet_beam()
    from dpsynth.pipelines.release import sample as command
    manifest = command.run(command.SampleSpec(release_path, output, rows,
                                              seed, overwrite))
    return Release(output, manifest)
