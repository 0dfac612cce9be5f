"""Which dpsynth a process runs: its version and a digest of its source.

A cluster's workers unpickle the launcher's DoFns and run their own copy
of dpsynth's code: a worker on another version draws, clips or writes
differently from what the launcher planned and accounted for. "Same
dpsynth" means the same source bytes, not only the same version number: an
editable (development) install keeps its version while its files change,
so the digest covers every ``.py`` file of the code workers run
(``dpsynth/__init__.py`` and the ``pipelines``, ``transforms``, ``dp_ops``
and ``models`` folders, by their path inside the package), whether
installed from a wheel or run from a checkout. ``deploy`` (launch tooling)
is left out. Imports neither Beam nor Dask: workers call ``identity``
(``dask.cluster.check_workers``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os

from dpsynth import version

# The folders whose code runs in the workers.
RUNTIME_FOLDERS = ("dp_ops", "models", "pipelines", "transforms")


def identity() -> dict:
    """This process's dpsynth: {"version", "source_sha256"}."""
    return {"version": version.__version__, "source_sha256": source_sha256()}


@functools.lru_cache(maxsize=1)
def source_sha256() -> str:
    """sha256 over the runtime source files (relative path and bytes, in
    path order); computed once per process."""
    digest = hashlib.sha256()
    for name, path in sorted(_source_files()):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _source_files() -> list[tuple[str, str]]:
    root = os.path.dirname(os.path.abspath(version.__file__))
    files = [(name, os.path.join(root, name))
             for name in ("__init__.py", "version.py")]
    for folder in RUNTIME_FOLDERS:
        spec = importlib.util.find_spec(f"dpsynth.{folder}")
        root = list(spec.submodule_search_locations)[0]
        for parent, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(parent, name)
                    rel = os.path.relpath(path, root).replace(os.sep, "/")
                    files.append((f"{folder}/{rel}", path))
    return files


def describe(ident: dict) -> str:
    return (f"dpsynth {ident.get('version')} (source sha256 "
            f"{str(ident.get('source_sha256'))[:12]})")
