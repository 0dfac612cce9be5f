"""Installs the engines Beam's portable runners need, pinned to the
installed Beam, into a user cache (idempotent).

  * FlinkRunner: ``org.apache.beam:beam-runners-flink-<FLINK>-job-server``
    (Flink 1.20 by default: the last 1.x line, Flink's long-term-support
    release, which runs on Java 17), for ``--flink_job_server_jar``.
  * SparkRunner: ``org.apache.beam:beam-runners-spark-3-job-server``, for
    ``--spark_job_server_jar``.
  * PrismRunner: ``github.com/apache/beam/sdks/v2/go/cmd/prism``, built with
    ``go install``, for ``--prism_location``.

Jars come through Maven (``mvn dependency:get`` into ``<cache>/m2``), the
binary through the Go module proxy; nothing is downloaded by hand. The
cache is ``$DPSYNTH_ENGINES_DIR``, else ``$XDG_CACHE_HOME/dpsynth/engines``
(default ``~/.cache/dpsynth/engines``). Each run writes
``<cache>/beam-<version>/status.json``: per engine the path, or why it is
missing, so tests can tell "the registry does not serve it" (a final no:
skip, with that reason) from an install that failed (fail in CI).

  python -m dpsynth.deploy.install_engines [flink spark prism]   # install, print paths
  python -m dpsynth.deploy.install_engines --print flink          # the path, or exit 1

Exit status: 0 when every engine asked for is installed or not served by
its registry, 1 when an install failed (network, build).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from dpsynth.pipelines.runners import prism

ENGINES = ("flink", "spark", "prism")
DEFAULT_FLINK_VERSION = "1.20"
# Beam 2.77's FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS.
FLINK_VERSIONS = ("1.19", "1.20", "2.0", "2.1", "2.2")
PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"
INSTALL_TIMEOUT_S = 1800
# What Maven / the Go command print when the registry has no such version
# (a final answer, unlike a network error).
_NOT_SERVED = ("Could not find artifact", "was not found in", "not found:", "unknown revision",
               "410 Gone", "404 Not Found")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def beam_version() -> str:
    """The installed Beam. Its version module loads the whole package, so
    through import_beam: without Beam's "apitools not found" line."""
    from dpsynth.pipelines.quiet_beam import import_beam
    import_beam()
    from apache_beam.version import __version__
    return __version__


def cache_root(env: Optional[dict] = None) -> Path:
    """The engines cache (also where ``--runner prism`` looks)."""
    return prism.engines_dir(env)


def flink_version(env: Optional[dict] = None) -> str:
    env = os.environ if env is None else env
    version = env.get("DPSYNTH_FLINK_VERSION") or DEFAULT_FLINK_VERSION
    if version not in FLINK_VERSIONS:
        raise ValueError(f"DPSYNTH_FLINK_VERSION={version}: Beam publishes "
                         f"Flink job servers for {', '.join(FLINK_VERSIONS)}")
    return version


def maven_artifact(engine: str, beam: str, flink: str) -> tuple[str, str]:
    """(artifactId, version) of an engine's Beam job server jar."""
    if engine == "flink":
        return f"beam-runners-flink-{flink}-job-server", beam
    if engine == "spark":
        return "beam-runners-spark-3-job-server", beam
    raise ValueError(f"{engine} is not a Maven engine")


def engine_path(engine: str, root: Path, beam: str, flink: str) -> Path:
    """Where the installed artefact lies (it may not exist yet)."""
    if engine == "prism":
        return prism.binary_path(root, beam)
    artifact, version = maven_artifact(engine, beam, flink)
    return (root / "m2" / "org" / "apache" / "beam" / artifact / version
            / f"{artifact}-{version}.jar")


def status_file(root: Path, beam: str) -> Path:
    return root / f"beam-{beam}" / "status.json"


def read_status(root: Optional[Path] = None,
                beam: Optional[str] = None) -> Optional[dict]:
    """The last install's outcome per engine, or None if it never ran."""
    path = status_file(root or cache_root(), beam or beam_version())
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def _run(cmd: list[str], env: dict) -> tuple[bool, str]:
    """Runs an installer; (ok, the tail of its output)."""
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, str(err)
    out = _ANSI.sub("", proc.stdout + proc.stderr).strip()
    return proc.returncode == 0, out[-2000:]


def _outcome(engine: str, ok: bool, path: Path, output: str,
             cmd: list[str]) -> dict:
    if ok and path.is_file():
        return {"path": str(path)}
    not_served = any(marker in output for marker in _NOT_SERVED)
    lines = [ln for ln in output.splitlines() if ln.strip()]
    reason = next((ln for ln in lines if any(m in ln for m in _NOT_SERVED)),
                  lines[-1] if lines else "no output")
    for marker in _NOT_SERVED:  # from the registry's words on, if any
        if marker in reason:
            reason = reason[reason.index(marker):]
            break
    return {"error": reason[:500], "not_served": not_served,
            "command": " ".join(cmd)}


def install_jar(engine: str, root: Path, beam: str, flink: str) -> dict:
    """``mvn dependency:get`` of the job server jar into ``root/m2``."""
    path = engine_path(engine, root, beam, flink)
    if path.is_file():
        return {"path": str(path)}
    if shutil.which("mvn") is None:
        return {"error": "mvn is not installed", "not_served": False,
                "command": "mvn"}
    artifact, version = maven_artifact(engine, beam, flink)
    # -U: ask the registry again rather than repeat a cached "not found".
    cmd = ["mvn", "-B", "-q", "-U", "-Dstyle.color=never", "dependency:get",
           f"-Dartifact=org.apache.beam:{artifact}:{version}",
           "-Dtransitive=false", f"-Dmaven.repo.local={root / 'm2'}"]
    ok, out = _run(cmd, dict(os.environ))
    return _outcome(engine, ok, path, out, cmd)


def install_prism(root: Path, beam: str) -> dict:
    """``go install`` of Prism at the Beam version; the module cache is a
    temporary folder (about 0.9 GB), removed afterwards."""
    path = engine_path("prism", root, beam, "")
    if path.is_file():
        return {"path": str(path)}
    if shutil.which("go") is None:
        return {"error": "go is not installed", "not_served": False,
                "command": "go"}
    path.parent.mkdir(parents=True, exist_ok=True)
    modcache = Path(tempfile.mkdtemp(prefix="gomod-", dir=root))
    env = {**os.environ, "GOBIN": str(path.parent),
           "GOMODCACHE": str(modcache),
           # -modcacherw: the temporary module cache can be deleted
           "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -modcacherw".strip()}
    cmd = ["go", "install", f"{PRISM_PACKAGE}@v{beam}"]
    try:
        ok, out = _run(cmd, env)
    finally:
        shutil.rmtree(modcache, ignore_errors=True)
    return _outcome("prism", ok, path, out, cmd)


def install(engines: Sequence[str], root: Optional[Path] = None) -> dict:
    """Installs each engine (skipping what is there); writes and returns
    the status of every engine asked for, merged with earlier ones."""
    root = root or cache_root()
    beam, flink = beam_version(), flink_version()
    root.mkdir(parents=True, exist_ok=True)
    status = read_status(root, beam) or {}
    for engine in engines:
        if engine == "prism":
            status[engine] = install_prism(root, beam)
        else:
            status[engine] = install_jar(engine, root, beam, flink)
        status[engine]["beam"] = beam
        if engine == "flink":
            status[engine]["flink_version"] = flink
    path = status_file(root, beam)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(status, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return status


def describe(engine: str, entry: dict) -> str:
    if "path" in entry:
        return f"{engine}: {entry['path']}"
    kind = "not served by its registry" if entry.get("not_served") \
        else "INSTALL FAILED"
    return f"{engine}: {kind}: {entry['error']} ({entry['command']})"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpsynth.deploy.install_engines",
        description="install the Flink / Spark job server jars and Prism "
        "for the installed Beam")
    parser.add_argument("engines", nargs="*",
                        help=f"any of {', '.join(ENGINES)} (default: all)")
    parser.add_argument("--print", dest="show", choices=ENGINES,
                        help="print one engine's installed path (exit 1 if "
                        "it is not installed); installs nothing")
    args = parser.parse_args(argv)
    if args.show:
        entry = (read_status() or {}).get(args.show, {})
        if "path" in entry and Path(entry["path"]).is_file():
            print(entry["path"])
            return 0
        why = describe(args.show, entry) if "error" in entry else \
            f"{args.show}: not installed"
        print(f"{why}; install: python -m dpsynth.deploy.install_engines "
              f"{args.show}", file=sys.stderr)
        return 1
    unknown = sorted(set(args.engines) - set(ENGINES))
    if unknown:
        parser.error(f"unknown engine {unknown[0]}; choose from "
                     f"{', '.join(ENGINES)}")
    try:
        status = install(args.engines or ENGINES)
    except ValueError as err:
        parser.error(str(err))
    failed = False
    for engine in args.engines or ENGINES:
        entry = status[engine]
        print(describe(engine, entry))
        failed |= "path" not in entry and not entry.get("not_served")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
