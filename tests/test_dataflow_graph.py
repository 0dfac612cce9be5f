"""Dataflow's own job description of a `dpsynth generate` run, built for
real with DataflowRunner ``--dry_run`` (deploy/dataflow/job_graph.py), for
both phases of the default adaptive plan (phase 2 from a stand-in phase-1
result): translated steps, staging, worker options, nothing Dataflow
refuses, and what the description would carry to Google.

The graph builder runs in a subprocess with the separate gcp virtualenv's
python (Beam's ``gcp`` extra stays out of the project's environment; .ci/run
prepares it with ``python deploy/dataflow/job_graph.py setup``). Without that
venv the module skips, unless ``CI=true`` (then it builds the venv, and a
failure fails). The input lives on the GCS emulator (tests/gcs_emulator.py),
so the graph names gs:// objects as a real launch does; the Dataflow temp
bucket exists nowhere, and the test checks nothing was written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gcs_emulator import emulator_env, gcs_server  # noqa: E402,F401

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "deploy" / "dataflow"))
import job_graph  # noqa: E402

from dpsynth.deploy import runner_options  # noqa: E402
from tests.conftest import gmm_data  # noqa: E402
from dpsynth.transforms.write import tfrecord_bytes  # noqa: E402

# A fixed SecureNoise key, set in the builder process: by construction it
# must not travel in the graph (see test_graph_holds_no_noise_key).
NOISE_KEY = hashlib.sha256(b"dpsynth test: a known noise key").digest()
PROJECT = "dpsynth-fake-project"
TEMP = "gs://dpsynth-never-created-bucket/tmp"  # exists nowhere
MACHINE = "n2-highmem-8"
MAX_WORKERS = 7
DIM, CLASSES = 8, 3
MiB = 1 << 20

# The builder: SecureNoise with the known key, then job_graph's CLI.
_DRIVER = """
import sys
from dpsynth.dp_ops import noise
key = bytes.fromhex(sys.argv[1])
noise.SecureNoise.__init__ = lambda self: noise.KeyedNoise.__init__(self, key)
sys.path.insert(0, sys.argv[2])
import job_graph
sys.exit(job_graph.main(sys.argv[3:]))
"""


def _gcp_python() -> Path:
    if job_graph.venv_ready():
        return job_graph.venv_python()
    if os.environ.get("CI") != "true":
        pytest.skip(f"no Dataflow (gcp) venv at {job_graph.venv_dir()}: "
                    "run `python deploy/dataflow/job_graph.py setup` once "
                    "(minutes, ~350 MB); CI=true builds it here")
    return job_graph.ensure_venv()


@pytest.fixture(scope="module")
def built(gcs_server, tmp_path_factory):
    """Both phases' descriptions of one run reading two TFRecord files."""
    python = _gcp_python()
    local = tmp_path_factory.mktemp("dataflow-graph")
    env = {**os.environ, **emulator_env(gcs_server),
           "PYTHONPATH": os.pathsep.join([str(REPO / "tests" / "plugins"),
                                          str(REPO)]),
           "TF_CPP_MIN_LOG_LEVEL": "3"}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in emulator_env(gcs_server).items():
            mp.setenv(key, value)
        from google.cloud import storage
        client = storage.Client()
        bucket = client.create_bucket(f"dpsynth-private-{os.urandom(4).hex()}")
        x, y = gmm_data(900, d=DIM, classes=CLASSES, seed=3)
        inputs = []
        for i in range(2):
            name = f"private/part-{i}-of-2.tfrecord"
            part = slice(450 * i, 450 * (i + 1))
            data = b"".join(tfrecord_bytes(x[part][y[part] == c], c)
                            for c in range(CLASSES))
            bucket.blob(name).upload_from_string(data)
            inputs.append(f"gs://{bucket.name}/{name}")
        pattern = f"gs://{bucket.name}/private/part-*.tfrecord"
        beam_args = runner_options.dataflow_args(
            project=PROJECT, temp_location=TEMP, machine_type=MACHINE,
            max_num_workers=MAX_WORKERS, job_name="dpsynth-review")
        out = local / "graphs"
        proc = subprocess.run(
            [str(python), "-c", _DRIVER, NOISE_KEY.hex(),
             str(REPO / "deploy" / "dataflow"), "print", "--out", str(out),
             "--phase1-counts", "400,300,200",
             "--input", pattern, "--num-classes", str(CLASSES),
             "--embedding-dim", str(DIM),  # TFRecord records none
             "--output", f"gs://{bucket.name}/releases/r1",
             "--run-id", "review-1", "--noise-key-location",
             f"gs://{bucket.name}/keys", *beam_args],
            cwd=str(local), env=env, capture_output=True, text=True,
            timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        objects = sorted(b.name for b in client.list_blobs(bucket.name))
        temp_bucket = client.lookup_bucket(TEMP[5:].split("/")[0])
    docs = {phase: json.loads((out / f"{phase}.job.json").read_text())
            for phase in ("phase1", "phase2")}
    return {"docs": docs, "plan": json.loads((out / "plan.json").read_text()),
            "stdout": proc.stdout, "inputs": inputs, "pattern": pattern,
            "objects": objects, "temp_bucket": temp_bucket,
            "local": str(local)}


def _transforms(doc: dict) -> dict:
    return {t["uniqueName"]: t
            for t in doc["pipeline"]["components"]["transforms"].values()}


def _blobs(doc: dict) -> list[bytes]:
    """The serialized graph and every pickled payload decoded from it,
    plus the job JSON (options, environment) as text."""
    return [*job_graph.decoded_blobs(job_graph.pipeline_bytes(doc["pipeline"])),
            json.dumps(doc["job"]).encode()]


def test_both_phases_translate_to_the_expected_steps(built):
    phase1 = _transforms(built["docs"]["phase1"])
    phase2 = _transforms(built["docs"]["phase2"])
    for name in ("CountsRead/ListRanges", "CountsRead/SpreadRanges",
                 "CountsRead/ReadBlocks", "Phase1/DPCentre",
                 "Phase1/CentreAndCounts", "Phase1/Total",
                 "Phase1/NoisyCounts", "WritePhase1"):
        assert name in phase1, name
    # Phase 1 reads each block once for both aggregates (one global
    # combine): a second reader made every block a task of its own on Dask.
    blocks = set(phase1["CountsRead/ReadBlocks"]["outputs"].values())
    readers = [n for n, t in phase1.items() if not t.get("subtransforms")
               and blocks & set(t.get("inputs", {}).values())]
    assert len(readers) == 1, readers
    for name in ("PublicCentre", "AdaptiveMixture/MomentsRead/ReadBlocks",
                 "AdaptiveMixture/ClassSums/Partials",
                 "AdaptiveMixture/ClassSums/Aggregate",
                 "Sample/RowsToDraw", "Write/SpreadShards",
                 "Write/WriteShards", "Write/WriteSummary"):
        assert name in phase2, name
    # The per-class mode forms each class's mixture in its own step; the
    # other modes noise a global matrix in one.
    mixture = ("AdaptiveMixture/ClassMixture"
               if built["plan"]["structure"].startswith("per-class")
               else "AdaptiveMixture/Phase2Noise")
    assert mixture in phase2, (built["plan"]["structure"], mixture)
    assert not any(name.startswith("Counts") for name in phase2)
    # The stand-in counts went through the real rule (choose_phase2).
    assert built["plan"]["stand_in_counts"] == [400.0, 300.0, 200.0]
    assert built["plan"]["structure"]
    assert "covariance" in built["stdout"]


def test_batch_job_with_the_requested_workers(built):
    for doc in built["docs"].values():
        job = doc["job"]
        assert job["type"] == "JOB_TYPE_BATCH"
        assert job["name"] == "dpsynth-review"
        env = job["environment"]
        pool, = env["workerPools"]
        assert pool["machineType"] == MACHINE
        assert pool["autoscalingSettings"]["maxNumWorkers"] == MAX_WORKERS
        options = env["sdkPipelineOptions"]["options"]
        assert options["project"] == PROJECT
        assert options["region"] == runner_options.DEFAULT_REGION
        assert env["tempStoragePrefix"].startswith(
            "storage.googleapis.com/dpsynth-never-created-bucket/tmp/")
        assert "use_runner_v2" in env["experiments"]


def test_workers_get_the_project_and_a_beam_container(built):
    for doc in built["docs"].values():
        env = doc["job"]["environment"]
        options = env["sdkPipelineOptions"]["options"]
        assert options["setup_file"] == runner_options.SETUP_FILE
        image, = {c["containerImage"] for c in
                  env["workerPools"][0]["sdkHarnessContainerImages"]}
        assert image.endswith("_sdk:" + _beam_version()), image
        staged = {s["to"].rsplit("/", 1)[-1]: s for s in doc["staged"]}
        assert {"workflow.tar.gz", "pipeline.pb"} <= set(staged)
        assert all(s["to"].startswith(TEMP + "/staging/")
                   for s in staged.values())
        members = staged["workflow.tar.gz"]["members"]
        for module in ("pipelines/job.py", "transforms/io/read.py",
                       "dp_ops/noise.py", "setup.py", "pyproject.toml"):
            assert any(m.endswith("/" + module) for m in members), module
        # the sdist carries code, no data files of the checkout
        assert not [m for m in members
                    if m.endswith((".npz", ".tfrecord", ".parquet"))]
        packages = {p["name"] for p in env["workerPools"][0]["packages"]}
        assert "workflow.tar.gz" in packages


def test_nothing_dataflow_refuses(built):
    for doc in built["docs"].values():
        pipeline = doc["pipeline"]
        transforms = pipeline["components"]["transforms"].values()
        leaves = {t["spec"]["urn"] for t in transforms
                  if not t.get("subtransforms")}
        assert leaves <= {"beam:transform:impulse:v1",
                          "beam:transform:pardo:v1",
                          "beam:transform:group_by_key:v1",
                          "beam:transform:flatten:v1"}, leaves
        bounded = {p.get("isBounded") for p in
                   pipeline["components"]["pcollections"].values()}
        assert bounded == {"BOUNDED"}
        assert {e["urn"] for e in
                pipeline["components"]["environments"].values()} == {
                    "beam:env:docker:v1"}
        sizes = job_graph.transform_payload_sizes(pipeline)
        assert max(sizes.values()) < MiB, max(sizes, key=sizes.get)
        assert len(job_graph.pipeline_bytes(pipeline)) < 10 * MiB
        assert len(json.dumps(doc["job"])) < MiB


def test_no_local_paths_and_nothing_written(built):
    """The graph names gs:// data only (the builder's folder is nowhere in
    it; source file names inside pickled code are debug info), and the dry
    run wrote no object: the temp bucket was never created."""
    local = built["local"].encode()
    for doc in built["docs"].values():
        blobs = _blobs(doc)
        assert not [b for b in blobs if local in b]
        assert not [b for b in blobs if b"file://" in b]
    assert built["objects"] == sorted(
        i.split("/", 3)[3] for i in built["inputs"])
    assert built["temp_bucket"] is None


def test_payload_decoding_reaches_the_pickled_dofns(built):
    """The privacy checks below read the decoded pickles, not base64 text:
    make sure the decoder really opens them."""
    blobs = _blobs(built["docs"]["phase2"])
    assert any(b"_ReadBlocksFn" in b for b in blobs)
    assert any(b"StoredKeyNoise" in b for b in blobs)


def test_job_text_holds_no_noise_key(built):
    """The key in any printable form is in no option or environment field
    and not in the undecoded graph."""
    import base64
    for doc in built["docs"].values():
        text = json.dumps(doc)
        for form in (NOISE_KEY.hex(), base64.b64encode(NOISE_KEY).decode()):
            assert form not in text
        assert NOISE_KEY not in job_graph.pipeline_bytes(doc["pipeline"])


def test_graph_holds_no_noise_key(built):
    """The key reaches the workers through --noise-key-location (a
    restricted object written for the run and deleted after it): the graph
    holds only that object's URI (found by the review of issue 26 item 4:
    it used to be pickled into DPCentre, the phase-1 noise,
    AdaptiveMixture and Sample)."""
    uris = set()
    for phase, doc in built["docs"].items():
        blobs = _blobs(doc)
        hits = [b for b in blobs if NOISE_KEY in b]
        assert not hits, f"{phase}: the noise key is in {len(hits)} payloads"
        uris |= {b.count(b"dpsynth-noise-key-review-1-") for b in blobs}
    assert max(uris) > 0  # the reference travels instead
    assert not [o for o in built["objects"] if "noise-key" in o]  # deleted


def test_dataflow_without_a_key_location_is_refused(tmp_path, capsys):
    from dpsynth.pipelines import cli
    rc = cli.main(["generate", "--output", str(tmp_path / "r"),
                   "--runner", "DataflowRunner", "--project", PROJECT,
                   "--temp_location", TEMP])
    assert rc == 2
    assert "--noise-key-location" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_graph_holds_no_input_file_names(built):
    """Only the --input pattern travels; the workers list the files (found
    by the review of issue 26 item 4: the matched names and byte ranges used
    to be a beam.Create in the graph)."""
    for phase, doc in built["docs"].items():
        blobs = _blobs(doc)
        for name in built["inputs"]:
            hits = [b for b in blobs if name.encode() in b]
            assert not hits, f"{phase}: {name} is in the graph"


def _beam_version() -> str:
    from importlib.metadata import version
    return version("apache-beam")


def test_stand_in_counts_parsing():
    assert job_graph.stand_in_counts(None, 2) == [1000.0, 1000.0]
    assert job_graph.stand_in_counts("50", 3) == [50.0] * 3
    assert job_graph.stand_in_counts("1,2", 2) == [1.0, 2.0]
    with pytest.raises(ValueError, match="3 values for 2 classes"):
        job_graph.stand_in_counts("1,2,3", 2)


def test_decoded_blobs_opens_beam_pickles():
    from apache_beam.internal import pickler
    secret = b"\x00a secret that a pickled DoFn holds\xff"
    payload = pickler.dumps({"held": secret})
    framed = b"\x12\x41" + payload + b"\x1a"  # inside a proto field
    assert any(secret in b for b in job_graph.decoded_blobs(framed))


def test_submit_sh_graph_command(tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "deploy/dataflow/submit.sh"), "graph", "--input",
         "gs://b/in/*.npz", "--num-classes", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable,
             "PROJECT": "proj", "BUCKET": "gs://b", "PHASE1_COUNTS": "50"})
    assert proc.returncode == 0, proc.stderr
    cmd = shlex.split(proc.stdout)
    assert cmd[:3] == [sys.executable, "deploy/dataflow/job_graph.py", "print"]
    assert cmd[3:7] == ["--out", str(tmp_path / "dataflow-graph"),
                        "--phase1-counts", "50"]
    assert {"--runner=DataflowRunner", "--project=proj",
            "--temp_location=gs://b/tmp"} <= set(cmd)
    assert cmd[-4:] == ["--input", "gs://b/in/*.npz", "--num-classes", "3"]
