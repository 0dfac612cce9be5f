"""dpsynth's Dask engine: Beam's DaskRunner with dpsynth's fixes
(``runner``), the clusters it runs on (``cluster``), the shapes of Beam's internals it was written for
(``compat``), what the local cluster's workers import as they start
(``preload``). Importing this package imports neither Beam nor Dask."""

from __future__ import annotations

import sys
from typing import Any

from dpsynth.pipelines.runners.engine import Engine

CLUSTER_MODULE = "dpsynth.pipelines.runners.dask.cluster"


class DaskEngine(Engine):
    """``--runner dask``: a given cluster (``--dask_client_address`` /
    ``--dask_scheduler_file``) or a TLS local cluster started for the run."""

    name = "dask"

    def check_before_charge(self, spec: Any, options: Any) -> None:
        """The installed Beam has the internals the runner was written for,
        and a given cluster's workers run this launcher's code and versions,
        are on this machine where the run uses local paths, and get no key
        in the graph or traffic in clear text where any is elsewhere."""
        from dpsynth.pipelines.runners import locality
        from dpsynth.pipelines.runners.dask import compat
        from dpsynth.pipelines.runners.errors import UsageError
        refusal = compat.refusal()  # an untested Beam: one line, uncharged
        if refusal is not None:
            raise UsageError(refusal)
        from dpsynth.pipelines.runners.dask import cluster
        cluster.check_cluster(
            options, locality.local_paths(spec, options.get_all_options()),
            secure=spec.secure_noise,
            key_location=spec.run.noise_key_location)

    def close(self) -> None:
        """Closes the local cluster this run's pipelines started, if any
        (one serves both phases of the adaptive plan); one the caller
        started with ``local_cluster()`` stays up for its next job."""
        cluster = sys.modules.get(CLUSTER_MODULE)  # never imports it
        if cluster is not None:
            cluster.close_run_cluster()
