"""A real cluster boundary (issue 60): on a cluster that is not on this
machine dpsynth refuses every local path, in one line naming the flag,
before anything is read or any engine contacted; it needs
--noise-key-location there; and a Dask cluster's workers must run the
launcher's dpsynth (version and source digest) before work is submitted.

The flag x engine table: ``test_a_local_path_is_refused_on_a_cluster_
elsewhere`` (one cell each); ``pytest -s -k table`` prints it as markdown.
Engines that cannot start here (Dataflow, Flink, Spark, remote job
servers) are refused from the flags alone: every network connection fails
the test while they run (``no_network``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from dpsynth.pipelines.runners import locality
from dpsynth.pipelines.cli import generate

REPO = Path(__file__).resolve().parent.parent
FAR = "203.0.113.7"  # TEST-NET-3: never this machine
SHARED = {"--input": "gs://b/in/*.npz", "--output": "gs://b/out",
          "--budget-store": "gs://b/budgets",
          "--noise-key-location": "gs://b/keys"}
LOCAL = {"--input": "/data/in.npz", "--output": "/data/out",
         "--budget-store": "/data/budgets",
         "--noise-key-location": "/data/keys",
         "--temp_location": "/data/tmp", "--images": "/data/images",
         "--bad-images-report": "/data/bad.tsv",
         "--encoder-weights": "/data/weights.pt"}
# Each cell: the shared run with one flag local (or left out: its default
# is local), and the (flag, path) the refusal names (None: the default).
CASES = {
    "--input": ({"--input": LOCAL["--input"]}, "--input"),
    "demo (no --input)": ({"--input": None}, "--input"),
    "--output": ({"--output": LOCAL["--output"]}, "--output"),
    "default --output": ({"--output": None}, "--output"),
    "--budget-store": ({"--budget-store": LOCAL["--budget-store"]},
                       "--budget-store"),
    "--noise-key-location": ({"--noise-key-location":
                              LOCAL["--noise-key-location"]},
                             "--noise-key-location"),
    "--temp_location": ({"--temp_location": LOCAL["--temp_location"]},
                        "--temp_location"),
    "--images": ({"--input": None, "--images": LOCAL["--images"]},
                 "--images"),
    "--bad-images-report": ({"--input": None, "--images": "gs://b/images",
                             "--bad-images-report":
                             LOCAL["--bad-images-report"]},
                            "--bad-images-report"),
    "--encoder-weights": ({"--input": None, "--images": "gs://b/images",
                           "--encoder-weights": LOCAL["--encoder-weights"]},
                          "--encoder-weights"),
}
# Engines that are not on this machine, and the clause naming why.
ELSEWHERE = {
    "dask remote scheduler": (
        ["--runner", "dask", f"--dask_client_address=tcp://{FAR}:8786"],
        f"the Dask scheduler (--dask_client_address tcp://{FAR}:8786) is "
        "not on this machine"),
    "dask scheduler file": (
        ["--runner", "dask", "--dask_scheduler_file={file}"],
        "the Dask scheduler (--dask_scheduler_file {file}: "
        f"tcp://{FAR}:8786) is not on this machine"),
    "dataflow": (
        ["--runner", "DataflowRunner", "--project", "p", "--region", "r"],
        "Dataflow's workers are not on this machine"),
    "flink cluster": (
        ["--runner", "FlinkRunner", f"--flink_master={FAR}:8081"],
        f"the Flink cluster (--flink_master {FAR}:8081) is not on this "
        "machine"),
    "flink job server": (
        ["--runner", "FlinkRunner", f"--job_endpoint={FAR}:8099",
         "--environment_type=LOOPBACK"],
        f"the job server (--job_endpoint {FAR}:8099) is not on this "
        "machine"),
    "spark cluster": (
        ["--runner", "SparkRunner", f"--spark_master_url=spark://{FAR}:7077"],
        f"the Spark cluster (--spark_master_url spark://{FAR}:7077) is not "
        "on this machine"),
    "prism job server": (
        ["--runner", "PrismRunner", f"--job_endpoint={FAR}:8073"],
        f"the job server (--job_endpoint {FAR}:8073) is not on this "
        "machine"),
    "portable job server": (
        ["--runner", "PortableRunner", f"--job_endpoint={FAR}:8099"],
        f"the job server (--job_endpoint {FAR}:8099) is not on this "
        "machine"),
    "local job server, docker workers": (
        ["--runner", "PortableRunner", "--job_endpoint=localhost:8099",
         "--environment_type=DOCKER"],
        "the SDK workers (--environment_type DOCKER) are not on this "
        "machine's file system"),
}
# Engines on this machine: every local path is accepted.
HERE = {
    "direct": [],
    "dask local cluster": ["--runner", "dask"],
    "dask loopback scheduler": ["--runner", "dask",
                                "--dask_client_address=tcp://127.0.0.1:8786"],
    "prism started here": ["--runner", "PrismRunner",
                           "--prism_location=/opt/prism"],
    "prism, local pool": ["--runner", "PrismRunner",
                          "--job_endpoint=localhost:8073",
                          "--environment_type=EXTERNAL",
                          "--environment_config=localhost:50000"],
    "flink embedded": ["--runner", "FlinkRunner", "--flink_master=[local]",
                       "--environment_type=LOOPBACK",
                       "--job_endpoint=localhost:8099"],
    "spark local": ["--runner", "SparkRunner", "--spark_master_url=local[2]"],
}
WHAT = {"--input": "the built-in demo reads its rows from this machine's "
                   "temporary folder",
        "--output": "the default ./dpsynth-releases/<run id> is a local path"}


def _argv(case: str, engine_flags: list[str]) -> list[str]:
    values = {**SHARED, **CASES[case][0]}
    argv = ["--num-classes", "3", "--dataset-id", "d",
            "--lifetime-epsilon", "10"]
    for flag, value in values.items():
        if value is not None:
            argv += [flag, value]
    return argv + engine_flags


def _expected(case: str, clause: str) -> str:
    overrides, flag = CASES[case]
    path = overrides[flag]
    named = f"{flag} not given: {WHAT[flag]}" if path is None else \
        f"{flag} {path} is a local path"
    why = ("a cluster's runs need one lifetime ledger that every launcher "
           "shares" if flag == "--budget-store" else
           "the workers cannot use this machine's files")
    return (f"dpsynth: error: {named}, but {clause}: {why}; a shared "
            "location (gs://BUCKET/PATH) is needed")


@pytest.fixture
def no_network(monkeypatch):
    """Any connection (an engine, GCS) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a network connection was attempted: {args}")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """The temporary folder (the demo writes its rows there)."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


def _engine(name: str, tmp_path: Path) -> tuple[list[str], str]:
    flags, clause = ELSEWHERE[name]
    if "{file}" in " ".join(flags):
        file = tmp_path / "scheduler.json"
        file.write_text(json.dumps({"address": f"tcp://{FAR}:8786"}))
        flags = [f.format(file=file) for f in flags]
        clause = clause.format(file=file)
    return flags, clause


def _refusal(argv, capsys) -> tuple[int, str]:
    rc = generate.main(argv)
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("engine", sorted(ELSEWHERE))
@pytest.mark.parametrize("case", list(CASES))
def test_a_local_path_is_refused_on_a_cluster_elsewhere(
        case, engine, tmp_path, capsys, no_network, private_tmp):
    flags, clause = _engine(engine, tmp_path)
    rc, err = _refusal(_argv(case, flags), capsys)
    assert (rc, err) == (2, _expected(case, clause))
    assert os.listdir(private_tmp) == []  # the demo's rows not written


@pytest.mark.parametrize("engine", sorted(HERE))
def test_every_local_path_is_accepted_on_this_machine(engine):
    for case in CASES:
        _accepted(case, HERE[engine])


def _accepted(case: str, engine_flags: list[str]) -> None:
    """The launcher's boundary checks pass (the run would go on)."""
    from dpsynth.pipelines import job_plan
    args, beam_argv = generate.parser().parse_known_args(
        _argv(case, engine_flags))
    job_plan._check_cluster_boundary(generate.spec_from_args(args, beam_argv))


def test_refusal_table(tmp_path, capsys, no_network, private_tmp):
    """The flag x engine table (printed with -s): each refusal's one line,
    and "runs" on the engines on this machine."""
    rows = []
    for case in CASES:
        cells = []
        for engine in sorted(ELSEWHERE):
            flags, clause = _engine(engine, tmp_path)
            rc, err = _refusal(_argv(case, flags), capsys)
            assert rc == 2 and len(err.splitlines()) == 1, err
            cells.append("refused")
        for engine in HERE:
            _accepted(case, HERE[engine])
        rows.append(f"| {case} | {' | '.join(cells)} | accepted |")
    header = f"| flag | {' | '.join(sorted(ELSEWHERE))} | {', '.join(HERE)} |"
    lines = [header, "|" + " --- |" * (len(ELSEWHERE) + 2), *rows]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
        for engine in sorted(ELSEWHERE):
            flags, clause = _engine(engine, tmp_path)
            print(f"{engine}: {_expected('--input', clause)}")


# ------------------------------------------------------------- noise key

@pytest.mark.parametrize("engine", sorted(set(ELSEWHERE) - {"dataflow"}))
def test_a_cluster_elsewhere_needs_a_noise_key_location(
        engine, tmp_path, capsys, no_network):
    flags, clause = _engine(engine, tmp_path)
    argv = _without(_argv("--temp_location", flags), "--noise-key-location")
    rc, err = _refusal(argv, capsys)
    assert rc == 2 and err == (
        f"dpsynth: error: {clause}: the job graph travels to it over the "
        "network and stays in its memory, and a noise key pickled into it "
        "would let whoever reads either remove the noise: pass "
        "--noise-key-location gs://BUCKET/PATH, readable only by the "
        "workers (the key is written there for the run and deleted after "
        "it)")


def test_dataflow_keeps_its_own_noise_key_line(capsys, no_network):
    argv = _without(_argv("--temp_location", ELSEWHERE["dataflow"][0]),
                    "--noise-key-location")
    rc, err = _refusal(argv, capsys)
    assert rc == 2 and "DataflowRunner keeps the job graph" in err


def test_a_seeded_run_needs_no_key_location(tmp_path, capsys, no_network):
    """Seeded noise is marked not private (its seed is the secret): the
    path checks still apply."""
    flags, clause = _engine("dask remote scheduler", tmp_path)
    argv = ["--num-classes", "3", "--input", "/data/in.npz", "--output",
            "gs://b/o", "--noise-seed", "1", *flags]
    rc, err = _refusal(argv, capsys)
    assert rc == 2 and err.startswith("dpsynth: error: --input /data/in.npz "
                                      "is a local path")


def _without(argv: list[str], flag: str) -> list[str]:
    if flag not in argv:
        return argv
    i = argv.index(flag)
    return argv[:i] + argv[i + 2:]


# ------------------------------------------------------------- the rule

def _own_address() -> str:
    ips = sorted(str(ip) for ip in locality.own_addresses()
                 if not ip.is_loopback)
    if not ips:
        pytest.skip("this host has no non-loopback address")
    return ips[0]


@pytest.mark.parametrize("address, here", [
    ("tcp://127.0.0.1:8786", True), ("127.0.0.2:8786", True),
    ("tcp://[::1]:8786", True), ("localhost:8786", True),
    ("tcp://0.0.0.0:8786", True), ("inproc://10.0.0.1/1/2", True),
    (f"tcp://{FAR}:8786", False), ("tls://10.231.7.2:8786", False),
    ("no-such-host.invalid:8786", False), ("", False),
])
def test_the_address_rule(address, here):
    assert (locality._here(address) if address else
            locality.on_this_machine(None)) is here


def test_this_hosts_own_interface_address_is_here():
    assert locality._here(f"tcp://{_own_address()}:8786")


@pytest.mark.parametrize("path, local", [
    ("/tmp/x", True), ("rel/x", True), ("file:///tmp/x", True),
    ("gs://b/x", False), ("s3://b/x", False), ("hdfs://n/x", False)])
def test_local_paths(path, local):
    assert locality.is_local_path(path) is local


def test_a_scheduler_file_here_is_here(tmp_path):
    file = tmp_path / "s.json"
    file.write_text(json.dumps({"address": "tcp://127.0.0.1:8786"}))
    opts = {"runner": "dask", "scheduler_file": str(file)}
    assert locality.elsewhere(opts) is None
    file.write_text(json.dumps({"address": f"tcp://{FAR}:8786"}))
    assert "not on this machine" in locality.elsewhere(opts)
    opts["scheduler_file"] = str(tmp_path / "missing.json")
    assert "not known to be on this machine" in locality.elsewhere(opts)


def test_an_unknown_runner_is_elsewhere():
    assert "not known to run on this machine" in locality.elsewhere(
        {"runner": "my.company.ClusterRunner"})


# ---------------------------------------------------- the workers' dpsynth

class _FakeClient:
    def __init__(self, answers: dict,
                 scheduler: str = "tcp://127.0.0.1:8786") -> None:
        self.answers = answers
        self.scheduler = types.SimpleNamespace(address=scheduler)

    def run(self, fn):
        return self.answers


def _ours() -> dict:
    pytest.importorskip("distributed")
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    return dask_cluster.worker_identity()


def test_workers_on_another_dpsynth_are_refused():
    from dpsynth.pipelines.runners.options import ClusterMismatch
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    ours = _ours()
    dask_cluster.check_workers(_FakeClient({"tcp://127.0.0.1:1": ours}))
    other = {**ours, "source_sha256": "0" * 64}
    with pytest.raises(ClusterMismatch) as err:
        dask_cluster.check_workers(_FakeClient({"tcp://127.0.0.1:1": ours,
                                               "tcp://127.0.0.1:2": other}))
    assert str(err.value).startswith(
        f"Dask worker tcp://127.0.0.1:2 runs dpsynth {ours['version']} "
        "(source sha256 000000000000), Beam ")
    assert "install the launcher's dpsynth and versions on every worker" \
        in str(err.value)


@pytest.mark.parametrize("field", ["beam", "distributed", "python"])
def test_workers_on_another_beam_distributed_or_python_are_refused(field):
    from dpsynth.pipelines.runners.options import ClusterMismatch
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    ours = _ours()
    other = {**ours, field: "0.0.1"}
    with pytest.raises(ClusterMismatch, match="0.0.1"):
        dask_cluster.check_workers(_FakeClient({"tcp://127.0.0.1:2": other}))


def test_a_secure_run_with_a_worker_elsewhere_needs_the_key_and_tls():
    """However the scheduler's address looks (here: loopback), a worker
    off this machine makes a secure run need --noise-key-location, and
    its traffic TLS; a seeded (not private) run needs neither."""
    from dpsynth.pipelines.runners.options import ClusterMismatch
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    ours = _ours()
    workers = {"tcp://127.0.0.1:1": ours, f"tcp://{FAR}:40000": ours}
    plain = _FakeClient(workers)
    dask_cluster.check_workers(plain)  # seeded: fine
    with pytest.raises(ClusterMismatch, match=(
            f"^Dask worker tcp://{FAR}:40000 is not on this machine: .*"
            "--noise-key-location")):
        dask_cluster.check_workers(plain, secure=True)
    with pytest.raises(ClusterMismatch, match="plain TCP.*clear text"):
        dask_cluster.check_workers(plain, secure=True, key_location="gs://k/")
    tls = _FakeClient(workers, scheduler="tls://127.0.0.1:8786")
    dask_cluster.check_workers(tls, secure=True, key_location="gs://k/")


def test_a_secure_run_on_a_scheduler_elsewhere_without_tls_is_refused():
    from dpsynth.pipelines.runners.options import ClusterMismatch
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    ours = _ours()
    far = _FakeClient({f"tcp://{FAR}:40000": ours},
                      scheduler=f"tcp://{FAR}:8786")
    with pytest.raises(ClusterMismatch, match=f"tcp://{FAR}:8786.*plain TCP"):
        dask_cluster.check_workers(far, secure=True, key_location="gs://k/")


def test_a_worker_elsewhere_refuses_local_paths():
    """A scheduler on this machine may have workers elsewhere: local paths
    are refused once the workers are known, before any work is sent."""
    from dpsynth.pipelines.runners.options import ClusterMismatch
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    ours = _ours()
    client = _FakeClient({"tcp://127.0.0.1:1": ours,
                          f"tcp://{FAR}:40000": ours})
    dask_cluster.check_workers(client)  # gs:// only: fine
    with pytest.raises(ClusterMismatch, match=(
            f"^--output /data/out is a local path, but Dask worker "
            f"tcp://{FAR}:40000 is not on this machine")):
        dask_cluster.check_workers(client, [("--output", "/data/out")])


def test_the_source_digest_follows_the_files(tmp_path):
    """An edited file (an editable install keeps its version) changes the
    digest; __pycache__ and non-code files do not."""
    copy = _copy_of_the_code(tmp_path / "a")
    base = _digest_in(copy)
    (copy / "pipelines" / "__pycache__").mkdir(exist_ok=True)
    (copy / "pipelines" / "__pycache__" / "x.pyc").write_bytes(b"x")
    (copy / "pipelines" / "notes.txt").write_text("x")
    assert _digest_in(copy) == base
    with open(copy / "dp_ops" / "noise.py", "a") as f:
        f.write("# edited\n")
    assert _digest_in(copy) != base
    # an edit that keeps every file's size (one letter for another)
    copy = _copy_of_the_code(tmp_path / "c")
    path = copy / "dp_ops" / "clipping.py"
    text = path.read_bytes()
    i = text.index(b"return")
    path.write_bytes(text[:i] + b"Return" + text[i + 6:])
    assert len(path.read_bytes()) == len(text)
    assert _digest_in(copy) != base
    from dpsynth.pipelines.runners import source_digest
    assert _digest_in(_copy_of_the_code(tmp_path / "b")) == \
        source_digest.source_sha256()


def _copy_of_the_code(dest: Path) -> Path:
    for name in ("dpsynth", "pipelines", "transforms", "dp_ops", "models"):
        shutil.copytree(REPO / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def _digest_in(root: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", "from dpsynth.pipelines.runners import source_digest;"
         "print(source_digest.source_sha256())"],
        env={**os.environ, "PYTHONPATH": str(root)}, cwd=root,
        capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("dask") is None and not (
    Path(sys.executable).parent / "dask").exists(), reason="no dask CLI")
def test_a_real_worker_on_edited_code_stops_the_run_uncharged(tmp_path,
                                                              capsys):
    """A scheduler and a worker on loopback, the worker running a copy of
    the code with one edited file (an editable install: same version):
    `generate` stops in one line before anything is charged."""
    pytest.importorskip("distributed")
    copy = _copy_of_the_code(tmp_path / "code")
    with open(copy / "transforms" / "write.py", "a") as f:
        f.write("# edited on the worker\n")
    port = _free_port()
    dask = str(Path(sys.executable).parent / "dask")
    env = {**os.environ, "PYTHONPATH": str(copy)}
    procs = [subprocess.Popen(
        [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", ":0"], env=env, cwd=tmp_path,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        procs.append(subprocess.Popen(
            [dask, "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1",
             "--no-dashboard", "--local-directory", str(tmp_path / "w")],
            env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        _wait_workers(f"tcp://127.0.0.1:{port}", 1)
        store = tmp_path / "budgets"
        rc = generate.main([
            "--output", str(tmp_path / "out"), "--budget-store", str(store),
            "--dataset-id", "d", "--lifetime-epsilon", "10",
            "--runner", "dask", f"--dask_client_address=tcp://127.0.0.1:{port}"])
        err = capsys.readouterr().err.strip()
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(30)
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("dpsynth: error: Dask worker tcp://127.0.0.1:")
    assert "install the launcher's dpsynth and versions on every worker" in err
    from dpsynth.pipelines.budget import store as budget_store
    assert budget_store.history(str(store), "d") == []  # nothing charged
    assert not (tmp_path / "out").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_workers(address: str, n: int, timeout: float = 120) -> None:
    from distributed import Client
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with Client(address, timeout=5) as client:
                client.wait_for_workers(n, timeout=timeout)
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"no {n} workers at {address}")


@pytest.mark.parametrize("flags, named", [
    (["--images", "/data/images", "--output", "gs://b/e.npz"],
     "--images /data/images"),
    (["--images", "gs://b/images", "--output", "/data/e.npz"],
     "--output /data/e.npz"),
    (["--images", "gs://b/images", "--output", "gs://b/e.npz",
      "--bad-images-report", "/data/bad.tsv"], "--bad-images-report /data/bad.tsv"),
])
def test_encode_refuses_local_paths_on_a_cluster_elsewhere(
        flags, named, capsys, no_network):
    from dpsynth.pipelines import cli
    rc = cli.main(["encode", "--classes", "a,b", *flags, "--runner", "dask",
                   f"--dask_client_address=tcp://{FAR}:8786"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == (
        f"dpsynth: error: {named} is a local path, but the Dask scheduler "
        f"(--dask_client_address tcp://{FAR}:8786) is not on this machine: "
        "the workers cannot use this machine's files; a shared location "
        "(gs://BUCKET/PATH) is needed")


def test_an_unreachable_scheduler_stops_the_run_uncharged(tmp_path, capsys):
    """Asked before the reservation: one line, nothing charged (Beam's
    client used to fail after the attempt was reserved)."""
    pytest.importorskip("distributed")
    store = tmp_path / "budgets"
    rc = generate.main([
        "--output", str(tmp_path / "out"), "--budget-store", str(store),
        "--dataset-id", "d", "--lifetime-epsilon", "10", "--runner", "dask",
        f"--dask_client_address=tcp://127.0.0.1:{_free_port()}",
        "--dask_connection_timeout=2"])
    err = capsys.readouterr().err.strip()
    assert rc != 0 and len(err.splitlines()) == 1, err
    assert err.startswith("dpsynth: error: cannot reach the Dask scheduler "
                          "at tcp://127.0.0.1:")
    from dpsynth.pipelines.budget import store as budget_store
    assert budget_store.history(str(store), "d") == []
    assert not (tmp_path / "out").exists()


# ------------------------------------------------- TLS mistakes, one line

@pytest.fixture(scope="module")
def tls_scheduler():
    """A TLS scheduler on loopback (in-process, one worker thread)."""
    pytest.importorskip("distributed")
    from distributed import LocalCluster
    from distributed.security import Security
    security = Security.temporary()
    cluster = LocalCluster(n_workers=1, processes=False, protocol="tls://",
                           security=security, host="127.0.0.1",
                           dashboard_address=None)
    yield cluster.scheduler_address, security
    cluster.close()


def _tls_settings(security, ca=None) -> dict:
    return {"distributed.comm.tls.ca-file": ca or security.tls_ca_file,
            "distributed.comm.tls.client.cert": security.tls_client_cert,
            "distributed.comm.tls.client.key": security.tls_client_key}


@pytest.mark.parametrize("mistake", ["no settings", "missing files",
                                     "another CA"])
def test_a_tls_mistake_is_one_line_naming_the_settings(tls_scheduler,
                                                       mistake):
    """An operator's TLS mistake was a 73-77-line traceback: now one line
    naming Dask's TLS settings, raised before anything is charged."""
    import dask
    from distributed.security import Security
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    from dpsynth.pipelines.runners.options import ClusterMismatch, beam_options
    address, security = tls_scheduler
    settings = {"no settings": {},
                "missing files": {
                    "distributed.comm.tls.ca-file": "/nonexistent/ca.pem",
                    "distributed.comm.tls.client.cert": "/nonexistent/c.pem",
                    "distributed.comm.tls.client.key": "/nonexistent/k.pem"},
                "another CA": _tls_settings(
                    security, ca=Security.temporary().tls_ca_file)}[mistake]
    options = beam_options(["--runner", "dask",
                            f"--dask_client_address={address}",
                            "--dask_connection_timeout=5"])
    with dask.config.set(settings), pytest.raises(ClusterMismatch) as err:
        dask_cluster.check_cluster(options)
    line = str(err.value)
    assert "\n" not in line and "a TLS setting is wrong" in line, line
    assert "distributed.comm.tls.ca-file" in line


def test_the_right_tls_settings_connect(tls_scheduler):
    import dask
    from dpsynth.pipelines.runners.dask import cluster as dask_cluster
    from dpsynth.pipelines.runners.options import beam_options
    address, security = tls_scheduler
    options = beam_options(["--runner", "dask",
                            f"--dask_client_address={address}"])
    with dask.config.set(_tls_settings(security)):
        dask_cluster.check_cluster(options)  # its worker runs this dpsynth


# ------------------------------------------- locality: names and pools

def test_a_name_resolving_to_loopback_and_a_remote_address_is_elsewhere(
        monkeypatch):
    """A name is on this machine only when every address it resolves to
    is: one that also resolves elsewhere (DNS round robin, a stale hosts
    line) counts as elsewhere."""
    monkeypatch.setattr(locality, "_resolve",
                        lambda host: ["127.0.0.1", FAR] if host == "mixed"
                        else ["127.0.0.1"])
    assert not locality.on_this_machine("mixed")
    assert locality.on_this_machine("only-loopback")
    opts = {"runner": "dask", "address": "tls://mixed:8786"}
    assert "not on this machine" in locality.elsewhere(opts)
    assert locality.noise_key_refusal(opts) is not None


@pytest.mark.parametrize("config, here", [
    ("localhost:50000", True), ("127.0.0.1:50000", True),
    (f"{FAR}:50000", False), ("mixed:50000", False)])
def test_an_external_worker_pool_is_where_its_config_points(monkeypatch,
                                                            config, here):
    monkeypatch.setattr(locality, "_resolve",
                        lambda host: ["127.0.0.1", FAR] if host == "mixed"
                        else [])
    opts = {"runner": "PortableRunner", "job_endpoint": "localhost:8099",
            "environment_type": "EXTERNAL", "environment_config": config}
    clause = locality.elsewhere(opts)
    assert (clause is None) is here, clause
    if not here:
        assert f"--environment_config {config}" in clause
