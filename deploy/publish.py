"""After a scheduled run: verify its release and point LATEST.json at it.

``python -m dpsynth.deploy.publish --output ROOT/2026-01-01 --run-id ID
--output-root ROOT`` checks that the
published release (its ``_manifest.json`` is the commit point, see
``pipelines/release/release.py``) was produced by run ``ID`` — a different run id
means another configuration wrote there, which must not pass silently — and
that its files are the ones its manifest lists (sizes and sha256), then
writes ``ROOT/LATEST.json`` (one object write: atomic on GCS and, through a
rename, locally) and prints a JSON summary (nothing private: manifest fields
that are already DP outputs or public configuration, and the sha256 of the
verified manifest's bytes, a function of those). ``LATEST.json`` names the
release by path *and* that digest (``manifest_sha256``): the path alone would
follow a later ``--overwrite`` of the folder, which nobody verified;
``load_latest`` refuses a folder whose manifest no longer has the digest.
With ``--budget-store`` and ``--dataset-id`` (the nightly DAG passes the
run's) the manifest must also be the one the store recorded for the run:
someone who can write under --output could rewrite the shards and the
manifest's ``files`` together, which then check out on their own.
A release made with a store names it in its manifest (``lifetime_budget``),
and is refused without ``--budget-store``/``--dataset-id``; with them,
``LATEST.json`` names the store and dataset id (public configuration), and
``load_latest(root, budget_store=..., dataset_id=...)`` checks the pinned
digest against the store's record, so a LATEST.json pointed at a
self-consistent copy (real rows, ``"private": true``) is refused. A reader
without the store is promised only that the release is the one whose
manifest LATEST.json pins, its files unchanged since: whoever can write
LATEST.json (or rewrite a release made without a store together with its
manifest) is not detected (docs/threat-model.md).
``LATEST.json`` and the summary (which the nightly DAG also sends to its
webhook) carry nothing the store recorded about the runs: the lifetime
spend counts the attempts a run needed, and its timestamps the job's wall
time, both of which may depend on the data.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

LATEST = "LATEST.json"  # = release.LATEST, which load_latest reads


def summary(output: str, run_id: str, budget_store: Optional[str] = None,
            dataset_id: Optional[str] = None) -> dict:
    from dpsynth.pipelines.release import reading, release
    if not release.release_exists(output):
        raise release.ReleaseError(f"{output}: no {release.MANIFEST}; not a "
                                   "complete release")
    # The digest LATEST.json pins is of the bytes verified below: the
    # manifest is parsed only from bytes with that digest (rewritten between
    # the two reads: ReleaseChanged).
    digest = release.manifest_digest(output)
    if budget_store is not None:
        _check_recorded(output, run_id, digest, budget_store, dataset_id)
    # Refuses incomplete releases, files that differ from the manifest and
    # a manifest without its files' digests (this dpsynth always writes them).
    manifest = reading.verify_release(
        output, release.read_manifest(output, digest), require_files=True)
    named = _named_store(manifest)
    if named is not None and budget_store is None:
        raise release.ReleaseError(
            f"{output}: the release was made with budget store {named[0]} "
            f"(dataset {named[1]!r}); pass --budget-store and --dataset-id: "
            "without the store's record a release rewritten with its files "
            "checks out on its own, so LATEST.json never points at it")
    if manifest.get("run_id") != run_id:
        raise ValueError(f"{output}: the release there was produced by run "
                         f"{manifest.get('run_id')!r}, not {run_id!r}")
    if manifest.get("private") is not True:  # --epsilon inf, --noise-seed
        raise ValueError(f"{output}: the release there is NOT PRIVATE (its "
                         "manifest does not say private: made with --epsilon "
                         "inf or --noise-seed); LATEST.json never points at it")
    privacy = manifest.get("privacy", {})
    doc = {"release": output, "run_id": run_id,
           "created_utc": manifest.get("created_utc"),
           "samples_total": manifest.get("samples_total"),
           "epsilon_spent": privacy.get("spent", {}).get("epsilon"),
           "delta": privacy.get("spent", {}).get("delta"),
           "manifest_sha256": digest}
    if budget_store is not None:  # public configuration (in the manifest)
        doc.update(budget_store=budget_store, dataset_id=dataset_id)
    return doc


def _named_store(manifest: dict) -> Optional[tuple[str, str]]:
    """(store, dataset id) a release made with a budget store names in its
    manifest (``lifetime_budget``), or None."""
    budget = manifest.get("lifetime_budget")
    if isinstance(budget, dict) and budget.get("store"):
        return str(budget["store"]), str(budget.get("dataset_id"))
    return None


def _check_recorded(output: str, run_id: str, digest: str, store: str,
                    dataset_id: Optional[str]) -> None:
    """The manifest at ``output`` must be the one the budget store recorded
    for the run (its staged manifest's sha256, taken by the launcher from
    the bytes it wrote): a release rewritten at --output together with its
    manifest's ``files`` checks out on its own, but not against the record."""
    from dpsynth.pipelines.budget import store as budget_store
    from dpsynth.pipelines.release import reading, release
    recorded = budget_store.recorded_manifest(store, dataset_id, run_id)
    if recorded is None:
        raise release.ReleaseError(
            f"budget store {store} (dataset {dataset_id!r}) recorded no staged "
            f"or published release of run {run_id!r}; not pointing "
            "LATEST.json at it")
    if recorded != digest:
        raise release.ReleaseChanged(
            f"{output}: its manifest (sha256 {digest[:12]}...) is not the one "
            f"budget store {store} recorded for run {run_id!r} "
            f"({recorded[:12]}...): the release there was rewritten after it "
            "was made; not pointing LATEST.json at it")


def write_latest(output_root: str, doc: dict) -> str:
    path = output_root.rstrip("/") + "/" + LATEST
    data = json.dumps(doc, indent=1, sort_keys=True).encode()
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems
        with FileSystems.create(path) as f:
            f.write(data)
    else:
        os.makedirs(output_root, exist_ok=True)
        # The shards' mode, not mkstemp's 0600: others read the pointer too
        from dpsynth.pipelines.release.publisher import open_temp
        fd, tmp = open_temp(output_root, ".latest-")
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
    p.add_argument("--budget-store", default=None,
                   help="the run's budget store: the manifest must be the "
                        "one it recorded for --run-id (with --dataset-id)")
    p.add_argument("--dataset-id", default=None)
    args = p.parse_args(argv)
    if (args.budget_store is None) != (args.dataset_id is None):
        p.error("--budget-store and --dataset-id go together")
    try:
        doc = summary(args.output, args.run_id, args.budget_store,
                      args.dataset_id)
    except (ValueError, RuntimeError, OSError) as e:  # OSError: unreadable
        print(f"dpsynth.deploy.publish: {e}", file=sys.stderr)
        return 1
    doc["latest"] = write_latest(args.output_root, doc)
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
