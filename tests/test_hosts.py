"""dpsynth on a Dask cluster of separate hosts that share nothing but the
scheduler's address and object storage (benchmarks/hosts.py: each host in
its own network and mount namespace, a GCS emulator on the bridge).

* Seeded jobs read gs:// inputs (several .npz, TFRecord and Parquet files),
  publish to gs:// and equal DirectRunner's releases byte for byte.
* An unseeded job with the budget store and the noise key on gs:// is
  charged once and readable with ``load_release``.
* Faults (marker ``hosts_faults``, ~3 min): a worker host killed in the
  middle of the moments pass and of the writers, a worker cut off for 20 s,
  a worker on a 10 mbit/s link: same bytes; the scheduler or the launcher
  killed: the run fails, the attempt is charged, a retry publishes once.

Needs root (namespaces); skips with the reason elsewhere. Module-scoped
cluster: ~30 s to start on 2 cores; the module ~2 min without the faults.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed", reason="needs apache-beam[dask]")

from benchmarks import hosts as hosts_harness  # noqa: E402
from gcs_emulator import _binary, _import_wrapper, use_emulator  # noqa: E402
from tests.conftest import assert_same_release, gmm_data  # noqa: E402
from dpsynth.transforms.write import tfrecord_bytes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
FLAGS = ["--num-classes", "3", "--epsilon", "3", "--rows-per-shard", "100",
         "--block-size", "64"]
KMEANS_VOTE = ["--clusters", "4", "--vote-filter", "--vote-threshold", "2",
               "--accountant", "rdp"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The emulator, a scheduler and two worker hosts (closed after the
    module, also when a test fails)."""
    reason = hosts_harness.unavailable()
    if reason:
        pytest.skip(f"no namespaces here: {reason}")
    binary = _binary(_import_wrapper())
    hosts_harness.cleanup_leftovers()  # of a killed earlier run
    folder = Path("/tmp") / f"dpsynth-hosts-{uuid.uuid4().hex[:6]}"
    with hosts_harness.Cluster(folder) as made:
        made.start_emulator(binary)
        made.start_scheduler()
        for _ in range(2):
            made.add_worker()
        yield made


@pytest.fixture(scope="module")
def bucket(cluster):
    """A bucket holding the inputs (three sets of several files)."""
    with pytest.MonkeyPatch.context() as patch:
        use_emulator(cluster.emulator_url, patch)
        from google.cloud import storage
        client = storage.Client(project=hosts_harness.EMULATOR_PROJECT)
        name = f"dpsynth-{uuid.uuid4().hex[:8]}"
        client.create_bucket(name)
        _upload_inputs(client.bucket(name))
        yield Bucket(client, name)


class Bucket:
    def __init__(self, client, name: str) -> None:
        self.client, self.name = client, name

    def uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.name}", *parts])

    def names(self, prefix: str = "") -> list[str]:
        return sorted(b.name for b in
                      self.client.list_blobs(self.name, prefix=prefix))

    def download(self, prefix: str, dest: Path) -> Path:
        for blob in self.client.list_blobs(self.name, prefix=prefix + "/"):
            path = dest / blob.name[len(prefix) + 1:]
            path.parent.mkdir(parents=True, exist_ok=True)
            blob.download_to_filename(str(path))
        return dest


def _upload_inputs(bucket) -> None:
    """600 rows of 3 classes, d=8, as 3 .npz, 2 TFRecord and 2 Parquet
    files (the same rows in each format)."""
    import io
    import pyarrow as pa
    import pyarrow.parquet as pq
    x, y = gmm_data(600, d=8, classes=3, seed=5)
    for i, (lo, hi) in enumerate([(0, 200), (200, 400), (400, 600)]):
        buf = io.BytesIO()
        np.savez(buf, embeddings=x[lo:hi], labels=y[lo:hi])
        bucket.blob(f"in/npz/part-{i}.npz").upload_from_string(
            buf.getvalue())
    for i, (lo, hi) in enumerate([(0, 300), (300, 600)]):
        records = b"".join(tfrecord_bytes(x[j:j + 1], int(y[j]))
                           for j in range(lo, hi))
        bucket.blob(f"in/tfrecord/part-{i}.tfrecord").upload_from_string(
            records)
        buf = io.BytesIO()
        pq.write_table(pa.table({"embedding": x[lo:hi].tolist(),
                                 "label": y[lo:hi]}), buf,
                       row_group_size=100)
        bucket.blob(f"in/parquet/part-{i}.parquet").upload_from_string(
            buf.getvalue())


def _input(bucket, fmt: str) -> list[str]:
    return ["--input", bucket.uri("in", fmt, f"part-*.{fmt}")]


def _dask(cluster) -> list[str]:
    return ["--runner", "dask", f"--dask_client_address={cluster.address}"]


def generate(cluster, *flags: str, timeout: float = 600
             ) -> subprocess.CompletedProcess:
    """``dpsynth generate`` on the launcher (this namespace)."""
    return subprocess.run(
        [sys.executable, "-m", "dpsynth.pipelines.cli", "generate", *flags],
        env=cluster.launcher_env(), cwd=REPO, capture_output=True,
        text=True, timeout=timeout)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def same_bytes(bucket, a: str, b: str, tmp_path: Path) -> None:
    """The releases at gs://bucket/a and gs://bucket/b hold the same bytes."""
    assert_same_release(bucket.download(a, tmp_path / "a"),
                        bucket.download(b, tmp_path / "b"))


# ------------------------------------------------------ same as DirectRunner

@pytest.mark.parametrize("fmt,job", [
    ("npz", []), ("tfrecord", []), ("parquet", []),
    ("tfrecord", KMEANS_VOTE)], ids=["npz", "tfrecord", "parquet",
                                     "tfrecord-kmeans-vote"])
def test_seeded_release_on_hosts_equals_direct_runner(cluster, bucket, fmt,
                                                      job, tmp_path):
    tag = f"{fmt}-{len(job)}"
    flags = [*FLAGS, *job, *_input(bucket, fmt), "--noise-seed", "7"]
    _ok(generate(cluster, *flags, "--output", bucket.uri("direct", tag)))
    _ok(generate(cluster, *flags, "--output", bucket.uri("hosts", tag),
                 "--split-bytes", "4000", *_dask(cluster)))
    same_bytes(bucket, f"direct/{tag}", f"hosts/{tag}", tmp_path)
