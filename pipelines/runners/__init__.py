"""Picking and adapting the engine. ``options`` builds a job's Beam options
(strict flags, safe DirectRunner defaults) from ``runner_names`` and
``prism``; ``cores`` and ``gc_freeze`` say what the process lends the
job; ``errors`` holds what a runner raises. Every other module is the
adaptation layer: each patches or replaces one Beam or Dask internal, says
which versions it was measured on, and falls back to Beam's own behaviour
where the internals differ."""
