"""The attempt protocol of a `dpsynth generate` run (``job.run``'s last
part): staged -> committed -> published.

Reserve the spend (``job_plan.reserve``) -> run into this launch's own
staging folder (``graph.stage``) -> staged manifest (with every file's
size and sha256) -> record the staged folder and its manifest's digest in
the budget store (committed) -> check the staged files and their
consistency -> place the files under --output/<version> -> write
--output/_manifest.json if it is still the one the decision read (the
commit point for readers, ``publish``) -> record the release as
published. A retry of a run id whose staged release is recorded
re-publishes exactly that folder (same noise, no new spend); one run id
never publishes a second draw. ``checkpoint`` names the protocol's steps
(tests inject crashes there).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from dpsynth.pipelines import console
from dpsynth.pipelines.budget import store as budget_store
from dpsynth.pipelines.budget.lease import Lease
from dpsynth.pipelines.release import consistency, publisher, release
from dpsynth.pipelines.spec import GenerateSpec

log = logging.getLogger("dpsynth")


def remove_abandoned_keys(job, spec: GenerateSpec, owners) -> None:
    """Deletes the noise keys that earlier attempts of this run id left in
    --noise-key-location (a SIGKILLed launch cannot delete its own): their
    attempts are over, and a key left there lets its readers remove that
    attempt's noise. A failed delete is reported by ``delete_key``."""
    location = spec.run.noise_key_location
    if location is None:
        return
    from dpsynth.transforms.keyed_noise import delete_key, key_uri
    for owner in sorted(set(owners) - {job.owner}):
        delete_key(key_uri(location, job.run_id, owner))


def checkpoint(step: str) -> None:
    """A named point of the stage -> commit -> publish protocol (tests
    inject crashes here)."""


def _publish(job, spec: GenerateSpec, digest: str) -> None:
    """Publishes the staged release after checking every file against its
    manifest and the parts against each other (``consistency``), on every
    publication: also when a retry re-publishes an earlier launch's staged
    files, which may have changed since."""
    try:
        publisher.publish(job.staging, job.output, spec.output.overwrite,
                          check=consistency.check_manifest,
                          manifest_sha256=digest)
    except consistency.InconsistentRelease as err:
        raise release.ReleaseChanged(str(err)) from None


def _stop_attempt(job, spec: GenerateSpec, reservation,
                  recorded: bool, rejected: Optional[str] = None) -> None:
    """After a failure: give the attempt back and keep the staged release
    only where a retry may publish it (recorded in the store). A staged
    release that failed its checks (``rejected``: why) is removed and its
    attempt marked failed: a retry draws again and is charged again."""
    if reservation is not None:
        from dpsynth.pipelines.budget import store as budget_store
        try:
            if rejected:
                budget_store.reject_staged(reservation, rejected)
            budget_store.release_failed(reservation)
        except Exception as err:  # must not hide the original error
            log.warning("could not record the failed attempt of run %s in "
                        "the budget store (%s); its lease expires by itself",
                        job.run_id, err)
    # Without a store nothing trusted recorded the staged manifest, so a
    # retry never re-publishes it (``check_staged_leftovers``): not kept.
    keep = (not rejected and recorded
            and release.staged_manifest(job.staging) is not None)
    if not keep:
        publisher.discard_staged(job.staging, job.output)
        return
    log.warning("the staged release of run %s is kept at %s: re-run with "
                "--run-id %s to publish it (no new spend)", job.run_id,
                job.staging, job.run_id)


def check_staged_leftovers(job, spec: GenerateSpec) -> None:
    """Complete staged releases of this run id left by earlier launches.

    With a budget store, only the folder of an attempt the store charged
    (named by the attempt's owner token) may be re-published, and only the
    one the store recorded, against the manifest digest it recorded; any
    other (planted under the predictable run id, or staged without this
    store) is set aside: logged, never obeyed, removed with this run's
    leftovers. Without a store nothing recorded what was staged: a staged
    folder (files and manifest alike) may have been rewritten since, so it
    is never re-published; it is removed and the retry draws again.
    """
    complete = {token: folder for token, folder
                in release.staging_folders(job.output, job.run_id).items()
                if release.staged_manifest(folder) is not None}
    if spec.budget.store is None:
        for folder in sorted(complete.values()):
            log.warning("run %s: removing the staged release at %s: without "
                        "--budget-store nothing trusted recorded it, so it is "
                        "not re-published; this launch draws again",
                        job.run_id, folder)
            publisher.discard_staged(folder, job.output)
        return
    from dpsynth.pipelines.budget import store as budget_store
    charged = budget_store.run_owners(spec.budget.store, spec.budget.dataset_id,
                                      job.run_id)
    for folder in sorted(f for t, f in complete.items() if t not in charged):
        # Planted (its name is predictable from the run id) or staged
        # without this store: set aside, never obeyed. Only the folder the
        # store recorded is ever re-published; this run's cleanup removes
        # the others.
        log.warning("run %s: ignoring the staged release at %s: budget store "
                    "%s (dataset %r) never charged it, so it is never "
                    "published", job.run_id, folder, spec.budget.store,
                    spec.budget.dataset_id)


def _recorded_staged(job, reservation) -> dict:
    """The staged release the budget store recorded for this run id, after
    checking that its manifest is the one recorded."""
    folder = reservation.staged["folder"]
    staged = release.staged_manifest(folder)
    if staged is None or release.manifest_digest(folder) != \
            reservation.staged["manifest_sha256"]:
        job.staging = folder  # removed with the attempt's rejection
        raise release.ReleaseChanged(
            f"run {job.run_id!r}: the staged release the budget store "
            f"recorded at {folder} is missing or changed (its manifest is not "
            "the one recorded)")
    job.staging = folder
    return staged


def finish_published(job, spec: GenerateSpec) -> None:
    """A retry after the manifest was written: record the publication (if
    the crash came before that) and clean up; nothing is recomputed."""
    if spec.budget.store is not None:
        from dpsynth.pipelines.budget import store as budget_store
        budget_store.mark_published(spec.budget.store, spec.budget.dataset_id,
                                    job.run_id, job.output,
                                    release.manifest_digest(job.output))
    for folder in release.staging_folders(job.output, job.run_id).values():
        publisher.discard(folder)


def publish_attempt(job, spec: GenerateSpec, reservation,
                    stage: Callable, timings: dict) -> None:
    """Staged -> committed -> published, for the attempt ``reservation``
    holds (None: no budget store). ``stage(lease)`` runs the graph into
    ``job.staging`` and returns the sha256 of the staged manifest it wrote
    (``graph.stage``); a retry of a recorded staged release re-publishes
    that one instead. Then this run id's staging folders are removed."""
    staged = None  # the recorded staged release a retry re-publishes
    recorded = False  # this launch's staged folder is recorded in the store
    published = False
    with Lease(reservation) as lease:
        try:
            if reservation is not None and reservation.staged is not None:
                staged = _recorded_staged(job, reservation)
            checkpoint("reserved")
            if staged is None:
                digest = stage(lease)
            else:
                digest = reservation.staged["manifest_sha256"]
                log.info("run %s: re-publishing its staged release (no new "
                         "noise, no new spend)", job.run_id)
            checkpoint("staged")
            # One digest from here on: the one written (or recorded) is the
            # one published.
            if reservation is not None:
                lease.check()
                budget_store.commit_staged(reservation, job.staging, digest)
                recorded = True
            checkpoint("committed")
            console.stop_if_ctrl_c()  # one a library swallowed: no release
            t_publish = time.time()
            _publish(job, spec, digest)
            timings["publish"] = round(time.time() - t_publish, 3)
            published = True
            checkpoint("published")
            if reservation is not None:
                budget_store.commit(reservation, job.output)
            checkpoint("recorded")
        except BaseException as err:
            rejected = isinstance(err, release.ReleaseChanged)
            _stop_attempt(job, spec, reservation, recorded,
                          str(err) if rejected else None)
            if published and isinstance(err, KeyboardInterrupt):
                raise console.InterruptedAfterPublishing(job.output) from err
            if lease.lost is not None and not published:
                # A pass boundary found the attempt taken over (and may
                # have interrupted the pipeline to stop it): one line.
                raise lease.lost from None
            if rejected:
                retry = ("the attempt stays charged: a retry of run "
                         f"{job.run_id!r} is a new, charged attempt"
                         if reservation is not None else
                         f"a retry of run {job.run_id!r} draws again")
                raise release.ReleaseChanged(
                    f"{err}; not published, the staged files are removed; "
                    f"{retry}") from None
            raise
    leftovers = release.staging_folders(job.output, job.run_id)
    remove_abandoned_keys(job, spec, leftovers)  # named by their tokens
    for folder in leftovers.values():
        publisher.discard(folder)  # this one and crashed attempts' leftovers
