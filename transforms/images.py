"""Image readers: labelled images → (source, label, uint8 RGB image [h, w, 3]) in Beam workers.

Layouts (all through Beam's FileSystems, so local paths and gs:// work the same):
  folder    ROOT/<class>/*.jpg|jpeg|png; labels are the sorted class folder names → 0..C-1.
  tfrecord  files matching PATTERN (*.tfrecord*) of tf.train.Example with encoded image bytes
            ('image/encoded' or 'image' ...) and an int64 label ('image/class/label' or 'label' ...).
  npz       files matching PATTERN (*.npz) with arrays `images` uint8 [n, h, w(, 3|1)] and `labels` int [n]
            (optionally `classes`, the class names in label order).

Only listings happen while the graph is built (class folder names, an npz's `classes`); files are opened,
read and decoded in the workers, after a Reshuffle so that decoding and encoding spread over them.

A file or record that cannot be read or decoded goes to the `bad` output as (source, reason) — never dropped
silently. A TFRecord file that cannot be opened or whose framing is damaged (bad checksum, truncated) is not
one bad image: it fails the run with an `ImageInputError` naming the file and the byte offset, since the records
after the damage cannot be found; so does an `.npz` of images that cannot be read or is malformed (skipping it
would drop every record in it). Two policies (`CheckBadImages`) for single bad images:

* `dpsynth encode` (data preparation inside the trust boundary, no release): counts them, logs the names, can
  write them to a report file, and stops the run with `BadImagesError` when there are more than
  `--max-bad-images`. Its single output gates the writers (`gate_on`), so nothing is written then.
* `dpsynth generate --images` (a DP release): an unreadable image is skipped by a per-record rule, like a row
  with NaN under `--non-finite drop`: whether a release exists must never depend on an exact count of
  private records. The number skipped only reaches the operator's Beam counter
  `dpsynth_images/images_unreadable` and, with `--bad-images-report`, a file the operator names; never the
  release, the manifest or the logs.

Labels of the folder layout: `classes` (public configuration, `--classes`) names the class folders in label
order; only those folders are listed, and a missing or empty one is an empty class. Without `classes`
(`dpsynth encode` only) the root is listed and the class folders sorted.

The bad-image report names private files: it is an operator diagnostic that stays with the private input,
never part of a DP release.
"""

from __future__ import annotations

import io
import logging
from typing import Iterator, Optional, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from dpsynth.transforms.formats import (IMAGE_EXTENSIONS, IMAGE_LAYOUTS,  # noqa: F401 (the errors: re-exported)
                                BadImagesError, ImageInputError)

log = logging.getLogger("dpsynth.images")

LAYOUTS = IMAGE_LAYOUTS
IMAGE_FEATURE_KEYS = ("image/encoded", "image", "image_raw", "image/raw", "encoded", "jpeg", "png")
LABEL_FEATURE_KEYS = ("image/class/label", "label", "class", "image/label", "labels")
_METRICS = "dpsynth_images"
# Marker the CLI looks for in Beam's wrapped worker errors.
BAD_IMAGES_MARKER = "BadImagesError"


# ------------------------------------------------------------------ layouts and listing (graph construction)

def detect_layout(images: str, layout: Optional[str] = None) -> str:
    """'folder', 'tfrecord' or 'npz' from the --images argument (or the explicit `layout`)."""
    if layout:
        if layout not in LAYOUTS:
            raise ImageInputError(f"--image-layout must be one of {LAYOUTS}, got {layout!r}")
        return layout
    base = images.rstrip("/").rsplit("/", 1)[-1].lower()
    if ".npz" in base:
        return "npz"
    if ".tfrecord" in base or base.endswith(".tfr"):
        return "tfrecord"
    if any(ch in images for ch in "*?["):
        raise ImageInputError(f"--images {images!r}: a glob must name .npz or .tfrecord files; a folder-per-class "
                              f"layout takes the root folder itself (ROOT/<class>/*.jpg)")
    return "folder"


def _root(images: str) -> str:
    return images.rstrip("/") if images not in ("/", "") else images


def list_classes(images: str) -> list[str]:
    """Sorted class folder names of a folder-per-class layout (a listing only: no image is opened)."""
    root = _root(images)
    try:
        found = FileSystems.match([root + "/*/*"])[0].metadata_list
    except Exception as err:
        raise ImageInputError(f"--images {images!r}: cannot list files ({err})") from None
    classes = set()
    for meta in found:
        rel = meta.path[len(root) + 1:]
        parts = rel.split("/")
        if len(parts) == 2 and parts[1].lower().endswith(IMAGE_EXTENSIONS):
            classes.add(parts[0])
    if not classes:
        raise ImageInputError(f"--images {images!r}: no ROOT/<class>/*.jpg|jpeg|png files found "
                              f"(folder-per-class layout)")
    return sorted(classes)


def npz_classes(pattern: str) -> Optional[list[str]]:
    """The `classes` array of the first npz file matching `pattern`, if it has one (only that member is read)."""
    paths = _match(pattern)
    with FileSystems.open(paths[0], compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        data = handle.read()
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return [str(c) for c in npz["classes"]] if "classes" in npz.files else None
    except Exception:  # a broken file is reported by the workers, with its name
        return None


def _match(pattern: str) -> list[str]:
    try:
        found = FileSystems.match([pattern])[0].metadata_list
    except Exception as err:
        raise ImageInputError(f"--images {pattern!r}: cannot list files ({err})") from None
    if not found:
        raise ImageInputError(f"--images {pattern!r}: no files match")
    return sorted(m.path for m in found)


# ------------------------------------------------------------------ decoding (workers)

def decode_image(data: bytes) -> np.ndarray:
    """Encoded JPEG/PNG bytes → uint8 RGB [h, w, 3]; raises on corrupt or truncated data."""
    from PIL import Image, UnidentifiedImageError
    try:
        pil = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ValueError(f"not an image format Pillow can decode ({len(data)} bytes)") from None
    with pil:
        pil.load()  # forces a full decode, so truncated files fail here
        rgb = pil.convert("RGB")
    return np.asarray(rgb, dtype=np.uint8)


def _as_rgb_rows(images: np.ndarray) -> np.ndarray:
    """npz `images` → uint8 [n, h, w, 3]; raises ValueError on other shapes/dtypes."""
    if images.dtype != np.uint8:
        raise ValueError(f"'images' must be uint8, got {images.dtype}")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise ValueError(f"'images' must be [n, h, w], [n, h, w, 1] or [n, h, w, 3], got {images.shape}")
    return np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else images


def _read(path: str) -> bytes:
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        return handle.read()


class _DecodeFilesFn(beam.DoFn):
    """(path, label) → (path, label, image); unreadable files → 'bad'."""

    def __init__(self):
        self.decoded = Metrics.counter(_METRICS, "images_decoded")

    def process(self, item: tuple[str, int]):
        path, label = item
        try:
            image = decode_image(_read(path))
        except Exception as err:
            yield beam.pvalue.TaggedOutput("bad", (path, f"{type(err).__name__}: {err}"))
            return
        self.decoded.inc()
        yield path, int(label), image


def _class_files(item: tuple[str, str, int]) -> Iterator[tuple[str, int]]:
    """(root, class name, label) → (path, label) for the class folder's direct image files (none for a missing
    folder: an empty class)."""
    root, name, label = item
    prefix = f"{root}/{name}/"
    try:
        found = FileSystems.match([prefix + "*"])[0].metadata_list
    except Exception:  # a missing class folder: an empty class
        return
    for meta in found:
        rel = meta.path[len(prefix):]
        # On gs:// a '*' also matches across '/': keep direct children only.
        if "/" not in rel and rel.lower().endswith(IMAGE_EXTENSIONS):
            yield meta.path, label


def _tfrecord_records(path: str) -> Iterator[tuple[str, bytes]]:
    """path → (source 'path#i', record) ...

    Damaged framing (a bad checksum, a file that ends inside a record) fails the run with an ImageInputError
    naming the file and the byte offset, as the embedding reader does: skipping the rest of the file would drop
    other people's records, and skipping only the damaged one is impossible (its length cannot be trusted).
    """
    from dpsynth.transforms.io import InputError, tfrecord_payloads
    try:
        for index, record in enumerate(tfrecord_payloads(path)):
            yield f"{path}#{index}", record
    except InputError as err:
        raise ImageInputError(str(err)) from None


class _ReadTFRecordsFn(beam.DoFn):
    def process(self, path: str):
        yield from _tfrecord_records(path)


def _first_key(features, wanted: Optional[str], candidates: Sequence[str], what: str) -> str:
    keys = [wanted] if wanted else list(candidates)
    for key in keys:
        if key in features:
            return key
    raise ValueError(f"no {what} feature {keys if wanted else 'among ' + str(list(candidates))}; "
                     f"the Example has {sorted(features)} (see --image-feature/--label-feature)")


class _DecodeExamplesFn(beam.DoFn):
    """(source, serialized tf.train.Example) → (source, label, image); bad records → 'bad'."""

    def __init__(self, image_key: Optional[str], label_key: Optional[str]):
        self.image_key, self.label_key = image_key, label_key
        self.decoded = Metrics.counter(_METRICS, "images_decoded")

    def setup(self):
        from tensorflow.core.example import example_pb2  # TF only in the workers that need it
        self._example = example_pb2.Example

    def process(self, item: tuple[str, bytes]):
        source, record = item
        try:
            features = self._example.FromString(record).features.feature
            image_key = _first_key(features, self.image_key, IMAGE_FEATURE_KEYS, "image")
            label_key = _first_key(features, self.label_key, LABEL_FEATURE_KEYS, "label")
            images = features[image_key].bytes_list.value
            labels = features[label_key].int64_list.value
            if len(images) != 1 or len(labels) != 1:
                raise ValueError(f"need one image ({image_key!r} has {len(images)}) and one int64 label "
                                 f"({label_key!r} has {len(labels)})")
            image = decode_image(images[0])
        except Exception as err:
            yield beam.pvalue.TaggedOutput("bad", (source, f"{type(err).__name__}: {err}"))
            return
        self.decoded.inc()
        yield source, int(labels[0]), image


class _ReadNpzFn(beam.DoFn):
    """npz path → (path#i, label, image) rows. An unreadable or malformed file fails the run with an
    ImageInputError naming it: it holds many people's records, so skipping it whole would let one damaged
    file (or one record that damages it) drop the others, which no per-record rule can account for."""

    def __init__(self):
        self.decoded = Metrics.counter(_METRICS, "images_decoded")

    def process(self, path: str):
        try:
            with np.load(io.BytesIO(_read(path)), allow_pickle=False) as npz:
                missing = [k for k in ("images", "labels") if k not in npz.files]
                if missing:
                    raise ValueError(f"npz lacks arrays {missing} (has {npz.files})")
                images, labels = _as_rgb_rows(npz["images"]), np.asarray(npz["labels"])
            if labels.ndim != 1 or len(labels) != len(images) or not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(f"'labels' must be integers [n={len(images)}], got {labels.dtype} {labels.shape}")
        except Exception as err:
            raise ImageInputError(f"{path}: cannot read this .npz of images ({type(err).__name__}: {err}); "
                                  "fix or remove the file (skipping it would drop every record in it)") from None
        for i in range(len(images)):
            self.decoded.inc()
            yield f"{path}#{i}", int(labels[i]), images[i]


# ------------------------------------------------------------------ transforms

class ReadImages(beam.PTransform):
    """PBegin → {'images': (source, label, uint8 [h, w, 3]), 'bad': (source, reason)}.

    `classes` (folder layout): class folder names in label order; default: all class folders, sorted.
    Set at construction: `self.layout` and `self.classes` (names in label order, or None when unknown).
    """

    def __init__(self, images: str, layout: Optional[str] = None, classes: Optional[Sequence[str]] = None,
                 image_key: Optional[str] = None, label_key: Optional[str] = None):
        super().__init__()
        self.images = images
        self.layout = detect_layout(images, layout)
        self.image_key, self.label_key = image_key, label_key
        if self.layout == "folder":
            self.root = _root(images)
            # Given classes: nothing is listed to find them (a class folder with no image must not change the
            # label set or the numbering of the others).
            self.classes = list(classes) if classes else list_classes(images)
        else:
            self.paths = _match(images)
            given = list(classes) if classes else None
            self.classes = given or (npz_classes(images) if self.layout == "npz" else None)

    def expand(self, pbegin):
        if self.layout == "folder":
            jobs = [(self.root, name, label) for label, name in enumerate(self.classes)]
            decoded = (pbegin
                       | "ClassFolders" >> beam.Create(jobs)
                       | "ListFiles" >> beam.FlatMap(_class_files)
                       | "SpreadFiles" >> beam.Reshuffle()
                       | "Decode" >> beam.ParDo(_DecodeFilesFn()).with_outputs("bad", main="images"))
            return {"images": decoded.images, "bad": decoded.bad}
        files = (pbegin
                 | "Files" >> beam.Create(self.paths)
                 | "SpreadFiles" >> beam.Reshuffle())
        if self.layout == "npz":
            rows = files | "ReadNpz" >> beam.ParDo(_ReadNpzFn()).with_outputs("bad", main="images")
            spread = rows.images | "SpreadImages" >> beam.Reshuffle()
            return {"images": spread, "bad": rows.bad}
        records = files | "ReadRecords" >> beam.ParDo(_ReadTFRecordsFn())
        decoded = (records
                   | "SpreadRecords" >> beam.Reshuffle()
                   | "Decode" >> beam.ParDo(_DecodeExamplesFn(self.image_key, self.label_key)
                                            ).with_outputs("bad", main="images"))
        return {"images": decoded.images, "bad": decoded.bad}


def _budget_check(bad: list, max_bad: int, report_path: Optional[str]) -> dict:
    bad = sorted(bad)
    for source, reason in bad:
        log.warning("unreadable image %s: %s", source, reason)
    if report_path and bad:
        with FileSystems.create(report_path) as out:
            out.write("".join(f"{s}\t{r}\n" for s, r in bad).encode())
    if len(bad) > max_bad:
        shown = "; ".join(f"{s} ({r})" for s, r in bad[:5])
        more = f"; see {report_path} for all" if report_path else ""
        raise BadImagesError(f"{BAD_IMAGES_MARKER}: {len(bad)} unreadable images, more than --max-bad-images="
                             f"{max_bad}. First: {shown}{more}")
    return {"bad_images": len(bad), "report": report_path if bad else None}


def _skip_check(bad: list, report_path: Optional[str]) -> dict:
    """The release policy: unreadable images are skipped, one by one. Operator-only traces: a counter and,
    if asked for, a report file; nothing in the logs."""
    Metrics.counter(_METRICS, "images_unreadable").inc(len(bad))
    if report_path and bad:
        with FileSystems.create(report_path) as out:
            out.write("".join(f"{s}\t{r}\n" for s, r in sorted(bad)).encode())
    return {}


class CheckBadImages(beam.PTransform):
    """(source, reason) → one summary dict; with `max_bad` (encode), fails the run past `max_bad` bad images;
    with `max_bad=None` (a DP release), skips them per record and stops nothing.

    Use the output with `gate_on` so that writers only run once the check has passed.
    """

    def __init__(self, max_bad: Optional[int] = 0, report_path: Optional[str] = None):
        super().__init__()
        if max_bad is not None and max_bad < 0:
            raise ImageInputError(f"--max-bad-images must be >= 0, got {max_bad}")
        self.max_bad, self.report_path = max_bad, report_path

    def expand(self, bad):
        collected = bad | "Collect" >> beam.combiners.ToList()
        if self.max_bad is None:
            return collected | "Skip" >> beam.Map(_skip_check, self.report_path)
        return collected | "Budget" >> beam.Map(_budget_check, self.max_bad, self.report_path)


def _pass(element, _summary):
    return element


def gate_on(pcoll, summary, label: str = "AfterBadImageCheck"):
    """`pcoll` unchanged, but only processed after `summary` (a singleton) has been computed."""
    return pcoll | label >> beam.Map(_pass, beam.pvalue.AsSingleton(summary))
