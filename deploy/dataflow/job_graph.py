"""The Dataflow job of a `dpsynth generate` run, built for review without
staging or submitting anything.

    python deploy/dataflow/job_graph.py setup
    python deploy/dataflow/job_graph.py print --out DIR [generate flags] \\
        --project P --temp-location gs://B/tmp [--sdk-container-image I] \\
        [--phase1-counts N,N,...]

``setup`` creates (or reuses) a separate virtualenv with Beam's ``gcp``
extra: DataflowRunner needs google-cloud-dataflow-client, apitools and more
Google clients, which must not move the project's own pins (TensorFlow,
protobuf). The venv sees the project's environment (a ``.pth`` file naming
its site-packages: ``overlay_venv``) and installs ``apache-beam[gcp]`` at the installed Beam version under a
constraints file of that environment's ``pip freeze``, so every package the
project already has keeps its version (a pin the extra refuses is dropped and
reported). Default place ``$DPSYNTH_GCP_VENV`` or
``${XDG_CACHE_HOME:-~/.cache}/dpsynth/venv-gcp``; a stamp file records the Beam
version and the environment it was made over, so a second call takes a
second.

``print`` runs Dataflow's own translation with ``--dry_run`` (Beam's
TestOptions: ``DataflowRunner.run_pipeline`` stops before the API client) for
both phases of ``--covariance auto``: phase 1 as ``graph.run_phase1`` builds it,
phase 2 as ``graph.build_adaptive`` builds it from a *stand-in* phase-1 result
(a zero centre and ``--phase1-counts``, default 1000 per class; the real
counts are noisy outputs of phase 1 and may pick another covariance
structure, see ``structure`` in the output). For each phase it writes
``phaseN.job.json`` (a fixed ``--covariance`` plan: ``main.job.json``):
``job``, the ``dataflow.Job`` that
``DataflowApplicationClient.create_job_description`` fills (environment,
worker pool, SDK container, options, the packages it would stage), and
``pipeline``, the portable pipeline proto that Dataflow runner v2 receives
(staged as ``pipeline.pb``; the job itself carries no legacy ``steps``),
and ``staged``, the files that would be uploaded (the sdist's file list
included); ``plan.json`` names the stand-in counts and the structure the
rule chose for them. ``decoded_blobs`` opens the graph's pickled payloads for
review (what anyone reading ``pipeline.pb`` can recover).
Staging is replaced by a recorder (no upload, no GCS call), and
``--no_auth`` keeps the API client from looking up credentials. Nothing is
sent to Google by this command; the input glob is matched and its files'
headers read as a real launch does (``prepare`` and the reader), so it
needs read access to ``--input``.

Run it from the project's environment: without the gcp extra importable it
re-runs itself with the venv's python (creating the venv first).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import bz2
import hashlib
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Iterator, Optional, Sequence

REPO = Path(__file__).resolve().parent.parent.parent
STAMP_PREFIX = ".dpsynth-gcp-v3-beam-"  # v3: only what must match pinned
DEFAULT_COUNT = 1000.0
# Pins of the project's environment that pip could not keep: the gcp extra
# requires another version (reported once by `setup`).
_REFUSED_PIN = re.compile(r"The user requested \(constraint\) ([A-Za-z0-9_.\-]+)==")


def venv_dir() -> Path:
    """Where the gcp venv lives (a user cache outside the repository)."""
    if os.environ.get("DPSYNTH_GCP_VENV"):
        return Path(os.environ["DPSYNTH_GCP_VENV"])
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "dpsynth" / "venv-gcp"


def venv_python(venv: Optional[Path] = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def _beam_version() -> str:
    from importlib.metadata import version
    return version("apache-beam")


def _stamp(venv: Path) -> Path:
    return venv / f"{STAMP_PREFIX}{_beam_version()}"


def venv_ready(venv: Optional[Path] = None) -> bool:
    venv = venv or venv_dir()
    return (_stamp(venv).is_file() and venv_python(venv).is_file()
            and overlay_current(venv))


# ------------------------------------------------- venvs over this one
# ``venv --system-site-packages`` reaches the *base* interpreter's
# packages, not those of the venv this runs in (a venv's python is a
# symlink to its base), so a helper venv made that way from a venv lacks
# the project's dependencies (TensorFlow, scikit-learn...). Instead a
# ``.pth`` file in the helper's site-packages appends the folders this
# interpreter imports from: the same from a venv, pyenv or a system python.
OVERLAY_PTH = "_dpsynth_overlay.pth"
OVERLAY_STAMP = ".dpsynth-overlay.json"


def dependency_paths() -> list[str]:
    """The site-packages folders this interpreter imports from (a venv's
    and, with ``--system-site-packages``, its base's; never a checkout on
    ``sys.path``). The ``.pth`` files inside them (an editable install's
    import hook) are not run from a helper venv: only its own are."""
    return list(dict.fromkeys(
        p for p in sys.path if os.path.isdir(p)
        and os.path.basename(p) in ("site-packages", "dist-packages")))


def _pins_digest() -> str:
    """This environment's pins (``pip freeze``), hashed: a helper venv
    resolved against other pins is rebuilt. Read without the checkout on
    the path (its dpsynth.egg-info would add a pin when on PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True, text=True, check=True, env=env,
        cwd=os.path.abspath(os.sep)).stdout
    pins = sorted(line for line in frozen.splitlines()
                  if "==" in line and " @ " not in line
                  and not line.lower().startswith("dpsynth=="))
    return hashlib.sha256("\n".join(pins).encode()).hexdigest()[:16]


def _overlay_record() -> dict:
    return {"python": sys.version.split()[0], "pins": _pins_digest()}


def overlay_venv(venv: Path) -> Path:
    """A new venv (with pip) whose python also imports this interpreter's
    packages, after its own; returns its python. pip inside it sees them
    as installed and never uninstalls them (they lie outside the venv)."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    _write_overlay(venv)
    (venv / OVERLAY_STAMP).write_text(json.dumps(_overlay_record()))
    return python


def _write_overlay(venv: Path) -> None:
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, OVERLAY_PTH).write_text("\n".join(dependency_paths()) + "\n")


def overlay_current(venv: Path) -> bool:
    """Whether ``venv`` was made over an environment with this one's Python
    and pins; if so its ``.pth`` is pointed at this environment (a CI venv
    made afresh at the same place each run keeps its helpers)."""
    try:
        made = json.loads((venv / OVERLAY_STAMP).read_text())
    except (OSError, ValueError):
        return False
    if made != _overlay_record():
        return False
    _write_overlay(venv)
    return True


# What a helper venv must keep at the project's versions: the project's own
# requirements (the base install and the extras the suite installs) and what
# TensorFlow is built against. Everything else the helper's extra brings
# resolves freely: pinning the whole `pip freeze` (opentelemetry-api 1.45.3,
# which no opentelemetry-sdk that the gcp extra wants matches) sent pip's
# resolver backtracking for 46+ minutes on Beam 2.78.
MUST_MATCH_EXTRAS = ("tf", "dask")
MUST_MATCH_ALSO = ("numpy", "protobuf", "tensorflow", "keras", "ml-dtypes",
                   "grpcio", "h5py", "apache-beam", "setuptools")
# A helper venv's pip install gives up after this long (one line naming the
# step), instead of holding CI until its own limit.
PIP_TIMEOUT_S = int(os.environ.get("DPSYNTH_HELPER_PIP_TIMEOUT", "900"))


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    head = re.split(r"[\s;\[<>=!~(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", head).lower()


def must_match() -> set[str]:
    """The distributions a helper venv keeps at this environment's
    versions (normalised names)."""
    from importlib.metadata import PackageNotFoundError, requires
    names = {_name(n) for n in MUST_MATCH_ALSO}
    try:
        reqs = requires("dpsynth") or []
    except PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        reqs = []
    for req in reqs:
        marker = req.split(";", 1)[1] if ";" in req else ""
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)", marker)
        if extra is None or extra.group(1) in MUST_MATCH_EXTRAS:
            names.add(_name(req))
    names.discard("dpsynth")
    return names


def _constraints(path: Path, dropped: set[str]) -> None:
    """The pins of this environment that a helper venv must keep
    (``must_match``; editable/local installs out)."""
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True, text=True, check=True).stdout.splitlines()
    keep_names = must_match()
    keep = [line for line in frozen
            if "==" in line and " @ " not in line
            and _name(line.split("==")[0]) in keep_names
            and _name(line.split("==")[0]) not in dropped]
    path.write_text("\n".join(keep) + "\n")


class HelperVenvFailed(RuntimeError):
    """A helper venv's install failed or ran past ``PIP_TIMEOUT_S``."""


def install_keeping_pins(python: str, constraints: Path,
                         requirements: Sequence[str],
                         unpinned: Sequence[str] = ()) -> set[str]:
    """pip-installs ``requirements`` into the venv of ``python`` (one made
    by ``overlay_venv`` over this environment) under a constraints file of
    this environment's pins that must match (``must_match``) but
    ``unpinned``, dropping each pin the requirements refuse; returns the
    dropped pins. Each pip call gives up after ``PIP_TIMEOUT_S``."""
    dropped: set[str] = {_name(name) for name in unpinned}
    what = " ".join(requirements)
    for _ in range(10):  # each round drops the pins the extra refuses
        _constraints(constraints, dropped)
        try:
            proc = subprocess.run(
                [python, "-m", "pip", "install", "--disable-pip-version-check",
                 "-c", str(constraints), *requirements],
                capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise HelperVenvFailed(
                f"pip install {what} into {python} was still resolving after "
                f"{PIP_TIMEOUT_S} s (DPSYNTH_HELPER_PIP_TIMEOUT): stopped"
            ) from None
        if proc.returncode == 0:
            return dropped
        refused = {_name(m) for m in
                   _REFUSED_PIN.findall(proc.stdout + proc.stderr)}
        if not refused - dropped:
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:]
            raise HelperVenvFailed(f"pip install {what} into {python} failed: "
                                   f"{tail[0] if tail else proc.returncode}")
        dropped |= refused
    raise HelperVenvFailed(f"pip install {what}: gave up after 10 rounds")


def ensure_venv(venv: Optional[Path] = None, quiet: bool = False) -> Path:
    """Creates (or reuses) the gcp venv; returns its python."""
    venv = venv or venv_dir()
    if venv_ready(venv):
        return venv_python(venv)
    say = (lambda *a: None) if quiet else (
        lambda *a: print("job_graph:", *a, file=sys.stderr, flush=True))
    beam = _beam_version()
    say(f"creating {venv} (apache-beam[gcp]=={beam} over this environment; "
        "takes minutes)")
    if venv.exists():
        import shutil
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    py = str(overlay_venv(venv))
    dropped = install_keeping_pins(
        py, venv / "constraints.txt", [f"apache-beam[gcp]=={beam}",
                                       # the venv's own bundled setuptools
                                       # would shadow the project's (it
                                       # builds the workers' sdist)
                                       "setuptools"])
    if dropped:
        say("pins of this environment the gcp extra replaces inside the "
            "venv:", ", ".join(sorted(dropped)))
    # The project's modules must import under the venv's python as they do
    # here (tensorflow, protobuf and Beam's Dataflow client together).
    check = ("import tensorflow, google.protobuf, apache_beam;"
             "from apache_beam.runners.dataflow import dataflow_runner;"
             "from google.cloud import dataflow_v1beta3;"
             "import dpsynth.dp_ops.noise, dpsynth.pipelines.job")
    subprocess.run([py, "-c", check], check=True, cwd=str(REPO),
                   env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    _stamp(venv).write_text(json.dumps({"beam": beam,
                                        "dropped_pins": sorted(dropped)}))
    say(f"ready: {py}")
    return Path(py)


# ------------------------------------------------------------ the graphs
# Everything below imports Beam's Dataflow client: run it with the venv's
# python (``main`` re-runs itself there).


def _recording_client(options, root_staging_location):
    """Beam's own DataflowApplicationClient, with staging recorded instead
    of uploaded; built from a ``--no_auth`` copy of the options so no
    credential lookup happens (the job keeps the options as given)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.dataflow.internal import apiclient

    class RecordingClient(apiclient.DataflowApplicationClient):
        def __init__(self, opts, root):
            super().__init__(opts, root)
            self._enable_caching = False  # the cache lookup reads GCS
            self.staged: list[dict] = []

        def _gcs_file_copy(self, from_path, to_path, sha256):
            self.staged.append({"from": from_path, "to": to_path,
                                "bytes": os.path.getsize(from_path),
                                "sha256": sha256,
                                "members": _archive_members(from_path)})

        def stage_file(self, gcs_or_local_path, file_name, stream,
                       mime_type="application/octet-stream", total_size=None):
            data = stream.read()
            self.staged.append({"from": "<memory>",
                                "to": f"{gcs_or_local_path.rstrip('/')}/{file_name}",
                                "bytes": len(data),
                                "sha256": hashlib.sha256(data).hexdigest()})

    no_auth = PipelineOptions.from_dictionary(
        {**options.get_all_options(drop_default=True), "no_auth": True})
    return RecordingClient(no_auth, root_staging_location)


def _archive_members(path: str) -> Optional[list[str]]:
    """The files inside a staged sdist/wheel (what workers will install)."""
    import tarfile
    import zipfile
    try:
        if tarfile.is_tarfile(path):
            with tarfile.open(path) as tar:
                return sorted(m.name for m in tar.getmembers() if m.isfile())
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                return sorted(z.namelist())
    except (OSError, tarfile.TarError, zipfile.BadZipFile):
        pass
    return None


def describe(job) -> dict:
    """The description Dataflow would receive for a dry-run ``job``
    (``apiclient.Job``): Beam's ``create_job_description`` with staging
    recorded."""
    from google.protobuf import json_format
    client = _recording_client(job.options, job.root_staging_location)
    client.create_job_description(job)
    return {"job": json.loads(job.json()),
            "pipeline": json.loads(json_format.MessageToJson(
                job.proto_pipeline)),
            "staged": client.staged}


class _Capture:
    """Patches DataflowRunner.run_pipeline to keep each dry-run Job,
    described while the pipeline runs (the files it stages, such as the
    package's sdist, live in the pipeline's scratch folder only until the
    run ends: pipelines/runners/temp_cleanup.py)."""

    def __init__(self) -> None:
        self.descriptions: list[dict] = []

    def __enter__(self):
        from apache_beam.options.pipeline_options import TestOptions
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
        original = DataflowRunner.run_pipeline
        capture = self

        def run_pipeline(runner, pipeline, options):
            if not options.view_as(TestOptions).dry_run:
                raise RuntimeError("job_graph builds graphs with --dry_run "
                                   "only; refusing to submit")
            result = original(runner, pipeline, options)
            capture.descriptions.append(describe(result.job))
            return result

        self._undo = (DataflowRunner, original)
        DataflowRunner.run_pipeline = run_pipeline
        return self

    def __exit__(self, *exc) -> None:
        cls, original = self._undo
        cls.run_pipeline = original


def stand_in_counts(text: Optional[str], num_labels: int) -> "list[float]":
    """``--phase1-counts``: one number (every class) or one per class."""
    if not text:
        return [DEFAULT_COUNT] * num_labels
    values = [float(v) for v in text.split(",")]
    if len(values) == 1:
        return values * num_labels
    if len(values) != num_labels:
        raise ValueError(f"--phase1-counts: {len(values)} values for "
                         f"{num_labels} classes")
    return values


def build_graphs(generate_argv: Sequence[str],
                 phase1_counts: Optional[str] = None) -> dict:
    """Dry-run Dataflow descriptions of the run these `dpsynth generate`
    flags (Beam's options included) would launch: {"phase1", "phase2"}
    for ``--covariance auto``, {"main"} for a fixed plan."""
    from dpsynth.pipelines.cli import generate
    from dpsynth.pipelines import graph, job_plan
    from dpsynth.pipelines.runners.options import beam_options
    from dpsynth.transforms.progress import ProgressFile

    args, beam_argv = generate.parser().parse_known_args(list(generate_argv))
    beam_argv = [*beam_argv, "--dry_run=True"]
    spec = generate.spec_from_args(args, beam_argv)
    options = beam_options(spec.run.beam_args)
    runner = str(options.get_all_options().get("runner") or "")
    if runner.lower() not in ("dataflow", "dataflowrunner"):
        raise ValueError(f"--runner must be DataflowRunner, got {runner!r}")
    job = job_plan.prepare(spec)  # validates, calibrates; reads no rows
    if job.already_published:
        raise ValueError(f"run {job.run_id} is already published at "
                         f"{job.output}: a launch would build no graph")
    no_progress = ProgressFile(None)  # as on any remote runner
    out: dict = {"run_id": job.run_id}
    # As a launch does: the key goes to --noise-key-location, the graph
    # holds only its URI; the object is deleted when the build ends.
    key_object = graph.store_noise_key(job, spec)
    try:
        _build(job, spec, options, no_progress, phase1_counts, out)
    finally:
        if key_object is not None:
            from dpsynth.transforms.keyed_noise import delete_key
            delete_key(key_object)
    return out


def _build(job, spec, options, no_progress, phase1_counts,
           out: dict) -> None:
    from unittest import mock

    import apache_beam as beam
    import numpy as np
    from apache_beam.io.filesystems import FileSystems

    from dpsynth.pipelines import graph, job_plan
    with _Capture() as capture:
        reader = job_plan.make_reader(job, spec)
        if job.adaptive_mu is None:
            p = beam.Pipeline(options=options)
            graph.build(p, job, reader, spec, no_progress)
            p.run().wait_until_finish()
            names = ["main"]
        else:
            counts = np.array(stand_in_counts(phase1_counts,
                                              len(job.cfg.labels)))
            centre = np.zeros(reader.dim)
            # Phase 1 as a launch runs it; its output file is never written
            # (dry run), so the stand-in result takes its place.
            with mock.patch.object(graph, "read_phase1",
                                   return_value=(centre, counts)), \
                    mock.patch.object(FileSystems, "delete"):
                centre, counts = graph.run_phase1(job, reader, options,
                                                  no_progress)
            structure = graph.choose_phase2(job, reader.dim, counts)
            reader = job_plan.make_reader(job, spec)
            p = beam.Pipeline(options=options)
            graph.build_adaptive(p, job, reader, spec, centre, counts,
                                 no_progress)
            p.run().wait_until_finish()
            names = ["phase1", "phase2"]
            out["structure"] = structure.name
            out["stand_in_counts"] = counts.tolist()
    for name, description in zip(names, capture.descriptions,
                                 strict=True):
        out[name] = description


# ------------------------------------------------------- review helpers
# Plain functions over the printed JSON (no Dataflow client needed).

_BASE64_RUN = re.compile(rb"[A-Za-z0-9+/]{64,}={0,2}")


def pipeline_bytes(pipeline_json: dict) -> bytes:
    """The serialized portable pipeline (what is staged as pipeline.pb)."""
    from apache_beam.portability.api import beam_runner_api_pb2
    from google.protobuf import json_format
    return json_format.ParseDict(
        pipeline_json, beam_runner_api_pb2.Pipeline(),
        ignore_unknown_fields=False).SerializeToString()


def decoded_blobs(data: bytes, depth: int = 0) -> Iterator[bytes]:
    """``data`` and every payload inside it that Beam's pickler wrote
    (base64 of compressed pickles: DoFns, CombineFns, Create's
    values), recursively: what a reader of the graph can recover."""
    yield data
    if depth >= 4:
        return
    for match in _BASE64_RUN.finditer(data):
        run = match.group()
        for shift in range(4):  # a length byte may look like base64
            chunk = run[shift:]
            chunk = chunk[:len(chunk) // 4 * 4]
            try:
                inner = _inflate(base64.b64decode(chunk, validate=True))
            except binascii.Error:
                continue
            if inner is not None:
                yield from decoded_blobs(inner, depth + 1)
                break


def _inflate(data: bytes) -> Optional[bytes]:
    """A compressed payload's bytes (Beam's pickler: bz2 for cloudpickle,
    zlib for dill), else None."""
    for decompress, errors in ((bz2.decompress, (OSError, ValueError)),
                               (zlib.decompress, (zlib.error,))):
        try:
            return decompress(data)
        except errors:
            pass
    return None


def transform_payload_sizes(pipeline_json: dict) -> dict[str, int]:
    """Serialized size of each transform (its spec payload included)."""
    from apache_beam.portability.api import beam_runner_api_pb2
    from google.protobuf import json_format
    proto = json_format.ParseDict(pipeline_json, beam_runner_api_pb2.Pipeline())
    return {t.unique_name: t.ByteSize()
            for t in proto.components.transforms.values()}


def _gcp_importable() -> bool:
    """Beam's Dataflow client's dependencies (found, not imported)."""
    from importlib.util import find_spec
    try:
        return all(find_spec(name) is not None for name in
                   ("google.cloud.dataflow_v1beta3", "apitools"))
    except ImportError:  # a parent package is missing
        return False


def _summary(name: str, doc: dict) -> str:
    sizes = transform_payload_sizes(doc["pipeline"])
    env = doc["job"].get("environment", {})
    pools = env.get("workerPools", [{}])
    return (f"{name}: {len(sizes)} transforms, largest "
            f"{max(sizes.values())} bytes, pipeline "
            f"{len(pipeline_bytes(doc['pipeline']))} bytes; type "
            f"{doc['job'].get('type')}; machine "
            f"{pools[0].get('machineType')}; staged "
            f"{[s['to'].rsplit('/', 1)[-1] for s in doc['staged']]}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("setup", "print"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[0] == "setup":
        try:
            print(ensure_venv())
        except (HelperVenvFailed, subprocess.CalledProcessError) as err:
            print(f"job_graph.py setup: the gcp venv: {err}", file=sys.stderr)
            return 1
        return 0
    parser = argparse.ArgumentParser(
        prog="job_graph.py print", add_help=False,
        description="dry-run Dataflow job descriptions of a generate run")
    parser.add_argument("--out", default=None,
                        help="folder for <phase>.job.json (default: one "
                        "JSON document on stdout)")
    parser.add_argument("--phase1-counts", default=None,
                        help="stand-in noisy class counts for phase 2: one "
                        f"number or one per class (default {DEFAULT_COUNT:g})")
    ns, rest = parser.parse_known_args(argv[1:])
    if not _gcp_importable():  # re-run under the gcp venv's python
        python = ensure_venv()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
        return subprocess.run([str(python), str(Path(__file__).resolve()),
                               *argv], env=env).returncode
    try:
        graphs = build_graphs(rest, ns.phase1_counts)
    except ValueError as err:
        print(f"job_graph.py print: {err}", file=sys.stderr)
        return 2
    if ns.out is None:
        json.dump(graphs, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    phases = [k for k in ("main", "phase1", "phase2") if k in graphs]
    for name in phases:
        (out / f"{name}.job.json").write_text(
            json.dumps(graphs[name], indent=1, sort_keys=True))
        print(_summary(name, graphs[name]))
    meta = {k: v for k, v in graphs.items() if k not in phases}
    (out / "plan.json").write_text(json.dumps(meta, indent=1))
    if "structure" in meta:
        print(f"phase 2 built for the stand-in counts "
              f"{meta['stand_in_counts']}: covariance {meta['structure']}")
    return 0


if __name__ == "__main__":
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    sys.exit(main())
