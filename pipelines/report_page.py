"""The release report of `dpsynth report RELEASE`: one self-contained
HTML page (plus its PNGs), built here; ``dpsynth.pipelines.cli.report``
parses the command's flags and prints.

The page shows where the privacy budget went (by stage and by mechanism,
drawn, in the spirit of PipelineDP's explain-computation report), the
noisy class sizes, a 2-D projection of the synthetic rows coloured by
class, how to read the release (schema, normalisation, covariance rank),
its configuration, and the ``dpsynth evaluate`` table when one is named.

Everything comes from the release alone (manifest.json, summary.json,
gmm.npz, the data shards): public configuration and DP outputs, so the
page is as shareable as the release. The one exception is the evaluate
table, computed on the real data (NOT DP): it is embedded only when the
user names its file (``--evaluation FILE``; no file is ever picked up by
itself), and then the page header, the section and the console say so.
A release that is not DP itself (seeded noise, epsilon=inf, or a manifest
with ``"private": false``) gets a red banner at the top of the page.
The page needs no network: images are embedded as data: URIs, there is no
external script, style sheet or font.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import html
import io as stdio
import json
import math
import os
import re
import shutil
import tempfile
from typing import Optional, Sequence

import numpy as np

PAGE = "index.html"
MAX_POINTS = 5000
# The marking of real-data (non-DP) numbers: page header, section, console.
NOT_DP_EVALUATION = ("computed on the real (private) data: NOT differentially "
                     "private — do not publish this page with them")
# What each stage releases (the page's explanation, one line per stage).
STAGE_NOTES = {
    "centre": "noisy sum and count of all rows: the DP centre subtracted "
              "before clipping",
    "tree": "noisy node counts of the LSH prefix tree (DP k-means coreset)",
    "lloyd": "noisy per-cluster counts and sums of the DP Lloyd rounds",
    "moments": "noisy per-cluster counts and sums of the clipped rows: "
               "mixture weights and means (and Σx² for a diagonal mixture)",
    "covariance": "noisy second-moment matrix Σxxᵀ of the clipped rows: "
                  "the covariance factors",
    "vote": "noisy nearest-neighbour vote histogram of the candidates",
    "count": "noisy row count of each class (--covariance auto, phase 1): "
             "the public rule picks the covariance structure from them",
    "class-covariance": "each class's noisy second moment (d x d, or r x r "
                        "inside the shared covariance's top subspace): "
                        "the class's own covariance factors",
}


class ReportError(ValueError):
    """Bad flag or output path: one line, nothing written."""


# ---------------------------------------------------------------- output

def default_output(release: str) -> str:
    name = release.rstrip("/")
    if "://" in name:  # remote release: the page goes to the working dir
        return os.path.basename(name) + "-report"
    return name + "-report"


def check_output(output: str, overwrite: bool) -> None:
    """Refuses, before anything is read, an output we must not clobber."""
    if "://" in output:
        raise ReportError(f"--output {output}: the report is written to a "
                          f"local directory; copy it afterwards")
    if os.path.isfile(output):
        raise ReportError(f"--output {output} is a file; choose a directory")
    if os.path.isdir(output) and os.listdir(output) and not overwrite:
        raise ReportError(f"--output {output} exists and is not empty; pass "
                          f"--overwrite to replace it")


def write_atomically(output: str, files: dict[str, bytes]) -> None:
    """Writes ``files`` into a temporary sibling directory, then renames it
    to ``output`` (replacing an old report): complete or absent."""
    output = os.path.abspath(output)
    parent = os.path.dirname(output)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(output)}.tmp-",
                           dir=parent)
    old = None
    try:
        for name, data in files.items():
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(data)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if os.path.exists(output):
            old = tmp + ".old"
            os.rename(output, old)
        os.rename(tmp, output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old and not os.path.exists(output):
            os.rename(old, output)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------- reading

@dataclasses.dataclass
class Release:
    path: str
    manifest: dict
    summary: list
    gmm: Optional[object]  # dpsynth.models.gmm.MixtureRelease


def read_release(path: str) -> Release:
    from dpsynth.pipelines.release import reading, release
    from dpsynth.transforms import io
    manifest = release.read_manifest(path)
    summary = manifest.get("classes", [])
    try:
        from apache_beam.io.filesystems import FileSystems
        root = release.release_root(path, manifest)
        name = manifest.get("outputs", {}).get("summary", "summary.json")
        with FileSystems.open(io.join(root, name)) as f:
            summary = json.loads(f.read().decode())
    except Exception:  # older or partial layouts: the manifest's copy
        pass
    try:
        gmm = reading.load_gmm(path)
    except Exception:
        gmm = None
    return Release(path, manifest, summary, gmm)


def sample_rows(rel: Release, max_points: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """A uniform subsample of at most ``max_points`` synthetic rows, read
    block by block (memory bounded by the sample, whatever the release
    size): every row gets a random key, the smallest keys are kept."""
    from dpsynth.pipelines.release import reading
    rng = np.random.default_rng(seed)
    keys = np.zeros(0)
    xs = np.zeros((0, rel.manifest.get("embedding_dim", 0)))
    ys = np.zeros(0, np.int64)
    for _, x, y in reading.release_blocks(rel.path, rel.manifest):
        keys = np.concatenate([keys, rng.random(len(y))])
        xs = np.vstack([xs, x]) if len(xs) else np.asarray(x, np.float64)
        ys = np.concatenate([ys, y])
        if len(keys) > max_points:
            keep = np.argpartition(keys, max_points)[:max_points]
            keys, xs, ys = keys[keep], xs[keep], ys[keep]
    order = np.argsort(keys, kind="stable")
    return xs[order], ys[order]


def pca_2d(x: np.ndarray, extra: Optional[np.ndarray] = None
           ) -> tuple[np.ndarray, Optional[np.ndarray], np.ndarray]:
    """Rows (and ``extra`` rows, e.g. the mixture means) on the top two
    principal axes of ``x`` (numpy SVD); returns the explained variance
    ratios too."""
    mean = x.mean(axis=0)
    _, s, vt = np.linalg.svd(x - mean, full_matrices=False)
    axes = vt[:2].T
    if axes.shape[1] < 2:  # one-dimensional data: a flat second axis
        axes = np.hstack([axes, np.zeros((x.shape[1], 2 - axes.shape[1]))])
    var = s ** 2
    ratio = var[:2] / var.sum() if var.sum() > 0 else np.zeros(2)
    proj = lambda a: (a - mean) @ axes
    return proj(x), (proj(extra) if extra is not None else None), ratio


def find_evaluation(rel: Release, flag: Optional[str]) -> Optional[tuple[str, dict]]:
    """(path, report) of the `dpsynth evaluate` JSON named by --evaluation.

    Only an explicitly named file is read: its numbers come from the real
    data (not DP), so picking one up from the working directory or next
    to the release would put them on a page meant to be shared."""
    if not flag:
        return None
    run_id = rel.manifest.get("run_id")
    try:
        with open(flag) as f:
            doc = json.load(f)
    except (OSError, ValueError) as err:
        raise ReportError(f"--evaluation {flag}: cannot read it as JSON "
                          f"({err})") from None
    if not isinstance(doc, dict) or "synthetic_trained" not in doc:
        raise ReportError(f"--evaluation {flag}: not a `dpsynth "
                          f"evaluate` report (no 'synthetic_trained')")
    theirs = (doc.get("synthetic") or {}).get("run_id")
    if theirs and run_id and theirs != run_id:
        raise ReportError(f"--evaluation {flag} evaluates run {theirs}, "
                          f"but {rel.path} is run {run_id}")
    return flag, doc


def not_private_reason(manifest: dict) -> Optional[str]:
    """Why the release itself is not DP, or None when nothing says so.

    Not DP: ``"private": false``, or noise that is ``seeded`` (reproducible
    from a secret seed: reused on neighbouring data, it cancels) or
    ``none`` (epsilon=inf). The manifest's own "NOT PRIVATE" warnings give
    the reason when present."""
    noise = str(manifest.get("noise") or "")
    flagged = manifest.get("private") is False
    if not (flagged or noise.startswith(("seeded", "none"))):
        return None
    stated = [re.sub(r"^NOT PRIVATE\s*(?:[:.—–-]\s+)?", "", str(w))
              for w in _warnings(manifest)
              if str(w).startswith("NOT PRIVATE")]
    if any(stated):
        return " ".join(w for w in stated if w)
    if noise.startswith("none"):
        return "no noise was added (epsilon=inf)"
    if noise.startswith("seeded"):
        return ("its noise was drawn from a secret seed (--noise-seed); "
                "the same seed used on neighbouring data cancels the noise")
    return 'its manifest marks it "private": false'


def _warnings(manifest: dict) -> list:
    warnings = manifest.get("warnings") or []
    return [warnings] if isinstance(warnings, str) else list(warnings)


# ---------------------------------------------------------- privacy cost

def partition_costs(mechanisms: Sequence[dict]) -> dict[str, float]:
    """Σ count / z² (z = σ / sensitivity) of what one record of each class
    can change: its own mechanisms plus the global ones (μ² of μ-GDP for
    Gaussian mechanisms; exact for the unsampled ones dpsynth uses)."""
    def cost(m):
        return m.get("count", 1) / m["noise_multiplier"] ** 2
    glob = sum(cost(m) for m in mechanisms if m["partition"] == "global")
    out: dict[str, float] = {}
    for m in mechanisms:
        if m["partition"] != "global":
            out[m["partition"]] = out.get(m["partition"], glob) + cost(m)
    return out or {"global": glob}


def worst_partition(mechanisms: Sequence[dict]) -> tuple[str, list[dict]]:
    """The class whose record costs most (it sets the ε spent) and the
    mechanisms that affect one of its records, each with its share."""
    costs = partition_costs(mechanisms)
    worst = max(sorted(costs), key=lambda p: costs[p])
    total = costs[worst]
    rows = []
    for m in mechanisms:
        if m["partition"] in (worst, "global"):
            share = m.get("count", 1) / m["noise_multiplier"] ** 2 / total
            rows.append(dict(m, share=share))
    rows.sort(key=lambda m: -m["share"])
    return worst, rows


def stage_shares(rows: Sequence[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in rows:
        out[m["stage"]] = out.get(m["stage"], 0.0) + m["share"]
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def planned_shares(manifest: dict) -> Optional[dict]:
    """Each stage's planned share of the budget: the adaptive plan's split
    (--covariance auto re-splits after its count phase), else the
    configured weights."""
    plan = manifest.get("adaptive_plan") or {}
    if plan.get("shares_of_mu2"):
        return dict(plan["shares_of_mu2"])
    return configured_weights(manifest.get("config", {}))


def configured_weights(config: dict) -> Optional[dict]:
    from dpsynth.dp_ops.config import GeneratorConfig
    try:
        conf = dict(config)
        conf["labels"] = tuple(conf["labels"])
        return GeneratorConfig(**conf).weights()
    except Exception:  # an older manifest: no weights column
        return None


# ----------------------------------------------------------------- plots

def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("dpsynth report needs matplotlib: pip install "
                          "'matplotlib>=3.7'") from None
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _png(fig) -> bytes:
    buf = stdio.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _hbar(labels: Sequence[str], values: Sequence[float], title: str,
          xlabel: str, colour: str, notes: Optional[Sequence[str]] = None
          ) -> bytes:
    fig = _figure(7.5, 0.9 + 0.32 * max(len(labels), 2))
    ax = fig.add_subplot()
    pos = np.arange(len(labels))[::-1]
    ax.barh(pos, values, color=colour)
    ax.set_yticks(pos, labels, fontsize=8)
    for p, v, n in zip(pos, values, notes or [""] * len(values)):
        ax.text(v, p, f" {n}", va="center", fontsize=8)
    ax.set_xlim(0, max(values, default=1) * 1.25 or 1)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    return _png(fig)


def stage_note(share: float, planned: Optional[float]) -> str:
    """A bar's label: its share of the cost, and the planned share only
    where the two differ by more than half a point."""
    note = f"{100 * share:.1f} %"
    if planned is not None and abs(share - planned) > 0.005:
        note += f" (planned {100 * planned:.1f} %)"
    return note


def _who(partition: str) -> str:
    """'class=0' -> 'class 0' (the page's wording)."""
    return partition.replace("=", " ")


def plot_stages(shares: dict[str, float], planned: Optional[dict],
                partition: str) -> bytes:
    labels = list(shares)
    notes = [stage_note(shares[s], (planned or {}).get(s)) for s in labels]
    return _hbar(labels, [100 * v for v in shares.values()],
                 f"Share of the privacy cost by stage (a record of "
                 f"{_who(partition)}, the costliest class)",
                 "% of the privacy cost", "#4c72b0", notes)


def plot_mechanisms(rows: Sequence[dict], partition: str,
                    limit: int = 24) -> bytes:
    top = list(rows[:limit])
    labels = [m["name"] for m in top]
    values = [100 * m["share"] for m in top]
    if len(rows) > limit:
        labels.append(f"{len(rows) - limit} others")
        values.append(100 * sum(m["share"] for m in rows[limit:]))
    return _hbar(labels, values,
                 f"Share of the privacy cost by mechanism (a record of "
                 f"{_who(partition)})", "% of the privacy cost", "#dd8452",
                 [f"{v:.1f} %" for v in values])


def plot_class_sizes(summary: Sequence[dict]) -> bytes:
    fig = _figure(7.5, 3.2)
    ax = fig.add_subplot()
    labels = [str(c["label"]) for c in summary]
    pos = np.arange(len(labels))
    ax.bar(pos, [c.get("noisy_count", 0) for c in summary], color="#55a868",
           label="noisy class count (DP)")
    ax.plot(pos, [c.get("samples", 0) for c in summary], "k_", ms=14,
            mew=2, label="synthetic rows written")
    ax.set_xticks(pos, labels, fontsize=8)
    top = max([c.get("noisy_count", 0) for c in summary]
              + [c.get("samples", 0) for c in summary] + [1])
    ax.set_ylim(min([0] + [c.get("noisy_count", 0) for c in summary]),
                top * 1.3)
    ax.set_xlabel("class label")
    ax.set_ylabel("rows")
    ax.set_title("Noisy class sizes", fontsize=10)
    ax.legend(fontsize=8, loc="upper right", ncol=2)
    ax.grid(axis="y", alpha=0.3)
    return _png(fig)


def plot_projection(points: np.ndarray, labels: np.ndarray,
                    means: Optional[np.ndarray], mean_labels: Sequence[int],
                    ratio: np.ndarray) -> bytes:
    return _png(projection_figure(points, labels, means, mean_labels, ratio))


def projection_figure(points: np.ndarray, labels: np.ndarray,
                      means: Optional[np.ndarray], mean_labels: Sequence[int],
                      ratio: np.ndarray):
    from matplotlib import colormaps
    fig = _figure(7.5, 5.6)
    ax = fig.add_subplot()
    classes = sorted(set(labels.tolist()) | set(mean_labels))
    cmap = colormaps["tab10" if len(classes) <= 10 else "tab20"]
    colour = {c: cmap(i % cmap.N) for i, c in enumerate(classes)}
    for c in classes:
        mine = labels == c
        if mine.any():
            ax.scatter(points[mine, 0], points[mine, 1], s=5, alpha=0.5,
                       color=colour[c], label=str(c), linewidths=0)
    if means is not None and len(means):
        ax.scatter(means[:, 0], means[:, 1], s=70, marker="X",
                   c=[colour[c] for c in mean_labels], edgecolors="black",
                   linewidths=0.8)
        ax.scatter([], [], s=70, marker="X", c="white", edgecolors="black",
                   linewidths=0.8, label="DP mixture means")
    ax.set_xlabel(f"PC 1 ({100 * ratio[0]:.1f} % of variance)")
    ax.set_ylabel(f"PC 2 ({100 * ratio[1]:.1f} % of variance)")
    ax.set_title(f"{len(labels):,} synthetic rows, coloured by class",
                 fontsize=10)
    if classes:  # beside the axes: never over the points
        ax.legend(fontsize=7, markerscale=2,
                  ncol=1 if len(classes) <= 12 else 2, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                  title="class", title_fontsize=8)
    ax.grid(alpha=0.3)
    return fig


# ------------------------------------------------------------------ page

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
margin:0 auto;max-width:1000px;padding:1.5em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;
padding-bottom:.2em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.88em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f3f3f3}td.n{text-align:right;
font-variant-numeric:tabular-nums}
.cards{display:flex;flex-wrap:wrap;gap:.8em}.card{border:1px solid #ddd;
border-radius:6px;padding:.6em 1em;min-width:9em}.card b{display:block;
font-size:1.35em}.warn{background:#fff3cd;border:1px solid #e0c060;
padding:.6em 1em;border-radius:6px}.nondp{background:#fde2e1;
border:1px solid #d9534f;padding:.6em 1em;border-radius:6px}
.notprivate{background:#c9302c;color:#fff;border:2px solid #8b1e1b;
padding:.7em 1em;border-radius:6px;font-size:1.1em}
img{max-width:100%;height:auto;display:block;margin:.6em 0}
code{background:#f3f3f3;padding:0 .25em}.muted{color:#666;font-size:.9em}
"""

# Marks, after load, how many embedded images decoded (the browser test
# reads these attributes); the page needs no script otherwise.
_CHECK = """
window.addEventListener("load", function () {
  var ok = 0, broken = 0;
  document.querySelectorAll("img").forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { ok += 1; }
    else { broken += 1; console.error("report image failed: " + img.alt); }
  });
  document.documentElement.setAttribute("data-images-ok", ok);
  document.documentElement.setAttribute("data-images-broken", broken);
});
"""


def _e(value) -> str:
    return html.escape(str(value))


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞"
        return f"{value:.{digits}g}"
    return _e(value)


def _table(header: Sequence[str], rows: Sequence[Sequence], numeric=()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(
            f"<td class=n>{_num(v)}</td>" if i in numeric else f"<td>{_e(v)}</td>"
            for i, v in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _img(name: str, data: bytes, alt: str) -> str:
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    return f'<img src="{uri}" alt="{_e(alt)}" title="{_e(name)}">'


def _card(title: str, value: str) -> str:
    return f'<div class=card>{_e(title)}<b>{_e(value)}</b></div>'


def _privacy_section(manifest: dict, images: dict) -> str:
    privacy = manifest.get("privacy", {})
    mechs = privacy.get("mechanisms", [])
    target, spent = privacy.get("target", {}), privacy.get("spent", {})
    out = ["<h2 id=privacy>Privacy budget</h2><div class=cards>",
           _card("ε spent / target", f"{_num(spent.get('epsilon'))} / "
                 f"{_num(target.get('epsilon'))}"),
           _card("δ spent / target", f"{_num(spent.get('delta'))} / "
                 f"{_num(target.get('delta'))}"),
           _card("accountant", privacy.get("accountant", "-")),
           _card("mechanisms", str(len(mechs))), "</div>",
           f"<p>Neighbouring relation: <b>{_e(privacy.get('neighbouring_relation', '-'))}</b>. "
           f"Composition: {_e(privacy.get('composition', '-'))}. "
           f"Noise: {_e(manifest.get('noise', '-'))}.</p>"]
    if "privacy-by-stage.png" in images:
        out.append(_img("privacy-by-stage.png", images["privacy-by-stage.png"],
                        "privacy cost by stage"))
        out.append(_img("privacy-by-mechanism.png",
                        images["privacy-by-mechanism.png"],
                        "privacy cost by mechanism"))
        out.append(
            "<p><b>How to read the bars.</b> Each mechanism releases one "
            "noisy statistic (a sum, a count) with Gaussian noise. Its "
            "privacy cost grows as 1/z², where the <i>noise multiplier</i> "
            "z = σ / sensitivity is the noise's size relative to the most "
            "one record can change that statistic: more noise, less cost. "
            "One record changes the global mechanisms and those of its own "
            "class; their costs add up, and the class whose records cost "
            "most sets the ε spent. The bars split that class's total cost "
            "(100 %) between stages and mechanisms. <i>Planned</i> is the "
            "share the budget split (<code>--budget-weights</code>, or the "
            "adaptive plan of <code>--covariance auto</code>) gave a stage; "
            "it is shown only where the cost differs from it. (In the "
            "accountant's terms: each mechanism is (1/z)-Gaussian DP and "
            "the total is μ = √Σ 1/z².)</p>")
    else:
        out.append("<p class=warn>No noise was added (σ = 0): the cost of "
                   "each mechanism is unbounded; nothing to draw.</p>")
    stages = sorted({m["stage"] for m in mechs})
    out.append(_table(["stage", "what it releases"],
                      [(s, STAGE_NOTES.get(s, "")) for s in stages]))
    rows = [(m["name"], m["stage"], m["partition"], m["sensitivity"],
             m["sigma"], m.get("noise_multiplier"), m.get("count", 1))
            for m in mechs]
    table = _table(["name", "stage", "partition (who it covers)",
                    "sensitivity (most one record changes)", "noise σ",
                    "noise multiplier z = σ / sensitivity",
                    "times released"], rows, numeric=(3, 4, 5, 6))
    # Closed: a long table would push the plots below it down the page.
    out.append(f"<details id=mechanisms><summary>All {len(rows)} mechanisms "
               f"(table)</summary>{table}</details>")
    out.append(_pipelinedp_details(manifest.get("pipelinedp")))
    return "".join(out)


def _pipelinedp_details(doc: Optional[dict]) -> str:
    """PipelineDP's own explanation of the aggregations it ran (the
    adaptive plan's per-class counts, sums and second moments)."""
    if not doc:
        return ""
    texts = "".join(f"<pre>{_e(t)}</pre>" for t in doc["explain_computation"])
    n = len(doc["explain_computation"])
    return (f"<details id=pipelinedp><summary>{n} aggregations ran through "
            f"PipelineDP {_e(doc['version'])} (its explanation)</summary>"
            f"{texts}</details>")


def _classes_section(rel: Release, images: dict) -> str:
    rows = [(c["label"], c.get("noisy_count"), c.get("samples"),
             c.get("components_with_mass", "-"), c.get("covariance_rank", "-"),
             len(c.get("shards", [])))
            for c in rel.summary]
    table = _table(["label", "noisy count", "synthetic rows",
                    "mixture components with weight > 0",
                    "covariance factors kept", "shards"], rows,
                   numeric=(1, 2, 3, 4, 5))
    return ("<h2 id=classes>Classes</h2>"
            + _img("class-sizes.png", images["class-sizes.png"],
                   "noisy class sizes")
            + "<p class=muted>Class sizes are released only as noisy counts "
              "(DP); the exact sizes are never written.</p>"
            + f"<details id=class-table><summary>Per-class table ({len(rows)}"
              f" classes)</summary>{table}</details>")


def _projection_section(images: dict, n: int, total: int,
                        normalize: Optional[str] = None) -> str:
    if "projection.png" not in images:
        return ("<h2 id=projection>Synthetic rows in 2-D</h2>"
                "<p>The release holds no rows.</p>")
    return ("<h2 id=projection>Synthetic rows in 2-D</h2>"
            + _img("projection.png", images["projection.png"],
                   "2-D projection of the synthetic rows")
            + f"<p class=muted>{n:,} of the {total:,} synthetic rows "
              f"(a uniform subsample) drawn on the two directions in which "
              f"they vary most (principal components, PCA); crosses: the "
              f"centres of the DP mixture's components (gmm.npz) on the "
              f"same axes.{_renormalised_note(normalize)} "
              f"Post-processing of the release only.</p>")


def _renormalised_note(normalize: Optional[str]) -> str:
    """The crosses and the dots are drawn at different steps when every
    sampled row is then rescaled to the sphere (``--normalize unit``)."""
    if normalize != "unit":
        return ""
    return (" The crosses are the means as the mixture holds them, before "
            "renormalisation; the rows are drawn after it (each sampled row "
            "is scaled to the sphere of --normalize unit), so the crosses "
            "sit inside the cloud of rows rather than on it.")


def _evaluation_section(found: Optional[tuple[str, dict]], release: str) -> str:
    head = "<h2 id=evaluation>Utility (dpsynth evaluate)</h2>"
    if found is None:
        return (head + "<p>No evaluation embedded: its numbers are "
                "computed on the real data (not DP), so one is shown only "
                "when named with <code>--evaluation FILE</code> (made by "
                f"<code>dpsynth evaluate --synthetic {_e(release)} "
                "--real-train … --real-test … --output FILE</code>), and "
                "the page is then not for publishing.</p>")
    path, doc = found
    syn, ceil = doc.get("synthetic_trained", {}), doc.get(
        "real_trained_ceiling", {})
    seeds = len(doc.get("protocol", {}).get("seeds", []))
    note = str(doc.get("privacy_note") or "").rstrip(". ")

    def cell(res):
        if not res:
            return "-"
        if "error" in res:
            return "error: " + res["error"]
        if seeds == 1:
            return f"{res['mean']:.4f}"
        return f"{res['mean']:.4f} ± {res['std']:.4f}"
    rows = [(m, cell(syn.get(m)), cell(ceil.get(m))) for m in syn]
    spread = ("1 seed" if seeds == 1 else
              f"mean ± sample std over {seeds} seeds")
    out = [head, f"<p class=nondp><b>The numbers of this section are "
           f"{_e(NOT_DP_EVALUATION)}.</b> "
           + (f"{_e(note)}. " if note else "") +
           f"Source: <code>{_e(path)}</code>.</p>",
           _table(["model", "trained on synthetic",
                   "trained on real (ceiling)"], rows),
           f"<p class=muted>Accuracy on real held-out test rows ({spread}) "
           f"of models trained on the synthetic rows, next to the same "
           f"models trained on the real train rows (what the data allows "
           f"without privacy).</p>"]
    dist = doc.get("distribution") or {}
    if dist.get("mean"):
        out.append(_distribution_table(dist))
    return "".join(out)


# The evaluate report's distribution metrics, in words: (key, name, how to
# read it). The reference column is real test rows scored the same way.
DISTRIBUTION_METRICS = (
    ("frechet", "Fréchet distance",
     "distance between Gaussian fits (mean, covariance) of the synthetic and "
     "the real train rows; 0 = same, lower is better"),
    ("precision", "k-NN precision",
     "share of synthetic rows that fall among real rows (inside a real row's "
     "k-nearest-neighbour radius): do they look real?"),
    ("recall", "k-NN recall",
     "share of real rows that fall among synthetic rows: do the synthetic "
     "rows cover the real variety?"),
    ("dcr_share_below_holdout_p05", "closer than real test rows",
     "share of synthetic rows closer to a real train row than the closest "
     "5 % of real test rows are: ≈ 0.05 without copying, 1 = copies"),
    ("dcr_share_closer_to_train", "nearer to train than to test",
     "share of synthetic rows nearer to the real train rows than to the "
     "real test rows: ≈ 0.5 without memorisation"),
    ("dcr_exact_copies", "exact copies",
     "synthetic rows identical to a real train row"),
)


def _distribution_table(dist: dict) -> str:
    mean, ref = dist["mean"], dist.get("real_test_reference") or {}
    rows = [(name, mean.get(key), ref.get(key, "-") if key in (
                "frechet", "precision", "recall") else "-", meaning)
            for key, name, meaning in DISTRIBUTION_METRICS if key in mean]
    return (_table(["distribution metric (mean over classes)",
                    "synthetic vs real train", "real test vs real train "
                    "(for scale)", "what it says"], rows, numeric=(1, 2))
            + "<p class=muted>Low precision with fair recall means the "
              "synthetic rows are spread wider than the real ones (the DP "
              "noise blurs each class) while still covering it.</p>")


def _reading_section(manifest: dict) -> str:
    outputs = manifest.get("outputs", {})
    out = ["<h2 id=reading>Reading the release</h2>"]
    feats = outputs.get("features") or {}
    if feats:
        out.append(f"<p>Format <b>{_e(outputs.get('format'))}</b>, files "
                   f"<code>{_e(outputs.get('files'))}</code>, described by "
                   f"<code>{_e(outputs.get('schema'))}</code>.</p>")
        out.append(_table(["feature", "dtype", "shape", "role"],
                          [(n, f.get("dtype"), f.get("shape"), f.get("role"))
                           for n, f in feats.items()]))
    norm = outputs.get("normalisation")
    if norm:
        out.append(f"<p><b>Normalise real inputs the same way</b> before "
                   f"mixing or comparing them with the synthetic rows: "
                   f"{_e(norm.get('apply_to_real_inputs'))} "
                   f"(<code>{_e(norm.get('python'))}</code>).</p>")
    cov = outputs.get("covariance")
    if cov:
        eff = cov.get("effective_rank", {})
        rank = (str(eff.get("min")) if eff.get("min") == eff.get("max")
                else f"{eff.get('min')}–{eff.get('max')}")
        why = cov.get("why_smaller")
        out.append(f"<p>Covariance: {_e(cov.get('mode'))}, requested rank "
                   f"{_e(cov.get('requested_rank'))}, effective rank "
                   f"<b>{_e(rank)}</b> ({_e(cov.get('stored_as'))})"
                   + (f": {_e(why)}" if why else "") + ".</p>")
    if len(out) == 1:
        out.append("<p>This release predates the outputs description; see "
                   "the configuration below.</p>")
    return "".join(out)


def _config_section(manifest: dict) -> str:
    config = manifest.get("config", {})
    rows = [(k, json.dumps(v)) for k, v in sorted(config.items())]
    inp = manifest.get("input", {})
    extra = [("input pattern", inp.get("pattern")),
             ("embedding dimension", manifest.get("embedding_dim")),
             ("versions", json.dumps(manifest.get("versions", {})))]
    return ("<h2 id=config>Configuration</h2>"
            + f"<details id=config-table><summary>All {len(rows + extra)} "
              f"settings (table)</summary>"
            + _table(["setting", "value"], rows + extra) + "</details>")


def render(rel: Release, images: dict, evaluation, sample_size: int) -> str:
    m = rel.manifest
    banners = []
    reason = not_private_reason(m)
    if reason:
        banners.append(f"<p class=notprivate id=not-private><b>This release "
                       f"is NOT differentially private: {_e(reason)}</b></p>")
    if evaluation is not None:
        banners.append(f"<p class=nondp id=real-data><b>This page embeds "
                       f"numbers {_e(NOT_DP_EVALUATION)}</b> (section "
                       f"<a href='#evaluation'>Utility</a>).</p>")
    warnings = "".join(f"<p class=warn>⚠ {_e(w)}</p>" for w in _warnings(m))
    total = m.get("samples_total", sum(c.get("samples", 0) for c in rel.summary))
    spent = m.get("privacy", {}).get("spent", {})
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        "<meta name=viewport content='width=device-width, initial-scale=1'>",
        f"<title>dpsynth release report: {_e(m.get('run_id', ''))}</title>",
        f"<style>{_CSS}</style><script>{_CHECK}</script></head><body>",
        "".join(banners), "<h1>dpsynth release report</h1>",
        f"<p class=muted>Release <code>{_e(rel.path)}</code>, run "
        f"<code>{_e(m.get('run_id'))}</code>, created "
        f"{_e(m.get('created_utc'))}. Report made "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC "
        + ("from the release and the evaluation named by --evaluation "
           "(real data)." if evaluation is not None else
           "from the release alone.") + "</p>",
        warnings, "<div class=cards>",
        _card("ε spent", _num(spent.get("epsilon"))),
        _card("δ", _num(spent.get("delta"))),
        _card("classes", str(len(rel.summary))),
        _card("synthetic rows", f"{total:,}"),
        _card("dimension", str(m.get("embedding_dim", "-"))),
        _card("format", m.get("outputs", {}).get("format", "tfrecord")),
        "</div>",
        _privacy_section(m, images),
        _classes_section(rel, images),
        _projection_section(images, sample_size, total, m.get(
            "outputs", {}).get("normalisation", {}).get("normalize")),
        _evaluation_section(evaluation, rel.path),
        _reading_section(m),
        _config_section(m),
        "<p class=muted>Generated by <code>dpsynth report</code>. Every "
        "number above is public configuration or "
        + ("an output of this release, which is NOT differentially private"
           if reason else "a DP output of the release")
        + ("; except the evaluate table: real data, NOT DP"
           if evaluation is not None else "")
        + ".</p></body></html>",
    ]
    return "\n".join(parts)


# ------------------------------------------------------------------ run

def build_report(rel: Release, evaluation, max_points: int, seed: int
                 ) -> dict[str, bytes]:
    """The page and its PNGs: {file name: bytes}."""
    images: dict[str, bytes] = {}
    mechs = rel.manifest.get("privacy", {}).get("mechanisms", [])
    if mechs and all(m.get("noise_multiplier") for m in mechs):
        worst, rows = worst_partition(mechs)
        images["privacy-by-stage.png"] = plot_stages(
            stage_shares(rows), planned_shares(rel.manifest), worst)
        images["privacy-by-mechanism.png"] = plot_mechanisms(rows, worst)
    images["class-sizes.png"] = plot_class_sizes(rel.summary)
    x, y = sample_rows(rel, max_points, seed)
    if len(y):
        means, mean_labels = None, []
        if rel.gmm is not None:
            parts = [(l, mix.means[mix.weights > 0])
                     for l, mix in sorted(rel.gmm.mixtures.items())]
            mean_labels = [l for l, mu in parts for _ in mu]
            means = np.vstack([mu for _, mu in parts]) if mean_labels else None
        points, mean_points, ratio = pca_2d(x, means)
        images["projection.png"] = plot_projection(points, y, mean_points,
                                                   mean_labels, ratio)
    page = render(rel, images, evaluation, len(y))
    return {PAGE: page.encode(), **images}
