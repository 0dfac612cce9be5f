"""dpsynth's packaging lives in pyproject.toml; this shim stays because
Beam's ``--setup_file`` (Dataflow workers, deploy/dataflow/submit.sh) builds
the workers' sdist by running a ``setup.py``."""

from setuptools import setup

setup()
