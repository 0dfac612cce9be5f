"""Imported by every worker of the local Dask cluster as it starts
(distributed's ``preload``): the modules that dpsynth's tasks unpickle.

Without it each worker pays these imports (Beam, PipelineDP, pyarrow,
dpsynth's transforms: ~1.5-2.7 s) inside the job's first task, on every
worker at once, so the first pass starts that much later. A worker of a
long-running cluster has them already after its first job; on a real
cluster, ``dask worker --preload dpsynth.pipelines.runners.dask.preload`` does the same
(deploy/README.md "Dask").

Measured on Beam 2.77 (commit 56145ea). Not a patch: it replaces nothing
of Beam's or Dask's, so it has no fallback to check.
"""

import apache_beam  # noqa: F401
import pipeline_dp  # noqa: F401
import pyarrow.parquet  # noqa: F401

import dpsynth.pipelines.runners.dask.runner  # noqa: F401
from dpsynth.transforms import (two_phase, aggregate, io, mixture,  # noqa: F401
                        keyed_noise, pipelinedp, progress, write)
