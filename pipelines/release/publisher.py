"""Publishing a staged release: the staged files checked against the
manifest their writers recorded, placed into a fresh version folder, then
the switch (``--output/_manifest.json`` written as one atomic, conditional
step: the commit point for readers); the manifest write itself
(``write_manifest``), the output check before a run (``check_output``)
and the clean-up of staging (``discard``, ``discard_staged``). See
``release`` for the layout and the integrity rules both sides share.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
from typing import Callable, Iterator, Optional

from dpsynth.pipelines.release.release import (
    _CAS_ATTEMPTS, _TEMP_PREFIX, LEGACY_MANIFEST, VERSION_PREFIX,
    FileSystems, ManifestMoved, ReleaseChanged, ReleaseError, _gcs_bucket,
    _gcs_read, _list, _manifest_doc, _manifest_file, is_local, manifest_path,
    read_manifest, release_exists, staged_manifest, verify_files)
from dpsynth.transforms import io


def open_temp(folder: str, prefix: str) -> tuple[int, str]:
    """A new file with a unique name in ``folder``, opened for writing:
    (fd, path). Unlike mkstemp's 0600 it gets the mode a plain open gives
    (0666 less the umask), the shards' mode: a release is written for
    others to read, and a private manifest beside readable shards locks
    every other account out of it."""
    for _ in range(100):
        path = os.path.join(folder, prefix + secrets.token_hex(8))
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                           0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"{folder}: no free temporary name ({prefix}...)")


def write_manifest(folder: str, manifest: dict,
                   generation: Optional[int] = None) -> str:
    """Writes ``folder/_manifest.json`` in one atomic step; returns the
    sha256 of the bytes written (a digest to record: never re-read it from
    the folder, which someone may have rewritten meanwhile).

    ``generation`` (gs:// only): write only if the object's generation is
    still this one (0: it must not exist yet); ``ManifestMoved`` if not.
    """
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    digest = hashlib.sha256(data).hexdigest()
    path = manifest_path(folder)
    if generation is not None and path.startswith("gs://"):
        _gcs_write_if(path, data, generation)
        return digest
    if not is_local(path):  # one object write: atomic on GCS
        with FileSystems.create(path) as f:
            f.write(data)
        return digest
    os.makedirs(folder, exist_ok=True)
    fd, tmp = open_temp(folder, _TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


def _gcs_write_if(uri: str, data: bytes, generation: int) -> None:
    from google.api_core import exceptions
    bucket, name = _gcs_bucket(uri)
    try:
        bucket.blob(name).upload_from_string(
            data, content_type="application/json",
            if_generation_match=generation)
    except exceptions.PreconditionFailed:
        raise ManifestMoved(f"{uri} changed meanwhile") from None


def check_output(output: str, overwrite: bool) -> None:
    """Refuse (before any data is read) to clobber an existing release."""
    if release_exists(output) and not overwrite:
        raise ReleaseError(f"--output {output} already holds a release; pass "
                           f"--overwrite to replace it")
    if is_local(output) and os.path.exists(output) and not release_exists(output):
        # Version folders without a manifest: a crashed publish (no release).
        leftovers = os.path.isdir(output) and all(
            (e.startswith(VERSION_PREFIX) and os.path.isdir(
                os.path.join(output, e))) or e.startswith(_TEMP_PREFIX)
            for e in os.listdir(output))
        if not leftovers:
            raise ReleaseError(f"--output {output} exists and is not a release; "
                               f"choose an empty or new path")


def publish(staging: str, output: str, overwrite: bool = False,
            check: Optional[Callable[[str, dict], None]] = None,
            manifest_sha256: Optional[str] = None) -> dict:
    """Publishes a complete staged release at ``output``; returns its
    manifest. Safe to repeat after a crash (same bytes, same folder).

    Places the files in the version folder (no manifest names it yet),
    checks them against the manifest and then switches the manifest
    conditionally (see the module docstring); afterwards removes
    the files of the release it replaced. ``ReleaseChanged``: the files
    differ from the manifest; ``ReleaseError``: another release is there
    (of this run id: another launch published it; of another run: without
    ``overwrite``). ``check(folder, manifest)``: run on the checked
    placed files before the manifest is written (the job's consistency
    check).
    ``manifest_sha256``: the staged manifest's digest as recorded (the
    budget store's); the manifest is read once and published only if its
    bytes still have it, so a manifest rewritten after it was recorded is
    never the one published (``ReleaseChanged``)."""
    if _scheme(staging) != _scheme(output):  # links/copies need one store
        raise ReleaseError(f"{staging} and --output {output} are on different "
                           "file systems; a release is staged beside it")
    manifest = _pinned_manifest(staging, manifest_sha256)
    with _publish_lock(output):
        return _switch(staging, output, manifest, overwrite, check)


def _scheme(path: str) -> str:
    return "" if is_local(path) else path.partition("://")[0].lower()


def _pinned_manifest(staging: str, sha256: Optional[str]) -> dict:
    """The staged manifest, from one read of its bytes, checked against
    ``sha256`` (None: unchecked)."""
    path = _manifest_file(staging)
    if path is None:
        raise ReleaseError(f"{staging}: staging has no manifest; not publishing")
    with FileSystems.open(path) as f:
        data = f.read()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise ReleaseChanged(f"{path} is not the manifest recorded for this "
                             "attempt (changed after it was recorded)")
    return _manifest_doc(data, path)


@contextlib.contextmanager
def _publish_lock(output: str) -> Iterator[None]:
    """Locally: an exclusive ``fcntl`` lock on the output folder itself
    from the decision to the manifest's write (no lock file: the release
    folder holds only the release). Object stores: nothing (the manifest's
    write is conditional instead)."""
    if not is_local(output):
        yield
        return
    os.makedirs(output, exist_ok=True)
    fd = os.open(output, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _switch(staging: str, output: str, manifest: dict, overwrite: bool,
            check: Optional[Callable[[str, dict], None]]) -> dict:
    """Decide -> place -> check the placed files -> conditional manifest
    write, again from the decision when another writer changed the
    manifest meanwhile. Placing moves no byte through this process (a
    rename; on GCS a copy made by the store), and the check reads each
    file once locally and none on GCS (the store's md5s). Locally all of
    it runs under the output's lock: placing moves the staged files, so a
    second publisher of the same staged folder must not check it
    meanwhile."""
    root = io.join(output, _root_name(manifest))
    placed = False
    try:
        for _ in range(_CAS_ATTEMPTS):
            current, generation, where = _current(output)
            if (_is_published(current, manifest, output, overwrite)
                    and _in_place(root, manifest)):
                return manifest
            if not placed:
                _take_back(staging, root, manifest)  # a killed publish's
                # Every listed file there, of its size (a listing, no
                # read): a missing one is refused, not a failed move.
                verify_files(staging, manifest, contents=False)
                placed = True
                _place_all(staging, root, manifest)
                # One check of every file, where it will be read: the
                # placed copy (no manifest names its folder yet; it goes
                # back to staging, or is deleted, if the check fails).
                verify_files(root, manifest)
                if check is not None:
                    check(root, manifest)
            try:
                write_manifest(output, manifest, generation)  # the commit point
            except ManifestMoved:
                continue
            _remove_replaced(output, current, where, manifest["root"])
            return manifest
        raise ReleaseError(f"--output {output}: its manifest kept changing "
                           "while this launch published; nothing published")
    except BaseException:
        if placed:
            _remove_unpublished(output, manifest, root, staging)
        raise


def _current(output: str) -> tuple[Optional[dict], Optional[int], str]:
    """The output's manifest (None: no release), the generation a
    conditional write must match (gs://; None elsewhere: unconditional,
    under the local lock) and the path it was read from."""
    path = manifest_path(output)
    generation = None
    if path.startswith("gs://"):
        doc, generation = _gcs_read(path)
        if doc is not None:
            return doc, generation, path
    found = _manifest_file(output)  # an older release's manifest.json
    if found is None:
        return None, generation, path
    return read_manifest(output), generation, found


def _is_published(current: Optional[dict], manifest: dict, output: str,
                  overwrite: bool) -> bool:
    """True when ``manifest`` is already the published one; raises when
    ``current`` must not be replaced; False: switch to ``manifest``."""
    if current is None:
        return False
    if current == manifest:
        return True  # this staged release is already the published one
    run_id = manifest.get("run_id")
    if current.get("run_id") == run_id:
        raise ReleaseError(
            f"--output {output} already holds a release of run {run_id!r} "
            "(another launch published it); one run id has one release: "
            "not replacing it with a second draw, even with --overwrite")
    if not overwrite:
        raise ReleaseError(f"--output {output} already holds a release (of "
                           f"run {current.get('run_id')!r}, published "
                           "meanwhile); pass --overwrite to replace it")
    if current.get("root") == manifest.get("root"):  # placing would break it
        raise ReleaseError(
            f"--output {output}: the published release (run "
            f"{current.get('run_id')!r}) lives in {manifest.get('root')}, the "
            "version folder this staged release names (a copied staging "
            "folder?); not placing other files into it")
    return False


def _in_place(root: str, manifest: dict) -> bool:
    """Whether the version folder holds every file the manifest lists,
    with its bytes (files beside them, such as an operator's notes, are
    not the release's). A copy of the staged manifest written at --output
    before the switch names a folder nobody filled: that is no
    publication, and this launch publishes for real (the same manifest,
    the files placed)."""
    try:
        verify_files(root, manifest, names=list(manifest["files"]))
    except ReleaseChanged:
        return False
    return True


def _root_name(manifest: dict) -> str:
    root = manifest.get("root")
    if not _own_name(root) or "/" in root or not root.startswith(
            VERSION_PREFIX):
        raise ReleaseError(f"manifest root {root!r} is not a version folder "
                           f"name ({VERSION_PREFIX}...); not publishing")
    return root


def _own_name(name) -> bool:
    """A relative path that stays inside its folder."""
    return (isinstance(name, str) and bool(name) and not name.startswith("/")
            and "://" not in name
            and all(p not in ("", ".", "..") for p in name.split("/")))


def _place_all(staging: str, root: str, manifest: dict) -> None:
    names = sorted(manifest["files"])
    _place([io.join(staging, n) for n in names],
           [io.join(root, n) for n in names])


def _place(sources: list[str], targets: list[str]) -> None:
    """Moves the files: locally a rename (no byte moves, and the placed
    file shares no storage with staging: a hard link did, so a write into
    a staged file rewrote the live release); on object stores a copy done
    by the store itself (GCS: a rewrite, no byte through this process)."""
    if not sources:
        return
    if not is_local(sources[0]):
        FileSystems.copy(sources, targets)
        return
    for src, dst in zip(sources, targets):
        _move(src, dst)


def _move(src: str, dst: str) -> None:
    """A local rename; a copy and delete when --output is a mount point
    and its staging folder (beside it) on another filesystem."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    try:
        os.replace(src, dst)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, dst)
        os.unlink(src)


def _take_back(staging: str, root: str, manifest: dict) -> None:
    """Locally: the files a killed publish already moved into the version
    folder go back to staging (the folder is no release: ``_switch``
    decided so), which is then whole again and checked as a whole."""
    if not is_local(root):
        return  # copies: the staged objects never left
    for name in sorted(manifest["files"]):
        src, dst = io.join(root, name), io.join(staging, name)
        if _own_name(name) and os.path.lexists(src) \
                and not os.path.lexists(dst):
            _move(src, dst)
    _prune(root, [io.join(root, n) for n in manifest["files"]])


def _remove_unpublished(output: str, manifest: dict, root: str,
                        staging: str) -> None:
    """A launch that placed files and did not publish them takes them back
    (locally: into staging, whole again for a retry; object stores: the
    copies are deleted), unless the published manifest names that same
    folder (another launch of the same staged release won). Best effort:
    never hides the error."""
    try:
        current = _current(output)[0]
        if current is None or current.get("root") != manifest.get("root"):
            if is_local(root):
                _take_back(staging, root, manifest)
            _delete_own(root, list(manifest["files"]))
    except Exception:
        pass


def _remove_replaced(output: str, old: Optional[dict], where: str,
                     new_root: str) -> None:
    """Removes the files the replaced manifest lists (and an older
    release's legacy manifest): only what dpsynth wrote and recorded."""
    if old is None or old.get("root") == new_root:
        return  # nothing replaced, or the same folder (now the new files)
    root = old.get("root")
    if root is None:  # releases before version folders: files at --output
        folder = output
    elif _own_name(root) and "/" not in root:
        folder = io.join(output, root)
    else:
        return  # not a name dpsynth writes: touch nothing
    _delete_own(folder, _recorded_names(old))
    if where.endswith("/" + LEGACY_MANIFEST):
        _delete_own(output, [LEGACY_MANIFEST])


def _recorded_names(manifest: dict) -> list[str]:
    """The files a manifest names, relative to its folder (older manifests
    without ``files``: the data shards, the mixture, summary and schema)."""
    if isinstance(manifest.get("files"), dict):
        return list(manifest["files"])
    outputs = manifest.get("outputs") or {}
    data = str(outputs.get("data", "data/")).strip("/") or "data"
    names = [f"{data}/{n}" for c in manifest.get("classes", [])
             for n in c.get("shards", [])]
    return names + [outputs.get("gmm", "gmm.npz"),
                    outputs.get("summary", "summary.json"),
                    outputs.get("schema", "schema.json")]


def _delete_own(folder: str, names: list[str]) -> None:
    """Deletes ``folder/name`` for the names that exist and stay inside
    ``folder``; locally also the folders this leaves empty."""
    paths = [io.join(folder, n) for n in names if _own_name(n)]
    present = set(_list(folder))
    doomed = [p for p in paths if p in present]
    if not is_local(folder):
        if doomed:
            FileSystems.delete(doomed)
        return
    for path in doomed:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    _prune(folder, doomed)


def _prune(folder: str, paths: list[str]) -> None:
    """Locally: removes the folders of ``paths`` under ``folder``, and
    ``folder``, where they are empty."""
    for name in sorted({os.path.dirname(p) for p in paths}, reverse=True):
        while name != folder.rstrip("/") and name.startswith(folder):
            with contextlib.suppress(OSError):  # not empty: keep it
                os.rmdir(name)
            name = os.path.dirname(name)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def discard(staging: str) -> None:
    """Best-effort removal of a staging directory."""
    try:
        if is_local(staging):
            shutil.rmtree(staging, ignore_errors=True)
        else:
            stale = _list(staging)
            if stale:
                FileSystems.delete(stale)
    except Exception:  # cleanup must not hide the original error
        pass


def discard_staged(staging: str, output: str) -> None:
    """Best-effort removal of a staged release that will never be
    published: its staging folder and the files a killed publish of it
    had already placed in its version folder (placing moves them), unless
    the manifest at ``output`` names that folder."""
    try:
        manifest = staged_manifest(staging)
        if manifest is not None and isinstance(manifest.get("files"), dict):
            root = io.join(output, _root_name(manifest))
            current = _current(output)[0]
            if current is None or current.get("root") != manifest["root"]:
                _delete_own(root, list(manifest["files"]))
    except Exception:  # cleanup must not hide the original error
        pass
    discard(staging)
