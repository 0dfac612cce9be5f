"""Staging, atomic publication and reading of a release.

Layout of a published release at ``--output``::

    <output>/_manifest.json         the commit point: written last
    <output>/<version>/_gmm.npz     the files the manifest's "root" names
    <output>/<version>/_summary.json
    <output>/<version>/_schema.json
    <output>/<version>/data/...

Everything but the data shards starts with "_", which Parquet readers
(pyarrow, pandas, Spark) skip: ``pd.read_parquet(<output>/<version>/data)``
opens a Parquet release's rows in one call. Not ``<output>`` itself: a
launch killed while placing its files (another run's, maybe an
``--epsilon inf`` test's) leaves its version folder beside the published
one, and a folder-wide read would mix its rows in. (Releases before format
3 named the side files without "_"; readers here accept both.)

A run writes everything under a staging directory beside the output
(``<output>.staging-<run_id>``), then writes the staged manifest there: a
complete staged release. Publishing moves (local: a rename) or copies
(object stores: the store's own copy) the staged files into a fresh version
folder ``<output>/<version>`` (``version`` is random, fixed when the run is
planned; a placed file never shares storage with staging, so nothing
written into staging later reaches the release) and then writes
``<output>/_manifest.json``, which names that folder, as one atomic write
(local: temp file + rename; GCS: one object). Before that write nothing
under ``--output`` is a release: ``read_manifest`` / ``load_release`` read
only what the manifest names, and a version folder without a manifest
naming it belongs to no release. Publishing the same staged release again
(a retry after a crash) writes identical bytes into the same version folder
(locally the files a killed publish had moved go back to staging first).

Integrity. The staged manifest lists every file of the release with its
size and sha256 (``files``), as the process that wrote each file hashed
the bytes it wrote (``dpsynth.transforms.digests``): never by reading the
staged files back, which someone writing beside --output may have
rewritten by then. Publishing checks the staged files against it
before placing anything and the placed copies before the switch, so a
swapped, truncated, added or deleted file is never published
(``ReleaseChanged``); ``load_release`` checks the files it reads too (each
shard read once: the bytes it hashes are the bytes it parses), and
with ``manifest_sha256`` the manifest itself (``LATEST.json`` records the
verified one's digest: ``load_latest``).

The switch. Deciding (is a release of this run, or of another run, there?),
placing and writing the manifest happen as one conditional step: locally
under an exclusive ``fcntl`` lock on the output folder; on gs://
by writing the manifest with a generation precondition (the generation
read when deciding; 0: none yet), deciding again when another writer won.
So the manifest always names one complete version folder, and two
launches of one run id never both publish.

What publishing removes. Only what dpsynth wrote and recorded: after the
switch, the files the replaced manifest lists (its version folder), and a
launch's own placed files when it did not publish them. Nothing else under
``--output`` is touched (an operator's notes, another tool's objects); a
version folder left by a killed launch stays until removed by hand.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import posixpath
import secrets
import shutil
import tempfile
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterator, Mapping, Optional

import numpy as np


def _import_filesystems():
    """Beam's FileSystems, without the root-logger warning Beam prints while
    its GCP modules load ("apitools not found"): a reader of a release (a
    notebook, a training script) should see nothing but its data."""
    import logging
    root = logging.getLogger()
    quiet = not root.handlers  # nobody configured logging: Python would
    level = root.level         # print WARNINGs through its last resort
    if quiet:
        root.setLevel(logging.ERROR)
    try:
        from apache_beam.io.filesystems import FileSystems
        return FileSystems
    finally:
        if quiet:
            root.setLevel(level)


FileSystems = _import_filesystems()

from dpsynth.pipelines.runners.machine import usable_cores  # noqa: E402
from dpsynth.transforms import io  # noqa: E402  (after the quiet Beam import)

MANIFEST = "_manifest.json"
LEGACY_MANIFEST = "manifest.json"  # format 2 and older
VERSION_PREFIX = "v-"  # version folders: v-<random hex>
LATEST = "LATEST.json"  # deploy/publish.py's pointer under an output root
_TEMP_PREFIX = ".manifest-"  # write_manifest's temporary file
_CAS_ATTEMPTS = 20  # gs:// manifest switches lost to other writers
_HASH_CHUNK = 1 << 22


class ReleaseError(RuntimeError):
    pass


class ReleaseChanged(ReleaseError):
    """A release's files differ from what its manifest lists (swapped,
    truncated, missing or added), its staged manifest is not the one
    recorded, or its manifest is not the one a reader pinned
    (``manifest_sha256``): it is not published (or read)."""


class PathOverlap(ReleaseError):
    """A location dpsynth must keep (the budget store, the noise key) lies
    under --output, which publishing owns."""


class ManifestMoved(ReleaseError):
    """The output's manifest changed since it was read (gs:// switch)."""


def is_local(path: str) -> bool:
    return "://" not in path


def staging_dir(output: str, run_id: str, owner: str) -> str:
    """One launch's own staging folder (``owner``: its random token), so
    two launches of one run id never write into the same files."""
    return f"{staging_prefix(output, run_id)}{owner}"


def staging_prefix(output: str, run_id: str) -> str:
    # '@' is not allowed in run ids: run "a" never matches run "a-b".
    return f"{output.rstrip('/')}.staging-{run_id}@"


def staging_folders(output: str, run_id: str) -> dict[str, str]:
    """owner token -> staging folder, for every staging folder of the run
    id beside ``output`` (complete or not)."""
    prefix = staging_prefix(output, run_id)
    if is_local(prefix):
        folder = os.path.dirname(prefix) or "."
        base = os.path.basename(prefix)
        names = os.listdir(folder) if os.path.isdir(folder) else []
        return {n[len(base):]: os.path.join(os.path.dirname(prefix), n)
                for n in names if n.startswith(base)
                and os.path.isdir(os.path.join(folder, n))}
    found = FileSystems.match([prefix + "**"])[0].metadata_list
    out = {}
    for m in found:
        token = m.path[len(prefix):].split("/", 1)[0]
        out[token] = prefix + token
    return out


def _path_forms(path: str) -> set[str]:
    """The spellings of ``path`` to compare: locally its absolute path and
    its path with links resolved; on object stores the name as written
    (objects may literally hold "..") and with "." / ".." / "//" resolved;
    never with a trailing "/"."""
    if is_local(path) or path.startswith("file://"):
        path = path.removeprefix("file://")
        return {os.path.abspath(path), os.path.realpath(path)}
    scheme, _, rest = path.partition("://")
    bucket, _, name = rest.partition("/")
    forms = set()
    for form in (name.rstrip("/"), posixpath.normpath("/" + name).strip("/")):
        forms.add(f"{scheme}://{bucket}" + (f"/{form}" if form else ""))
    return forms


def lies_under(path: str, output: str) -> bool:
    """True when ``path`` is ``output``, lies under it or under one of its
    staging folders (``<output>.staging-...``), in any spelling."""
    for inner in _path_forms(path):
        for outer in _path_forms(output):
            if (inner == outer or inner.startswith(outer.rstrip("/") + "/")
                    or inner.startswith(outer + ".staging-")):
                return True
    return False


def check_apart(output: str, locations: Mapping[str, Optional[str]]) -> None:
    """Refuses (before any data is read) a location that lies under
    --output: publishing owns --output and its staging folders, so a
    ledger or key kept there could be replaced, published or removed with
    a release. ``locations``: flag -> path (None: not given)."""
    for flag, path in locations.items():
        if path and lies_under(path, output):
            raise PathOverlap(
                f"{flag} {path} lies under --output {output} (with '..', "
                "'/' and links resolved); --output and its staging folders "
                f"belong to the release: keep {flag} outside them")


def manifest_digest(folder: str) -> str:
    """sha256 of the bytes of ``folder``'s manifest."""
    with FileSystems.open(_manifest_file(folder) or manifest_path(folder)) as f:
        return hashlib.sha256(f.read()).hexdigest()


def manifest_path(release: str) -> str:
    return io.join(release, MANIFEST)


def _manifest_file(release: str) -> Optional[str]:
    """The release's manifest: this format's, or an older release's."""
    for name in (MANIFEST, LEGACY_MANIFEST):
        path = io.join(release, name)
        if FileSystems.exists(path):
            return path
    return None


def release_exists(output: str) -> bool:
    return _manifest_file(output) is not None


def read_manifest(release: str, manifest_sha256: Optional[str] = None
                  ) -> dict:
    """The release's manifest. ``manifest_sha256`` pins it: the bytes read
    must have that digest (else ``ReleaseChanged``), checked on the very
    bytes then parsed, since the folder can be re-published at any time
    (``--overwrite``) and a pin checked on an earlier read proves nothing."""
    path = _manifest_file(release)
    if path is None:
        raise ReleaseError(f"{release}: no {MANIFEST}; not a complete release")
    with FileSystems.open(path) as f:
        data = f.read()
    if (manifest_sha256 is not None
            and hashlib.sha256(data).hexdigest() != manifest_sha256):
        raise ReleaseChanged(
            f"{release}: its manifest is not the one pinned (sha256 "
            f"{manifest_sha256[:12]}...): the release there was replaced or "
            "rewritten since that digest was taken; not reading it")
    return _manifest_doc(data, path)


def _manifest_doc(data: bytes, where: str) -> dict:
    """A manifest's JSON object, or one line naming the file (a truncated
    write, a hand edit)."""
    try:
        doc = json.loads(data.decode())
    except ValueError:  # also UnicodeDecodeError
        doc = None
    if not isinstance(doc, dict):
        raise ReleaseError(f"{where}: not a dpsynth manifest (not a JSON "
                           "object); not a complete release")
    return doc


def release_root(release: str, manifest: Optional[dict] = None) -> str:
    """The folder holding a release's files (its version folder)."""
    manifest = read_manifest(release) if manifest is None else manifest
    root = manifest.get("root")
    return io.join(release, root) if root else release


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


def _gcs_bucket(uri: str):
    """(bucket handle, object name) of a gs:// URI."""
    from google.cloud import storage  # only gs:// outputs need it
    bucket, _, name = uri[len("gs://"):].partition("/")
    # No project is needed for object calls; None where credentials lack it.
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
    return storage.Client(project=project).bucket(bucket), name


def _gcs_write_if(uri: str, data: bytes, generation: int) -> None:
    from google.api_core import exceptions
    bucket, name = _gcs_bucket(uri)
    try:
        bucket.blob(name).upload_from_string(
            data, content_type="application/json",
            if_generation_match=generation)
    except exceptions.PreconditionFailed:
        raise ManifestMoved(f"{uri} changed meanwhile") from None


def _gcs_read(uri: str) -> tuple[Optional[dict], int]:
    """(the JSON object at ``uri`` or None, its generation or 0)."""
    from google.api_core import exceptions
    bucket, name = _gcs_bucket(uri)
    for _ in range(_CAS_ATTEMPTS):
        blob = bucket.get_blob(name)
        if blob is None:
            return None, 0
        try:  # the body of exactly that generation
            data = blob.download_as_bytes(if_generation_match=blob.generation)
        except (exceptions.PreconditionFailed, exceptions.NotFound):
            continue  # replaced between the two calls: read again
        return _manifest_doc(data, uri), int(blob.generation)
    raise ReleaseError(f"{uri} kept changing while being read")


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


def staged_manifest(staging: str) -> Optional[dict]:
    """The manifest of a complete staged release, or None (nothing staged,
    or a crashed run's partial files)."""
    try:
        return read_manifest(staging)
    except ReleaseError:
        return None


def _list(prefix: str) -> list[str]:
    if is_local(prefix):
        out = []
        for folder, dirs, files in os.walk(prefix):
            # A link to a folder is not walked into, but it is an entry
            # (a reader of the folder may follow it): listed as one.
            links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
            out += [os.path.join(folder, f) for f in files + links]
        return sorted(out)
    result = FileSystems.match([prefix.rstrip("/") + "/**"])[0]
    return sorted(m.path for m in result.metadata_list)


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


def file_digests(folder: str) -> dict:
    """Every file under ``folder`` but its manifest: relative name ->
    {"bytes": size, "sha256": hex digest}, read back from the folder. Not
    how a run builds its staged manifest's ``files`` (its writers' own
    digests, ``dpsynth.transforms.digests``): for tests and hand-made
    releases only."""
    sizes = _file_sizes(folder)
    digests = _sha256_all(folder, sorted(sizes))
    return {n: {"bytes": sizes[n], "sha256": digests[n]} for n in sorted(sizes)}


def verify_files(folder: str, manifest: dict,
                 names: Optional[list[str]] = None,
                 contents: bool = True) -> None:
    """Raises ``ReleaseChanged`` unless the files under ``folder`` are
    exactly those the manifest lists (``names``: only these, extra files
    allowed), each of the listed size and (``contents``; else names and
    sizes only, from one listing) digest."""
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise ReleaseChanged(
            f"{folder}: its manifest lists no file digests (staged by an "
            "older dpsynth); it cannot be checked, so it is not published")
    bad = [n for n, f in files.items() if not isinstance(f, dict)
           or not isinstance(f.get("bytes"), int)
           or not isinstance(f.get("sha256"), str)]
    if bad:
        raise ReleaseChanged(f"{folder}: its manifest's entry for {bad[0]!r} "
                             "is not a size and sha256; it cannot be checked")
    wanted = sorted(files) if names is None else sorted(names)
    stored = _stored_md5s(folder)
    sizes = ({n: size for n, (size, _) in stored.items()}
             if stored is not None else _file_sizes(folder))
    problems = [f"{n} is missing" for n in wanted if n not in sizes]
    if names is None:
        problems += [f"{n} is not in the manifest"
                     for n in sorted(set(sizes) - set(files))]
    problems += [f"{n} has {sizes[n]} bytes, not {files[n]['bytes']}"
                 for n in wanted if n in sizes and n in files
                 and sizes[n] != files[n].get("bytes")]
    if not problems and contents:
        problems = _differing(folder, wanted, files, stored or {})
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ReleaseChanged(f"{folder}: {problems[0]}{more}: its files are "
                             "not the ones its manifest lists")


def _differing(folder: str, wanted: list[str], files: dict,
               stored: dict[str, tuple[int, Optional[str]]]) -> list[str]:
    """Which of ``wanted`` hold other bytes than their manifest entries.
    A GCS object whose entry has its writer's md5 is checked against the
    md5 the store computed of the bytes it holds (no byte moves: see
    ``dpsynth.transforms.digests``); every other file is read and hashed
    (sha256)."""
    by_store = [n for n in wanted if files[n].get("md5")
                and stored.get(n, (0, None))[1]]
    problems = [f"{n} differs (md5)" for n in by_store
                if stored[n][1] != files[n]["md5"]]
    read = [n for n in wanted if n not in by_store]
    digests = _sha256_all(folder, read)
    return problems + [f"{n} differs (sha256)" for n in read
                       if digests[n] != files[n]["sha256"]]


def _stored_md5s(folder: str
                 ) -> Optional[dict[str, tuple[int, Optional[str]]]]:
    """On GCS: relative name -> (size, md5 the store computed; None for
    objects without one, such as composed ones) of every object under
    ``folder`` but the manifest and its temporary file, from one listing.
    None elsewhere."""
    if not folder.startswith("gs://"):
        return None
    bucket, name = _gcs_bucket(folder.rstrip("/") + "/")
    found = {blob.name[len(name):]: (int(blob.size), blob.md5_hash)
             for blob in bucket.list_blobs(prefix=name)
             if not blob.name.endswith("/")}  # a console's folder marker
    return _release_files(found)


def _release_files(found: dict) -> dict:
    """``found`` (relative name -> anything) without the manifest and its
    temporary file."""
    return {n: v for n, v in found.items()
            if n != MANIFEST and not n.startswith(_TEMP_PREFIX)}


def _file_sizes(folder: str) -> dict[str, int]:
    """Relative name -> size of every file under ``folder`` but the
    manifest and its temporary file."""
    prefix = folder.rstrip("/") + "/"
    if is_local(folder):
        sizes = {p[len(prefix):]: _local_size(p) for p in _list(folder)}
    else:
        found = FileSystems.match([prefix + "**"])[0].metadata_list
        sizes = {m.path[len(prefix):]: int(m.size_in_bytes) for m in found}
    return _release_files(sizes)


def _local_size(path: str) -> int:
    """The size of a local file (links followed; -1: a broken link or a
    file removed meanwhile, which matches no listed size)."""
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def _sha256_all(folder: str, names: list[str]) -> dict[str, str]:
    def digest(name: str) -> str:
        h = hashlib.sha256()
        try:
            with FileSystems.open(io.join(folder, name),
                                  compression_type="uncompressed") as f:
                for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
                    h.update(chunk)
        except OSError:  # removed meanwhile: it cannot match
            return ""
        return h.hexdigest()
    with ThreadPoolExecutor(max(1, min(8, usable_cores()))) as pool:
        return dict(zip(names, pool.map(digest, names)))


def verify_release(path: str, manifest: Optional[dict] = None,
                   require_files: bool = False) -> dict:
    """Checks a published release's files against its manifest (sizes and
    sha256; nothing missing or added); returns the manifest. Releases made
    before manifests listed their files cannot be checked: refused with
    ``require_files`` (a release this dpsynth just made always lists them,
    so a missing list means a rewritten manifest), else returned with a
    warning."""
    manifest = read_manifest(path) if manifest is None else manifest
    if "files" in manifest or require_files:
        verify_files(release_root(path, manifest), manifest)
    else:
        warnings.warn(f"{path}: its manifest lists no file digests (made "
                      "before dpsynth recorded them, or rewritten): its files "
                      "are read unchecked", stacklevel=2)
    return manifest


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


def release_files(path: str, manifest: Optional[dict] = None) -> list[str]:
    """The data shard paths of a published release, class by class."""
    manifest = read_manifest(path) if manifest is None else manifest
    root = release_root(path, manifest)
    return [io.join(root, "data", name)
            for c in manifest["classes"] for name in c["shards"]]


# Rows per block when a release is read whole: the pipeline's 4,096 makes a
# Python round per 6 MB of a 1M x 384 release (a 16,384-row block is 25 MB
# of float32 rows as read, 50 MB in the tuple form's float64).
_READ_BLOCK_ROWS = 16384


def release_blocks(path: str, manifest: dict):
    """(file, x, y) blocks of a release's data shards, in either output
    format (the manifest's ``outputs``; older releases: TFRecord)."""
    read = _shard_reader(manifest)
    for f in release_files(path, manifest):
        for x, y in read(f):
            yield f, x, y


def _shard_reader(manifest: dict):
    """shard path -> its (x, y) blocks (x as the shards store it: float32),
    as the release's manifest names its format and features."""
    outputs = manifest.get("outputs", {})
    features = outputs.get("features") or {}
    role = {f.get("role"): name for name, f in features.items()}

    def read(shard: str):
        spec = io.InputSpec(shard,
                            io.detect_format(shard, outputs.get("format")),
                            role.get("embedding", "embedding"),
                            role.get("label", "label"),
                            block_size=_READ_BLOCK_ROWS)
        for x, y, _ in io.read_file_blocks(shard, spec):
            yield x, y
    return read


def _all_blocks(path: str, manifest: dict, dtype: type,
                checked: bool = False) -> tuple[list, list]:
    """Every block of the release as (x as ``dtype``, y) lists, in the
    files' order. The shards are read on as many threads as there are
    usable cores (Arrow's decoding and numpy's conversions release the
    GIL); they hold float32, which the reader hands over as it is.
    ``checked``: each shard is read once and the bytes parsed are the bytes
    checked against the manifest (``_checked_copy``)."""
    blocks_of = _shard_reader(manifest)
    root = release_root(path, manifest)

    def read(shard: str) -> list:
        if not checked:
            return [(x.astype(dtype, copy=False), y)
                    for x, y in blocks_of(shard)]
        with _checked_copy(shard, root, manifest["files"]) as copy:
            return [(x.astype(dtype, copy=False), y)
                    for x, y in blocks_of(copy)]
    with ThreadPoolExecutor(usable_cores()) as pool:
        futures = [pool.submit(read, shard)
                   for shard in release_files(path, manifest)]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:  # a changed file explains another shard's parse error
        raise next((e for e in errors if isinstance(e, ReleaseChanged)),
                   errors[0])
    blocks = [b for f in futures for b in f.result()]
    return [b[0] for b in blocks], [b[1] for b in blocks]


@contextlib.contextmanager
def _checked_copy(shard: str, root: str, files: dict) -> Iterator[str]:
    """A private copy of ``shard``'s bytes, read once and checked against
    its manifest entry (size, sha256) before it is parsed: hashing a file
    and then opening it again to parse it reads whatever is there by then
    (a shard swapped between the two reads was returned as the release).
    On gs:// too the bytes hashed are the bytes parsed, whichever
    generation they came from."""
    name = shard[len(root.rstrip("/")) + 1:]
    entry = files.get(name)
    with FileSystems.open(shard, compression_type="uncompressed") as f:
        data = f.read()
    if (not isinstance(entry, dict) or len(data) != entry.get("bytes")
            or hashlib.sha256(data).hexdigest() != entry.get("sha256")):
        raise ReleaseChanged(f"{root}: {name} differs (sha256) as read: its "
                             "files are not the ones its manifest lists")
    folder = tempfile.mkdtemp(prefix="dpsynth-read-")  # ours only (0700)
    try:
        copy = os.path.join(folder, posixpath.basename(shard))
        with open(copy, "wb") as f:
            f.write(data)
        del data
        yield copy
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _verify_for_reading(path: str, manifest: dict) -> bool:
    """``verify_release`` less the shards' contents, which the reader
    checks on the very bytes it parses; returns whether it will (False: a
    release made before manifests listed files, read unchecked with a
    warning)."""
    if "files" not in manifest:
        verify_release(path, manifest)  # warns
        return False
    root = release_root(path, manifest)
    verify_files(root, manifest, contents=False)  # none missing or added
    shards = {f"data/{name}" for c in manifest["classes"]
              for name in c["shards"]}
    others = [n for n in manifest["files"] if n not in shards]
    if others:
        verify_files(root, manifest, names=others)
    return True


LOAD_AS = ("tuple", "numpy", "pandas", "tf")


def load_release(path: str, as_: str = "tuple", shuffle: bool = True,
                 seed: int = 0, verify: bool = True,
                 manifest_sha256: Optional[str] = None):
    """A published release (refuses incomplete ones), read through its
    manifest.

    ``as_``: "tuple" (default) -> (x, y, manifest) in file order (shards
    hold one class each); "numpy" -> (x, y) float32 / int64, rows
    shuffled; "pandas" -> a DataFrame with an ``embedding`` column (float32
    arrays) and a ``label`` column, rows shuffled; "tf" -> a shuffled
    ``tf.data.Dataset`` of (embedding, label). Shuffling matters: training
    on the files in order gives single-class batches. ``seed`` makes the
    order reproducible (the order is public: it is not data).
    ``verify`` (default): check every file against the sizes and sha256
    digests the manifest lists, each shard on the very bytes parsed (read
    once), so a swapped, truncated or missing file raises
    ``ReleaseChanged`` instead of being read as the release, also when it
    is swapped while being read.
    ``manifest_sha256``: read only the release whose manifest has this
    digest (``LATEST.json`` carries the verified one; ``load_latest``), else
    ``ReleaseChanged``: a path alone names whatever was published there last.
    """
    if as_ not in LOAD_AS:
        raise ValueError(f"as_ must be one of {LOAD_AS}, got {as_!r}")
    manifest = read_manifest(path, manifest_sha256)
    checked = verify and _verify_for_reading(path, manifest)
    dim = manifest.get("embedding_dim", 0)
    if as_ == "tuple":
        xs, ys = _all_blocks(path, manifest, np.float64, checked)
        x = np.concatenate(xs) if xs else np.zeros((0, dim))
        y = np.concatenate(ys) if ys else np.zeros(0, np.int64)
        return x, y, manifest
    x, y = _in_order(*_all_blocks(path, manifest, np.float32, checked), dim,
                     shuffle, seed)
    if as_ == "numpy":
        return x, y
    if as_ == "pandas":
        import pandas as pd  # a base dependency; imported late (~0.5 s)
        return pd.DataFrame({"embedding": list(x), "label": y})
    return _tensorflow().data.Dataset.from_tensor_slices((x, y))


def load_latest(output_root: str, budget_store: Optional[str] = None,
                dataset_id: Optional[str] = None, **kwargs):
    """The release ``output_root/LATEST.json`` points at (written by
    ``deploy/publish.py`` after verifying it), read with ``load_release``
    (``kwargs``: its options) pinned to the manifest digest recorded there,
    so a folder re-published since (``--overwrite``) is refused, not read
    as the verified release. A ``LATEST.json`` without the digest (older
    dpsynth) is refused too: the next publish writes it.

    ``budget_store`` and ``dataset_id`` (the reader's, never LATEST.json's
    own claim): the pinned digest must be the manifest the store recorded
    for LATEST's run, else ``ReleaseChanged``; LATEST.json itself lies
    where anyone who writes under ``output_root`` can point it at a
    self-consistent copy. Without them the reader is promised only that
    the release is the one LATEST.json pins, unchanged since
    (docs/threat-model.md)."""
    where = io.join(output_root, LATEST)
    with FileSystems.open(where) as f:
        data = f.read()
    try:
        latest = json.loads(data.decode())
    except ValueError:  # also UnicodeDecodeError
        latest = None
    if not (isinstance(latest, dict)
            and isinstance(latest.get("release"), str)
            and isinstance(latest.get("manifest_sha256"), str)):
        raise ReleaseError(f"{where} names no release with its manifest_sha256"
                           " (written by an older dpsynth, or edited): re-run "
                           "dpsynth.deploy.publish")
    if budget_store is not None:
        _check_latest_recorded(where, latest, budget_store, dataset_id)
    # publish never points LATEST at a release that is not private
    # (--epsilon inf, --noise-seed); one named there was put there by hand.
    pinned = read_manifest(latest["release"], latest["manifest_sha256"])
    if pinned.get("private") is not True:
        raise ReleaseError(f"{where} names {latest['release']}, a release "
                           "that is NOT PRIVATE (its manifest does not say "
                           "private: made with --epsilon inf or --noise-seed);"
                           " LATEST never names one: not reading it")
    if budget_store is not None and pinned.get("run_id") != latest.get(
            "run_id"):
        raise ReleaseChanged(f"{where} names run {latest.get('run_id')!r}, "
                             f"but {latest['release']} holds run "
                             f"{pinned.get('run_id')!r}: not reading it")
    return load_release(latest["release"],
                        manifest_sha256=latest["manifest_sha256"], **kwargs)


def _check_latest_recorded(where: str, latest: dict, store: str,
                           dataset_id: Optional[str]) -> None:
    """LATEST's pinned digest must be the manifest ``store`` recorded for
    its run (staged or published)."""
    from dpsynth.pipelines.budget import store as budget_store
    if not dataset_id:
        raise ValueError("load_latest: budget_store needs dataset_id")
    run_id = latest.get("run_id")
    recorded = (budget_store.recorded_manifest(store, dataset_id, run_id)
                if isinstance(run_id, str) else None)
    if recorded != latest["manifest_sha256"]:
        raise ReleaseChanged(
            f"{where} pins a manifest (sha256 "
            f"{latest['manifest_sha256'][:12]}...) that budget store {store} "
            f"(dataset {dataset_id!r}) never recorded for run {run_id!r}: "
            "LATEST.json was pointed elsewhere; not reading it")


def _tensorflow():
    """TensorFlow (the ``tf`` extra, ~2 GB), or one line saying how to get
    it."""
    try:
        import tensorflow as tf
    except ImportError:
        raise ImportError("load_release(as_='tf') needs TensorFlow: "
                          "pip install 'dpsynth[tf]'") from None
    return tf


def _in_order(xs: list, ys: list, dim: int, shuffle: bool, seed: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """The blocks as one float32 x and int64 y, rows in the seeded random
    order (the files' order without ``shuffle``). Each block's rows go
    straight to their places and the block is dropped: the release is held
    once beside its blocks (a 1M x 384 release: ~3 GB at most), not stacked
    in float64 and then gathered (~10 GB, 33 s here)."""
    n = sum(len(y) for y in ys)
    dim = xs[0].shape[1] if xs else dim  # the files' own width
    order = (np.random.default_rng(seed).permutation(n) if shuffle
             else np.arange(n))
    place = np.empty(n, np.int64)
    place[order] = np.arange(n)  # row i of the files goes to place[i]
    x, y = np.empty((n, dim), np.float32), np.empty(n, np.int64)
    start = 0
    xs.reverse()  # pop() from the end: the files' order
    ys.reverse()
    while xs:
        xb, yb = xs.pop(), ys.pop()
        rows = place[start:start + len(yb)]
        x[rows], y[rows] = xb, yb
        start += len(yb)
    return x, y


def load_gmm(path: str):
    from dpsynth.models.gmm import MixtureRelease
    manifest = read_manifest(path)
    root = release_root(path, manifest)
    name = manifest.get("outputs", {}).get("gmm", "gmm.npz")
    with FileSystems.open(io.join(root, name)) as f:
        data = f.read()
    listed = manifest.get("files", {}).get(name)
    if listed and hashlib.sha256(data).hexdigest() != listed.get("sha256"):
        raise ReleaseChanged(f"{io.join(root, name)} differs (sha256) from "
                             "the file its manifest lists")
    return MixtureRelease.from_npz(data)


def versions() -> dict:
    from importlib import metadata
    out = {}
    for pkg in ("dpsynth", "apache-beam", "dp-accounting", "numpy",
                "tensorflow", "scikit-learn"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out
