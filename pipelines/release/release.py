"""A release's layout, staging names, manifest and file checks: what the
publisher (``publisher``: staging -> the switch) and the reader
(``reading``: ``load_release``, ``load_latest``) both rely on.

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

import hashlib
import json
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Mapping, Optional



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

from dpsynth.pipelines.runners.cores import usable_cores  # noqa: E402
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


def _gcs_bucket(uri: str):
    """(bucket handle, object name) of a gs:// URI."""
    from google.cloud import storage  # only gs:// outputs need it
    bucket, _, name = uri[len("gs://"):].partition("/")
    # No project is needed for object calls; None where credentials lack it.
    project = os.environ.get("GOOGLE_CLOUD_PROJECT") or None
    return storage.Client(project=project).bucket(bucket), name


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
