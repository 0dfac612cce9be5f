"""dpsynth's Python API: the same job as `dpsynth generate`, without flags.

    from pipelines.api import (GenerateSpec, GeneratorOptions, InputOptions,
                               OutputOptions, generate)
    release = generate(GenerateSpec(
        input=InputOptions(path="gs://bucket/private/*.npz", num_classes=10),
        generator=GeneratorOptions(epsilon=4.0, delta=1e-6),
        output=OutputOptions(path="gs://bucket/releases/2026-11-27",
                             run_id="nightly-2026-11-27")))
    x, y = release.arrays()

Every option is a typed, frozen value (``pipelines.spec``); its defaults are
the command line's. Errors are raised, not printed: ``UsageError`` and
``ValueError`` for a bad spec, ``transforms.io.InputError`` for bad input,
``pipelines.release.ReleaseError``, and the budget store's
``BudgetExceeded`` / ``RunConflict`` / ``CapConflict``; in each case nothing
was published.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from pipelines.spec import (BudgetOptions, GenerateSpec, GeneratorOptions,
                            ImageOptions, InputOptions, OutputOptions,
                            RunOptions)

__all__ = ["BudgetOptions", "GenerateSpec", "GeneratorOptions",
           "ImageOptions", "InputOptions", "OutputOptions", "Release",
           "RunOptions", "generate"]


@dataclasses.dataclass(frozen=True)
class Release:
    """A published release: its path and its manifest."""

    path: str
    manifest: dict

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of the synthetic rows."""
        from pipelines import release
        x, y, _ = release.load_release(self.path)
        return x, y


def generate(spec: GenerateSpec) -> Release:
    """Runs one dpsynth job (plan, DP pipeline, atomic publication) and
    returns the published release."""
    from pipelines import job, release
    path = job.run(spec)
    return Release(path, release.read_manifest(path))
