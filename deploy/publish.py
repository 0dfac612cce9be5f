"""After a scheduled run: verify its release and point LATEST.json at it.

``python -m deploy.publish --output ROOT/2026-01-01 --run-id ID
--output-root ROOT [--budget-store S --dataset-id D]`` checks that the
published release (its ``manifest.json`` is the commit point, see
``pipelines/release.py``) was produced by run ``ID`` — a different run id
means another configuration wrote there, which must not pass silently —
writes ``ROOT/LATEST.json`` (one object write: atomic on GCS and, through a
rename, locally) and prints a JSON summary (nothing private: manifest fields
that are already DP outputs or public configuration).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Optional

LATEST = "LATEST.json"


def summary(output: str, run_id: str) -> dict:
    from pipelines import release
    manifest = release.read_manifest(output)  # refuses incomplete releases
    if manifest.get("run_id") != run_id:
        raise ValueError(f"{output}: the release there was produced by run "
                         f"{manifest.get('run_id')!r}, not {run_id!r}")
    privacy = manifest.get("privacy", {})
    return {"release": output, "run_id": run_id,
            "created_utc": manifest.get("created_utc"),
            "samples_total": manifest.get("samples_total"),
            "epsilon_spent": privacy.get("spent", {}).get("epsilon"),
            "delta": privacy.get("spent", {}).get("delta")}


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
    p = argparse.ArgumentParser(prog="python -m deploy.publish")
    p.add_argument("--output", required=True, help="the run's release")
    p.add_argument("--run-id", required=True)
    p.add_argument("--output-root", required=True,
                   help="where LATEST.json lives")
    p.add_argument("--budget-store")
    p.add_argument("--dataset-id")
    p.add_argument("--lifetime-delta", type=float, default=1e-5)
    args = p.parse_args(argv)
    try:
        doc = summary(args.output, args.run_id)
    except (ValueError, RuntimeError) as e:
        print(f"deploy.publish: {e}", file=sys.stderr)
        return 1
    if args.budget_store and args.dataset_id:
        from pipelines import budget_store
        doc["lifetime_epsilon_spent"] = budget_store.lifetime_spent(
            args.budget_store, args.dataset_id, args.lifetime_delta)
        doc["lifetime_delta"] = args.lifetime_delta
    else:
        doc["lifetime_epsilon_spent"] = None
    doc["latest"] = write_latest(args.output_root, doc)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
