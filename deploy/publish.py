"""After a scheduled run: verify its release and point LATEST.json at it.

``python -m dpsynth.deploy.publish --output ROOT/2026-01-01 --run-id ID
--output-root ROOT`` checks that the
published release (its ``_manifest.json`` is the commit point, see
``pipelines/release.py``) was produced by run ``ID`` — a different run id
means another configuration wrote there, which must not pass silently — and
that its files are the ones its manifest lists (sizes and sha256), then
writes ``ROOT/LATEST.json`` (one object write: atomic on GCS and, through a
rename, locally) and prints a JSON summary (nothing private: manifest fields
that are already DP outputs or public configuration, and the sha256 of the
verified manifest's bytes, a function of those). ``LATEST.json`` names the
release by path *and* that digest (``manifest_sha256``): the path alone would
follow a later ``--overwrite`` of the folder, which nobody verified;
``load_latest`` refuses a folder whose manifest no longer has the digest.
``LATEST.json`` and the summary (which the nightly DAG also sends to its
webhook) carry nothing from the budget store: the lifetime spend counts the
attempts a run needed, and its timestamps the job's wall time, both of which
may depend on the data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Optional

LATEST = "LATEST.json"  # = release.LATEST, which load_latest reads


def summary(output: str, run_id: str) -> dict:
    from dpsynth.pipelines import release
    if not release.release_exists(output):
        raise release.ReleaseError(f"{output}: no {release.MANIFEST}; not a "
                                   "complete release")
    # The digest LATEST.json pins is of the bytes verified below: the
    # manifest is parsed only from bytes with that digest (rewritten between
    # the two reads: ReleaseChanged).
    digest = release.manifest_digest(output)
    # Refuses incomplete releases, files that differ from the manifest and
    # a manifest without its files' digests (this dpsynth always writes them).
    manifest = release.verify_release(
        output, release.read_manifest(output, digest), require_files=True)
    if manifest.get("run_id") != run_id:
        raise ValueError(f"{output}: the release there was produced by run "
                         f"{manifest.get('run_id')!r}, not {run_id!r}")
    if manifest.get("private") is not True:  # --epsilon inf, --noise-seed
        raise ValueError(f"{output}: the release there is NOT PRIVATE (its "
                         "manifest does not say private: made with --epsilon "
                         "inf or --noise-seed); LATEST.json never points at it")
    privacy = manifest.get("privacy", {})
    return {"release": output, "run_id": run_id,
            "created_utc": manifest.get("created_utc"),
            "samples_total": manifest.get("samples_total"),
            "epsilon_spent": privacy.get("spent", {}).get("epsilon"),
            "delta": privacy.get("spent", {}).get("delta"),
            "manifest_sha256": digest}


def write_latest(output_root: str, doc: dict) -> str:
    path = output_root.rstrip("/") + "/" + LATEST
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems
        with FileSystems.create(path) as f:
            f.write(data)
    else:
        os.makedirs(output_root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=output_root, prefix=".latest-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dpsynth.deploy.publish")
    p.add_argument("--output", required=True, help="the run's release")
    p.add_argument("--run-id", required=True)
    p.add_argument("--output-root", required=True,
                   help="where LATEST.json lives")
    args = p.parse_args(argv)
    try:
        doc = summary(args.output, args.run_id)
    except (ValueError, RuntimeError, OSError) as e:  # OSError: unreadable
        print(f"dpsynth.deploy.publish: {e}", file=sys.stderr)
        return 1
    doc["latest"] = write_latest(args.output_root, doc)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
