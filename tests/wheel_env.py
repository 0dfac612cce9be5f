"""dpsynth as a user gets it: an sdist and a wheel built from this
checkout's sources, installed (not editable) into a fresh venv.

The build runs once per change of the sources: the files are keyed by a
hash of everything the distribution holds, under
``${XDG_CACHE_HOME:-~/.cache}/dpsynth/wheels/<hash>`` (a second call takes
a moment). The sdist is built from a copy of the sources (setuptools writes
its egg-info beside them) and the wheel from the unpacked sdist, as
``python -m build`` and Dataflow's workers do.

The venv is made without pip and without the project's site-packages, the
wheel installed into it (nothing outside it is visible then, so nothing
outside it can be uninstalled), and only then a ``.pth`` line appends the
site-packages of the running interpreter: the dependencies are reused
(installing Beam and TensorFlow again would take minutes and GBs) while
that environment's editable dpsynth, an import hook run by its own ``.pth``
file, is not (``.pth`` files of an appended folder are not run).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What the distribution is built from.
SOURCES = ("pyproject.toml", "setup.py", "README.md", "dpsynth", "dp_ops",
           "models", "transforms", "pipelines", "deploy")


def _files() -> list[Path]:
    found = []
    for name in SOURCES:
        path = REPO / name
        found += [path] if path.is_file() else [
            p for p in path.rglob("*") if p.is_file()
            and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    return sorted(found)


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in _files():
        digest.update(str(path.relative_to(REPO)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dpsynth" / "wheels"


def _build(backend_call: str, source: Path, out: Path) -> Path:
    """Runs one PEP 517 hook of setuptools in ``source``; the file it made."""
    code = ("import sys; from setuptools import build_meta as b; "
            f"print(b.{backend_call}(sys.argv[1]))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=source,
                          capture_output=True, text=True, env=env,
                          timeout=600)
    if proc.returncode:
        raise RuntimeError(f"{backend_call} failed:\n{proc.stderr[-3000:]}")
    return out / proc.stdout.strip().splitlines()[-1]


def built_distributions() -> tuple[Path, Path]:
    """(sdist, wheel) of the current sources, built once per change."""
    home = cache_dir() / source_hash()
    if home.is_dir():
        sdists, wheels = sorted(home.glob("*.tar.gz")), sorted(home.glob("*.whl"))
        if sdists and wheels:
            return sdists[0], wheels[0]
    cache_dir().mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=cache_dir()))
    try:
        copy, out = work / "src", work / "out"
        copy.mkdir()
        out.mkdir()
        for path in _files():
            target = copy / path.relative_to(REPO)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        sdist = _build("build_sdist", copy, out)
        with tarfile.open(sdist) as tar:
            tar.extractall(work / "unpacked", filter="data")
        (unpacked,) = (work / "unpacked").iterdir()
        wheel = _build("build_wheel", unpacked, out)
        try:
            out.rename(home)  # complete or absent; a racing build may win
        except OSError:
            pass
        _prune(keep=home)
        return home / sdist.name, home / wheel.name
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _prune(keep: Path, newest: int = 4) -> None:
    """Drops the builds of older sources (each ~0.5 MB), keeping a few for
    other checkouts sharing the cache."""
    builds = sorted((p for p in cache_dir().iterdir()
                     if p.is_dir() and not p.name.startswith("build-")),
                    key=lambda p: p.stat().st_mtime, reverse=True)
    for old in builds[newest:]:
        if old != keep:
            shutil.rmtree(old, ignore_errors=True)


def dependency_paths() -> list[str]:
    """The site-packages folders the running interpreter imports from (a
    venv's and, with ``--system-site-packages``, its base's; never a
    checkout that a path-style editable install put on ``sys.path``)."""
    return list(dict.fromkeys(
        p for p in sys.path if os.path.isdir(p)
        and os.path.basename(p) in ("site-packages", "dist-packages")))


def make_venv(venv: Path, wheel: Path) -> Path:
    """A venv holding ``wheel`` (no checkout, no editable install) that
    reuses this interpreter's dependencies; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                   check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python),
                    "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", str(wheel)],
                   check=True, env=env, capture_output=True, timeout=600)
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; "
         "print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, env=env).stdout.strip()
    Path(purelib, "_dpsynth_dependencies.pth").write_text(
        "\n".join(dependency_paths()) + "\n")
    return python


def clean_env(**extra: str) -> dict:
    """The environment of a user's shell: no PYTHONPATH to a checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "DPSYNTH_HOME")}
    env.update(extra)
    return env
