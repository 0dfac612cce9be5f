"""dpsynth pipelines: what runs a job, in rooms (top to bottom; each
imports only what is listed after it, ``tests/test_layout.py``):

- ``api``: the typed API (``from dpsynth.pipelines.api import generate``);
- ``cli/``: the ``dpsynth`` command (``cli/__init__``) and its sub-commands'
  flags (``generate``, ``encode``, ``evaluate``, ``report``);
- ``job``, ``encode_job``: the Beam jobs; ``spec``: their typed options;
  ``demo``: the embedded demo data; ``console``, ``help_format``: the
  terminal the jobs and the commands write to (progress, Ctrl-C, one-line
  errors, ``--help``'s layout);
- ``release/``: staging, publishing and reading a release, its consistency
  checks, the lifetime budget store, ``dpsynth sample``, the summary;
- ``runners/``: picking and adapting the engine (Beam options, runner names,
  Prism, what the machine lends, Beam and Dask internals replaced).
"""
