"""Privacy-ledger review: everything a run writes or says is either public
configuration or the output of a registered DP mechanism.

One real run (``dpsynth generate``, DirectRunner, seeded noise) is checked
field by field:

* manifest.json / summary.json: every leaf is tagged by an allow-list
  (``FIELDS``, with the reason for each) as PUBLIC (a function of the
  configuration, the input's schema or public randomness) or DP (a
  post-processed output of ledger mechanisms). An untagged field fails.
* PUBLIC values are recomputed from the configuration alone (the whole
  privacy block is ``plan.make_ledger(cfg).to_manifest()``).
* DP values (manifest, summary, gmm.npz, the TFRecord rows) are recomputed by
  the in-memory reference with the same noise seed, through a noise source
  that records every draw: each draw is made under the name of a registered
  mechanism, with that mechanism's sigma, and every mechanism is drawn.
* Exact private aggregates (class sizes, n, rows clipped, exact class sums
  and means) appear nowhere: not in any output file, log record or stdout.
  Every number in our log lines is a public or DP value.

A second, static guard scans the source: transforms/ and dp_ops/ may not
log or print (Beam counters only), except reviewed diagnostics listed in
``REVIEWED_LOG_CALLS``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io as stdio
import json
import logging
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest

from dpsynth.dp_ops import clipping, plan
from benchmarks import reference
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import SeededNoise
from dpsynth.pipelines import cli
from tests.conftest import release_dir

ROOT = Path(__file__).resolve().parent.parent
SIZES = (437, 289, 174)  # exact (private) class sizes: distinctive numbers
DIM = 6
NOISE_SEED = 20250612
EPSILON = 1.0

# ------------------------------------------------------------- allow-lists
# Every manifest leaf, by path ("[]" stands for any list index), with its
# classification: PUBLIC (a function of the configuration, the input's
# schema, or public randomness) or DP (post-processing of ledger mechanisms'
# outputs). Nothing else may appear: no input file names (one file per
# person would reveal membership), no sizes or hashes of private files, no
# wall times (they grow with n), no count of attempts.
FIELDS = {
    r"format": ("public", "release format version"),
    r"run_id": ("public", "--run-id, or random"),
    r"root": ("public", "random version folder name, drawn before any read"),
    r"created_utc": ("public", "one timestamp taken before any data is read"),
    r"noise": ("public", "description of the noise sampler"),
    r"private": ("public", "false with --noise-seed or --epsilon inf"),
    r"config\.\w+(\[\])?": ("public", "the generator configuration"),
    r"config\.budget_weights\.\w+": ("public", "--budget-weights"),
    r"input\.(pattern|format|non_finite)": ("public", "the user's input flags"),
    r"embedding_dim": ("public", "the input's schema (or --embedding-dim)"),
    # What the release holds and how to read it: file names, format,
    # feature names/dtypes/shape (the input's schema), the normalisation
    # and the requested covariance rank (all configuration).
    r"outputs\.(data|gmm|summary|schema|format|files)":
        ("public", "layout constants and the output format"),
    r"outputs\.features\.\w+\.(dtype|role|shape(\[\])?)":
        ("public", "feature names, dtypes, shape: config and schema"),
    r"outputs\.normalisation\.(normalize|clip_norm|apply_to_real_inputs|"
    r"python)": ("public", "the per-record transform users must apply"),
    r"outputs\.covariance\.(mode|requested_rank|stored_as)":
        ("public", "covariance configuration"),
    r"versions\.[\w-]+": ("public", "package versions"),
    r"privacy\.(accountant|accounting|neighbouring_relation|composition)":
        ("public", "accounting configuration"),
    r"privacy\.(target|spent)\.(epsilon|delta)":
        ("public", "target; spent = composition of the planned sigmas"),
    r"privacy\.mechanisms\[\]\.(name|stage|partition|sensitivity|sigma|"
    r"neighbouring|count|sampling_probability|noise_multiplier)":
        ("public", "the plan: calibrated before any data is read"),
    r"classes\[\]\.label": ("public", "the configured label set"),
    r"lifetime_budget": ("public", "null without --budget-store"),
    r"lifetime_budget\.(store|dataset_id)": ("public", "budget-store flags"),
    r"lifetime_budget\.lifetime_cap\.(epsilon|delta)":
        ("public", "--lifetime-epsilon/--lifetime-delta"),
    r"classes\[\]\.(noisy_count|components_with_mass|samples|"
    r"covariance_rank)": ("dp", "noisy counts and post-processing of the "
                          "noisy moments and second-moment matrix"),
    r"outputs\.covariance\.effective_rank\.(min|max)":
        ("dp", "factor columns kept: eigenvalues > 0 of the noisy covariance"),
    r"outputs\.covariance\.why_smaller":
        ("dp", "the sentence saying why fewer factors than requested"),
    r"classes\[\]\.shards\[\]":
        ("dp", "shard names: label and index; their number follows samples"),
    r"samples_total": ("dp", "sum of the DP sample counts"),
    r"files\..+\.(bytes|sha256|md5)": ("dp", "size, sha256 (and on GCS md5) "
                                       "of each release file: functions of "
                                       "the DP outputs in it"),
    # --covariance auto: the rule's choice is post-processing of the noisy
    # class counts (phase 1 mechanisms); null for the fixed plans.
    r"adaptive_plan": ("public", "null: a fixed plan ran"),
    r"adaptive_plan\.rule_inputs\.(epsilon|delta|d|mu)":
        ("public", "the target, the input's schema, the calibrated GDP mu"),
    r"adaptive_plan\.(structure|mode|class_subspace_rank|class_matrices|"
    r"shared_rank|"
    r"shares_of_mu2\.[\w-]+)": ("dp", "the rule's output: a public "
                                "function of the noisy class counts"),
    r"adaptive_plan\.rule_inputs\.(noisy_counts\[\]|typical_count|signal)":
        ("dp", "the noisy class counts and functions of them"),
    r"warnings\[\]": ("dp", "config, or the noisy record count"),
    # PipelineDP's own account of its aggregations (its parameters and the
    # ledger's sigmas).
    r"pipelinedp": ("public", "null: no aggregation ran through PipelineDP"),
    r"pipelinedp\.(version|explain_computation\[\])":
        ("public", "PipelineDP's version and explanation: the plan"),
}
PUBLIC = [p for p, (tag, _) in FIELDS.items() if tag == "public"]
DP = [p for p, (tag, _) in FIELDS.items() if tag == "dp"]
SUMMARY_KEYS = {"label": "public", "noisy_count": "dp",
                "components_with_mass": "dp", "covariance_rank": "dp",
                "samples": "dp", "shards": "dp"}


def _tag(path: str) -> str | None:
    for tag, patterns in (("public", PUBLIC), ("dp", DP)):
        if any(re.fullmatch(p, path) for p in patterns):
            return tag
    return None


def _leaves(doc, prefix=""):
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, f"{prefix}.{k}" if prefix else k)
    elif isinstance(doc, list):
        if not doc:
            yield prefix + "[]", None
        for v in doc:
            yield from _leaves(v, prefix + "[]")
    else:
        yield prefix, doc


# ------------------------------------------------------------ the one run

class RecordingNoise(SeededNoise):
    """SeededNoise that remembers (key, sigma, size) of every draw."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[tuple[str, float, int]] = []

    def lattice_draw(self, sigma, size, key, grid=None):
        out = super().lattice_draw(sigma, size, key, grid)
        self.draws.append((key, float(sigma), size))
        return out


def _private_data():
    rng = np.random.default_rng(99)
    centres = rng.normal(size=(3, DIM)) * 2.0
    xs, ys = [], []
    for label, size in enumerate(SIZES):
        xs.append(centres[label] + 0.4 * rng.normal(size=(size, DIM)))
        ys.append(np.full(size, label))
    order = rng.permutation(sum(SIZES))
    return np.vstack(xs)[order], np.concatenate(ys)[order].astype(np.int64)


def write_private_file(tmp: Path):
    """The private rows in one input file; returns (x, y). One file per
    person would be typical: the user passes a pattern."""
    x, y = _private_data()
    np.savez(tmp / "patient-0001.npz", embeddings=x, labels=y)
    return x, y


def manifest_config(run) -> GeneratorConfig:
    """The GeneratorConfig a release's manifest records."""
    conf = dict(run["manifest"]["config"])
    conf["labels"] = tuple(conf["labels"])
    return GeneratorConfig(**conf)


def run_generate(argv: list[str], x, y, out: Path, tmp: Path) -> dict:
    """Runs the CLI once, capturing logs (all loggers) and stdout/stderr."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    keep, root = Keep(level=logging.DEBUG), logging.getLogger()
    old_level = root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    stdout, stderr = stdio.StringIO(), stdio.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), \
                contextlib.redirect_stderr(stderr):
            rc = cli.main(argv)
    finally:
        root.removeHandler(keep)
        root.setLevel(old_level)
    assert rc == 0, stderr.getvalue()
    manifest = json.loads((out / "_manifest.json").read_text())
    logs = [(r.name, r.getMessage()) for r in records]
    return dict(x=x, y=y, out=out, tmp=tmp, manifest=manifest, logs=logs,
                stdout=stdout.getvalue(), stderr=stderr.getvalue())


def review_run(tmp_path_factory, name: str, flags: list) -> dict:
    """`generate` with ``flags`` on a fresh private file (run_generate)."""
    tmp = tmp_path_factory.mktemp(name)
    x, y = write_private_file(tmp)
    out = tmp / "release"
    argv = ["generate", "--input", str(tmp / "patient-*.npz"), "--output",
            str(out), *flags]
    return run_generate(argv, x, y, out, tmp)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Runs the CLI once, capturing logs (all loggers) and stdout/stderr."""
    return review_run(tmp_path_factory, "review", [
        "--num-classes", "3", "--epsilon", str(EPSILON), "--clusters", "3",
        "--normalize", "none", "--clip-norm", "1.0", "--vote-filter",
        "--vote-threshold", "2", "--accountant", "rdp",
        "--noise-seed", str(NOISE_SEED), "--rows-per-shard", "100"])


@pytest.fixture(scope="module")
def expected(run):
    """The same run in memory: DP outputs and every noise draw."""
    cfg = manifest_config(run)
    ledger = plan.make_ledger(cfg)
    noise = RecordingNoise(NOISE_SEED)
    mixes, xs, ys = reference.generate(run["x"], run["y"], cfg, ledger, noise)
    centre = mixes[cfg.labels[0]].centre  # DP (public) once released
    xc, clipped = clipping.preprocess(run["x"], cfg.normalize, cfg.clip_norm,
                                      centre)
    centre_sum, n = clipping.centre_sum(run["x"], cfg.normalize,
                                        cfg.centre_bound)
    private = {
        "sizes": [int((run["y"] == l).sum()) for l in cfg.labels],
        "n": len(run["y"]),
        "clipped": clipped,
        "sums": [xc[run["y"] == l].sum(axis=0) for l in cfg.labels]
        + [centre_sum],
        "means": [xc[run["y"] == l].mean(axis=0) for l in cfg.labels]
        + [centre_sum / n],
    }
    return dict(cfg=cfg, ledger=ledger, noise=noise, mixes=mixes, xs=xs,
                ys=ys, private=private)


def test_the_run_is_a_meaningful_probe(run, expected):
    """Noise moved every DP count well away from the exact one, so an exact
    value showing up somewhere cannot be a rounding coincidence."""
    priv = expected["private"]
    assert priv["sizes"] == list(SIZES) and priv["clipped"] > 500
    for c, size in zip(run["manifest"]["classes"], SIZES):
        assert abs(c["noisy_count"] - size) > 2
        assert abs(c["samples"] - size) > 2
    assert abs(run["manifest"]["samples_total"] - sum(SIZES)) > 2


# ------------------------------------------------------ manifest + summary

def test_every_manifest_field_is_tagged(run):
    untagged = sorted({p for p, _ in _leaves(run["manifest"])
                       if _tag(p) is None})
    assert not untagged, (f"manifest fields with no privacy tag: {untagged}; "
                          f"add each to PUBLIC/DP in this test after review")


def test_pipelinedp_ran_the_per_class_moments(run, expected):
    """The fixed plan's per-class moment fields ran as one PipelineDP
    aggregation; its explanation is the plan (the ledger's sensitivity
    and sigma, public partitions, no bounding or selection of its own)."""
    doc, ledger = run["manifest"]["pipelinedp"], expected["ledger"]
    fields = plan.moment_fields(expected["cfg"])
    # one aggregation, one custom combiner per field
    (text,) = doc["explain_computation"]
    for field in fields:
        m = ledger.get(plan.name(expected["cfg"].labels[0], "moments", field))
        assert (f"class=<c>/moments/{field}, L2 sensitivity="
                f"{m.sensitivity:.6g}, sigma={m.sigma:.6g};") in text
    assert "Partition selection: public partitions" in text


def test_public_fields_are_functions_of_the_configuration(run, expected):
    m, cfg = run["manifest"], expected["cfg"]
    assert m["privacy"] == json.loads(json.dumps(
        expected["ledger"].to_manifest()))
    config = dataclasses.asdict(cfg)
    config["labels"] = list(cfg.labels)
    assert m["config"] == json.loads(json.dumps(config))
    assert m["embedding_dim"] == DIM  # the input's schema
    assert m["input"]["pattern"] == str(run["tmp"] / "patient-*.npz")
    assert "files" not in m["input"]  # the matched file list stays out
    assert [c["label"] for c in m["classes"]] == list(cfg.labels)


def test_no_private_file_metadata_in_the_release(run):
    """Input file names, sizes and hashes stay out of every release file:
    the release holds manifest.json and the one version folder it names."""
    import hashlib
    out, private = Path(run["out"]), run["tmp"] / "patient-0001.npz"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["_manifest.json", run["manifest"]["root"]])
    data = private.read_bytes()
    needles = {private.name, str(len(data)), hashlib.sha256(data).hexdigest(),
               hashlib.md5(data).hexdigest()}
    for path in out.rglob("*.json"):
        text = path.read_text()
        for needle in needles:
            assert needle not in text, f"{needle} in {path.name}"


def test_dp_fields_are_mechanism_outputs(run, expected):
    m, mixes = run["manifest"], expected["mixes"]
    summary = json.loads((release_dir(run["out"]) / "_summary.json")
                         .read_text())
    for entry in summary:
        assert set(entry) == set(SUMMARY_KEYS), entry.keys()
    for c, s in zip(m["classes"], summary):
        mix = mixes[c["label"]]
        assert c == s
        assert c["noisy_count"] == pytest.approx(mix.noisy_count, abs=1e-9)
        assert c["components_with_mass"] == int((mix.weights > 0).sum())
        assert c["samples"] == int((expected["ys"] == c["label"]).sum())
        assert len(c["shards"]) == max(1, math.ceil(c["samples"] / 100))
    assert m["samples_total"] == len(expected["ys"])
    noisy_n = sum(max(c["noisy_count"], 0) for c in m["classes"])
    noisy = {c["label"]: c["noisy_count"] for c in m["classes"]}
    for warning in m["warnings"]:
        if warning.startswith("class "):  # a class's own noisy count
            label = int(warning.split()[1].rstrip(":"))
            assert f"noisy count {noisy[label]:.1f}" in warning
            continue
        assert (f"{noisy_n:.0f}" in warning or "NOT differentially" in warning
                or warning.startswith(("NOT PRIVATE", "epsilon=")))


def test_gmm_npz_holds_only_mechanism_outputs(run, expected):
    with np.load(release_dir(run["out"]) / "_gmm.npz") as z:
        arrays = {k: z[k] for k in z.files}
    labels = expected["cfg"].labels
    allowed = {"labels"} | {f"class_{l}_{f}" for l in labels for f in
                            ("weights", "means", "variances", "noisy_count")}
    if expected["cfg"].covariance_rank:
        allowed.add("shared_factors")
        np.testing.assert_allclose(arrays["shared_factors"],
                                   expected["mixes"][labels[0]].factors,
                                   rtol=1e-9, atol=1e-12)
    if expected["cfg"].center:
        allowed.add("centre")  # noisy sum / noisy count, see centre.py
        np.testing.assert_allclose(arrays["centre"],
                                   expected["mixes"][labels[0]].centre,
                                   rtol=1e-9, atol=1e-12)
    assert set(arrays) == allowed
    assert arrays["labels"].tolist() == list(labels)
    for l in labels:
        mix = expected["mixes"][l]
        for field in ("weights", "means", "variances"):
            np.testing.assert_allclose(arrays[f"class_{l}_{field}"],
                                       getattr(mix, field), rtol=1e-9,
                                       atol=1e-12)
        assert float(arrays[f"class_{l}_noisy_count"]) == \
            pytest.approx(mix.noisy_count, abs=1e-9)


def test_tfrecord_rows_are_samples_of_the_dp_mixture(run, expected):
    from dpsynth.pipelines.release import load_release
    xr, yr, _ = load_release(str(run["out"]))
    order_r = np.lexsort(np.column_stack([xr, yr]).T)
    xs, ys = expected["xs"].astype(np.float32), expected["ys"]
    order_e = np.lexsort(np.column_stack([xs, ys]).T)
    np.testing.assert_array_equal(yr[order_r], ys[order_e])
    np.testing.assert_allclose(xr[order_r], xs[order_e], atol=1e-6)
    real = run["x"].astype(np.float32)
    clipped, _ = clipping.preprocess(run["x"], "none", 1.0)
    for private in (real, clipped.astype(np.float32)):
        dist = np.min(np.linalg.norm(xr[:, None, :] - private[None], axis=2))
        assert dist > 1e-4  # no private record is copied into the release


def test_every_noise_draw_is_a_registered_mechanism(expected):
    assert_draws_registered(expected["ledger"], expected["noise"].draws)


def assert_draws_registered(ledger, draws) -> None:
    """Every draw is made under a registered mechanism with its sigma, and
    every mechanism is drawn as often as it is accounted."""
    names = {m.name for m in ledger.mechanisms}
    drawn = {}
    for key, sigma, _ in draws:
        # A second-moment matrix is one mechanism drawn in two parts:
        # sigma on its diagonal, sigma / sqrt(2) off it (see generator.py).
        name, _, part = key.partition("#")
        assert name in names, f"noise drawn under unregistered name {key}"
        scale = math.sqrt(2) if part == "off-diagonal" else 1.0
        assert sigma == pytest.approx(ledger.get(name).sigma / scale), key
        if part != "off-diagonal":
            drawn[name] = drawn.get(name, 0) + 1
    assert set(drawn) == names  # every registered mechanism is used ...
    for name, times in drawn.items():  # ... as often as it is accounted
        assert times == ledger.get(name).count, name


# ------------------------------------------------- exact values: nowhere

def _without_file_digests(manifest_text: str) -> str:
    """The manifest without its ``files`` block: each release file's size
    and sha256 (tagged "dp" in FIELDS) are numbers and hex digits of any
    value, which a scan for exact counts would match by chance (a 900-byte
    summary file beside a class of 900 rows)."""
    doc = json.loads(manifest_text)
    doc.pop("files", None)
    return json.dumps(doc, indent=1, sort_keys=True)


def _texts(run) -> dict[str, str]:
    """Every output file (text or decoded arrays) plus logs and stdout."""
    out = run["out"]
    texts = {}
    for base, _, names in os.walk(out):
        for name in names:
            path = Path(base) / name
            if name == "_manifest.json":  # its "files" block: see below
                texts[name] = _without_file_digests(path.read_text())
            elif name.endswith(".json"):
                texts[name] = path.read_text()
            elif name.endswith(".npz"):
                with np.load(path) as z:
                    texts[name] = " ".join(
                        " ".join(repr(float(v)) for v in np.ravel(z[k]))
                        for k in z.files)
            else:
                texts[name] = path.read_bytes().decode("latin-1")
    texts["logs"] = "\n".join(f"{n}: {m}" for n, m in run["logs"]
                              if n != OPERATOR)
    texts["stdout"] = run["stdout"]
    texts["stderr"] = "\n".join(l for l in run["stderr"].splitlines()
                                if not _PROGRESS.match(l))
    return texts


# Progress lines of a running job (16.2): the pass (and, on a terminal
# only, the elapsed time: this captured console is not one). The
# exact rows read so far appear only with the operator's --show-row-counts
# (schedulers forward the console to shared task logs); logged under their
# own logger and never written to any release file.
OPERATOR = "dpsynth.operator"
_PROGRESS = re.compile(
    r"^dpsynth: (\[\d+:\d\d\] )?(pass\b|pipeline finished$|running$)")


def test_operator_progress_stays_on_the_console(run):
    progress = [m for n, m in run["logs"] if n == OPERATOR]
    assert any("pass" in m for m in progress)
    assert not any("rows read" in m for m in progress)  # opt-in only
    console = [l for l in run["stderr"].splitlines() if _PROGRESS.match(l)]
    assert len(console) == len(progress)
    assert not any(l.startswith("dpsynth: [") for l in console)  # no clock
    for path in Path(run["out"]).rglob("*"):
        if path.is_file() and path.suffix == ".json":
            assert "rows read" not in path.read_text()


def _scrub(text: str, run) -> str:
    """Removes paths, the run id and version folder names (random hex:
    all digits now and then), whose digits are not data."""
    from dpsynth.pipelines.release.release import VERSION_PREFIX
    text = text.replace(str(run["tmp"]), "<tmp>")
    text = re.sub(rf"{re.escape(VERSION_PREFIX)}[0-9a-f]+", "<version>", text)
    return text.replace(run["manifest"]["run_id"], "<run-id>")


def _int_token(value: int) -> re.Pattern:
    return re.compile(rf"(?<![\d.]){value}(\.0+)?(?![\d])")


def test_exact_counts_appear_nowhere(run, expected):
    priv = expected["private"]
    exact = [*priv["sizes"], priv["n"], priv["clipped"]]
    for where, text in _texts(run).items():
        if not where.endswith((".json", ".npz")) and where not in (
                "logs", "stdout", "stderr"):
            continue  # TFRecord bytes: checked as floats above
        text = _scrub(text, run)
        for value in exact:
            assert not _int_token(value).search(text), \
                f"exact private count {value} found in {where}"


def test_schema_file_is_public_configuration(run, expected):
    from dpsynth.transforms.write import release_schema
    schema = json.loads((release_dir(run["out"]) / "_schema.json").read_text())
    assert schema == json.loads(json.dumps(release_schema(expected["cfg"],
                                                          DIM)))


def test_report_page_shows_no_exact_count(run, expected, tmp_path):
    """`dpsynth report` reads the release only: its page (numbers in text
    and tables; the charts are drawn from the same values) holds no exact
    class size, n or clipped count."""
    page = tmp_path / "page"
    assert cli.main(["report", str(run["out"]), "--output", str(page)]) == 0
    text = (page / "index.html").read_text()
    text = re.sub(r"data:image/png;base64,[^\"]+", "", text)
    text = re.sub(r"\d{8}T\d{6}Z|\d{4}-\d\d-\d\d \d\d:\d\d", "", text)
    text = _scrub(text, run)
    priv = expected["private"]
    for value in [*priv["sizes"], priv["n"], priv["clipped"]]:
        assert not _int_token(value).search(text), \
            f"exact private count {value} in the report page"
    assert f"{run['manifest']['samples_total']:,}" in text


def test_exact_sums_and_means_appear_nowhere(run, expected):
    """Text outputs: no exact value in any rendering down to 4 decimals.
    Arrays (gmm.npz: thousands of floats, where a 4-decimal substring
    matches by chance): no value equal to an exact one to 1e-9."""
    priv = expected["private"]
    exact = np.array([v for vec in priv["sums"] + priv["means"] for v in vec
                      if v != 0])
    needles = set()
    for v in exact:
        needles |= {repr(float(v)), f"{v:.6g}", f"{v:.4f}"}
    texts = _texts(run)
    for where, text in texts.items():
        if where.endswith(".npz"):
            continue
        text = _scrub(text, run)
        found = [n for n in needles if len(n) >= 5 and n in text]
        assert not found, f"exact private aggregate {found} in {where}"
    for path in Path(run["out"]).rglob("*.npz"):
        with np.load(path) as z:
            for key in z.files:
                values = np.ravel(z[key]).astype(np.float64)
                close = np.isclose(values[:, None], exact[None, :],
                                   rtol=1e-9, atol=0).any(axis=1)
                assert not close.any(), \
                    f"exact private aggregate in {path.name}[{key}]"


# --------------------------------------------------- logs: numbers review

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])")


def _allowed_numbers(run) -> list[float]:
    m = run["manifest"]
    values = [float(v) for p, v in _leaves(m)
              if isinstance(v, (int, float)) and not isinstance(v, bool)
              and _tag(p) in ("public", "dp")]
    values += [len(m["privacy"]["mechanisms"]),
               sum(max(c["noisy_count"], 0) for c in m["classes"])]
    # The summary's budget shares by stage: a function of the plan.
    from dpsynth.pipelines.release.summary import stage_shares
    values += [100 * v for v in stage_shares(m["privacy"]["mechanisms"])
               .values()]
    return values


def _explained(token: str, allowed: list[float]) -> bool:
    """The token is some allowed value printed at the token's precision."""
    value = float(token)
    mantissa = token.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(token.lower().split("e")[1]) if "e" in token.lower() else 0
    tol = 0.5 * 10.0 ** (exponent - decimals) * (1 + 1e-9)
    return any(abs(value - a) <= tol for a in allowed)


def test_every_number_in_our_logs_is_public_or_dp(run):
    allowed = _allowed_numbers(run)
    ours = [(n, m) for n, m in run["logs"]
            if n.startswith("dpsynth") and n != OPERATOR]
    lines = [m for _, m in ours] + run["stdout"].splitlines()
    assert any("release:" in l for l in lines)
    for line in lines:
        clean = _scrub(line, run)
        for token in _NUMBER.findall(clean):
            assert _explained(token, allowed), \
                f"number {token} in log line {line!r} is not public/DP"


def test_other_loggers_say_nothing_about_the_data(run, expected):
    """Beam/TF records (any level) hold no exact private count or sum."""
    priv = expected["private"]
    others = "\n".join(_scrub(m, run) for n, m in run["logs"]
                       if not n.startswith("dpsynth"))
    for value in [*priv["sizes"], priv["n"], priv["clipped"]]:
        assert not _int_token(value).search(others), value


# -------------------------------------------------- static source guard

LOG_METHODS = {"debug", "info", "warning", "warn", "error", "exception",
               "critical", "log"}
# Reviewed operator diagnostics in the encode stage (images -> embeddings):
# (file, first words of the message, verdict). Each names input files or
# folders, like bad-input errors do; none prints data values or aggregates.
REVIEWED_LOG_CALLS = {
    ("transforms/keyed_noise.py", "could not delete the noise key"):
        "launcher only, after a run: the key object's URI (operator's "
        "location, run id, random owner token) and the storage error; no "
        "data-dependent value",
    ("transforms/images.py", "unreadable image %s"):
        "encode only (no release): names one unreadable input file, like a "
        "bad-input error; generate --images skips them with no log line",
    ("transforms/encode.py", "encoder %s loaded in"):
        "encoder name, load time and pid: public/operational",
}


def _log_calls(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Name) and f.id == "print":
            yield node, "print"
        elif isinstance(f, ast.Attribute) and f.attr in LOG_METHODS:
            owner = ast.unparse(f.value)
            if re.search(r"log|LOG", owner) or owner == "warnings":
                yield node, owner + "." + f.attr
        elif isinstance(f, ast.Attribute) and f.attr == "write" and \
                ast.unparse(f.value) in ("sys.stdout", "sys.stderr"):
            yield node, ast.unparse(f.value) + ".write"


def test_no_logging_or_printing_in_dp_code():
    """dp_ops/ and transforms/ touch exact aggregates: they may only bump
    Beam counters (operator metrics), never log or print."""
    unreviewed = []
    for folder in ("dp_ops", "transforms"):
        for path in sorted((ROOT / folder).glob("**/*.py")):
            rel = str(path.relative_to(ROOT))
            for node, what in _log_calls(path):
                first = node.args[0] if node.args else None
                text = first.value if isinstance(first, ast.Constant) else ""
                if not any(rel == f and str(text).startswith(prefix)
                           for f, prefix in REVIEWED_LOG_CALLS):
                    unreviewed.append(f"{rel}:{node.lineno}: {what}("
                                      f"{ast.unparse(node)[:80]}...)")
    assert not unreviewed, ("log/print calls in DP code need a privacy "
                            "review:\n" + "\n".join(unreviewed))


def test_dp_ops_has_no_output_channel_at_all():
    """dp_ops/ (pure DP math) imports neither logging nor Beam, so it has no
    way to emit anything but its return values."""
    for path in sorted((ROOT / "dp_ops").glob("**/*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [
                    getattr(node, "module", None) or ""]
                assert not any(n.split(".")[0] in ("logging", "apache_beam",
                                                   "absl", "warnings")
                               for n in names), f"{path.name}: {ast.unparse(node)}"
