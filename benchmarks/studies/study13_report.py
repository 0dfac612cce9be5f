"""Tables of the issue-13 utility study from its JSON-lines logs.

    python benchmarks/studies/study13_report.py   # prints markdown tables

Reads benchmark-data/studies/utility_study-issue13.jsonl (generator runs),
dpsgd_bars-issue13.jsonl (DP-SGD on the same splits) and
gaussian_ceiling-<dataset>.json (noiseless ceilings). Cells are mean ±
std over seeds (count in brackets), validation accuracy in %.
"""

from __future__ import annotations

import collections
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "studies")
DATA = os.path.join(ROOT, "benchmark-data", "studies")  # the raw logs
EPS = (1.0, 2.0, 4.0, 8.0)


def read_jsonl(name: str) -> list:
    path = os.path.join(DATA, name)
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def cell(values: list) -> str:
    if not values:
        return "–"
    v = 100 * np.asarray(values)
    if len(v) == 1:
        return f"{v[0]:.1f} (1)"
    return f"{v.mean():.1f} ± {v.std(ddof=1):.1f} ({len(v)})"


def generator_table(rows: list, dataset: str, recipes: list,
                    tags=None, field: str = "accuracy",
                    eps: tuple = EPS) -> list:
    """recipes: (recipe name in the log, display name); tags: the runs
    to use (None: all); field: accuracy (probe) or mlp_accuracy."""
    acc = collections.defaultdict(list)
    seen = set()
    for r in rows:
        if r["dataset"] != dataset or (tags and r.get("tag") not in tags):
            continue
        if field not in r:
            continue
        key = (r["recipe"], r["epsilon"], r["seed"])
        if key in seen:  # a rerun of the same cell: keep the first
            continue
        seen.add(key)
        acc[(r["recipe"], r["epsilon"])].append(r[field])
    out = ["| generator | " + " | ".join(f"ε={e:g}" for e in eps) + " |",
           "|---|" + "---|" * len(eps)]
    for name, display in recipes:
        if not any((name, e) in acc for e in eps):
            continue
        out.append(f"| {display} | " + " | ".join(
            cell(acc.get((name, e), [])) for e in eps) + " |")
    return out


def bars_table(rows: list, dataset: str) -> list:
    acc = collections.defaultdict(list)
    for r in rows:
        if r["dataset"] != dataset or r["stage"] == "grid":
            continue
        acc[(r["stage"], r["model"], r["epsilon"])].append(r["accuracy"])
    names = [("best", "linear", "DP-SGD linear, tuned on validation "
              "(unaccounted)"),
             ("best", "mlp", "DP-SGD MLP, tuned on validation (unaccounted)"),
             ("default", "linear", "DP-SGD linear, library defaults"),
             ("default", "mlp", "DP-SGD MLP, library defaults"),
             ("private", "linear", "DP-SGD linear, privately tuned "
              "(Papernot-Steinke)"),
             ("private", "mlp", "DP-SGD MLP, privately tuned")]
    out = ["| DP-SGD | " + " | ".join(f"ε={e:g}" for e in EPS) + " |",
           "|---|" + "---|" * len(EPS)]
    for stage, model, display in names:
        if not any((stage, model, e) in acc for e in EPS):
            continue
        out.append(f"| {display} | " + " | ".join(
            cell(acc.get((stage, model, e), [])) for e in EPS) + " |")
    chosen = collections.defaultdict(set)
    for r in rows:
        if r["dataset"] == dataset and r["stage"] == "best":
            chosen[(r["model"], r["epsilon"])].add(
                f"batch {r['batch_size']}, {r['epochs']:g} epochs, "
                f"lr {r['learning_rate']:g}")
    if chosen:
        out.append("")
        out.append("Tuned grid points: " + "; ".join(
            f"{m} ε={e:g}: {', '.join(sorted(v))}"
            for (m, e), v in sorted(chosen.items())))
    return out


def ceiling_table(dataset: str) -> list:
    path = os.path.join(RESULTS, f"gaussian_ceiling-{dataset}.json")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        rows = json.load(fh)
    return (["| model (exact statistics, no noise) | validation % |",
             "|---|---|"]
            + [f"| {r['generator']} | {100 * r['validation_accuracy']:.1f} |"
               for r in rows])


def main() -> int:
    gen = read_jsonl("utility_study-issue13.jsonl")
    bars = read_jsonl("dpsgd_bars-issue13.jsonl")
    names = sorted({(r["dataset"], r["recipe"]) for r in gen})
    for ds in sorted({d for d, _ in names}):
        print(f"\n### {ds}\n")
        print("\n".join(ceiling_table(ds)))
        print()
        print("\n".join(bars_table(bars, ds)))
        print()
        print("\n".join(generator_table(
            gen, ds, [(n, n) for d, n in names if d == ds])))
    return 0


if __name__ == "__main__" and "--write" not in sys.argv:
    sys.exit(main())


# --------------------------------------------------------- the write-up

SECTIONS = {
    # dataset -> [(tags, recipe, display)]
    "exact": [
        ("20news", None, "defaults", "issue-8 defaults (engine)"),
        ("20news", None, "exact sum", "… sums without noise"),
        ("20news", None, "exact cov", "… second moment without noise"),
        ("20news", None, "exact count", "… counts without noise"),
        ("cifar10", None, "defaults", "issue-8 defaults (engine)"),
        ("cifar10", None, "exact sum", "… sums without noise"),
        ("cifar10", None, "exact cov", "… second moment without noise"),
    ],
    "ideas-20news": [
        ("r1", "defaults", "issue-8 defaults: shared rank-128 + diag, sums 0.37"),
        ("r1", "sum.6", "sums 0.6 of mu^2 (budget split)"),
        ("r1", "sum.8", "sums 0.8"),
        ("r1", "eb", "empirical-Bayes shrinkage of the means"),
        ("svd-means", "defaults", "issue-8 defaults, rerun with this round's code"),
        ("svd-means", "defaults svd", "… + low-rank denoised means (Gavish-Donoho singular values)"),
        ("svd-means", "s06", "sums 0.6, this round's baseline"),
        ("svd-means", "s06 svd", "… + low-rank denoised means"),
        ("r1", "infl1", "+ mean-noise variance on the covariance"),
        ("ridge", "ridgeT.25", "+ isotropic ridge 0.25 tr(W)/d"),
        ("ridge", "ridgeT1", "+ isotropic ridge tr(W)/d"),
        ("dev", "shared full", "shared full rank, eigenvalues clipped at 0"),
        ("dev", "shared full ridge1", "… + ridge = noise edge (AdaSSP-like)"),
        ("dev", "per-class lowrank", "per-class d x d matrices (issue-8 mode)"),
        ("dev", "pooled js lowrank", "per-class, James-Stein towards pooled"),
        ("dev", "hier js full", "hierarchy global + class, JS weights"),
        ("subgrid", "sub64 raw s0.5", "class subspace r=64, raw, sums 0.5"),
        ("subgrid", "sub64 spectral s0.5", "… deviation shrunk by the noise edge"),
        ("subgrid", "sub32 raw s0.5", "class subspace r=32, raw"),
        ("subgrid", "sub16 raw s0.5", "class subspace r=16, raw"),
        ("kmeans", "old:issue-8 defaults", "issue-8 defaults (dp_ops), one component a class"),
        ("kmeans", "old:issue-8 defaults, k=2", "… 2 DP k-means components a class (tree + Lloyd in the ledger)"),
        ("kmeans", "old:issue-8 defaults, k=4", "… 4 components a class"),
        ("kmeans", "old:issue-8 defaults, k=8", "… 8 components a class"),
        ("pe", "sum.6 cov.27", "sums 0.6, cov 0.27 (PE's baseline)"),
        ("pe", "pe1 c64 var.25", "+ 1 PE round (64 candidates, vote 0.1)"),
        ("pe", "pe2 c64", "+ 2 PE rounds (64 candidates)"),
        ("pe", "pe2 c16", "+ 2 PE rounds (16 candidates)"),
    ],
    "ideas-cifar10": [
        ("cifar1", "defaults", "issue-8 defaults: shared rank-128 + diag"),
        ("cifar4", "sum.6", "sums 0.6 of mu^2"),
        ("cifar2", "per-class lowrank s.37", "per-class d x d (issue-8 mode)"),
        ("cifar1", "sub128 raw s.37", "class subspace r=128, raw"),
        ("cifar1", "sub128 spectral s.37", "… deviation shrunk by the noise edge"),
        ("cifar4", "sub128 raw s.6", "class subspace r=128, sums 0.6"),
    ],
}

# Section 8 (tag mlp-transfer): what each model reaches on the validation
# rows and on a 20 % hold-out of the synthetic rows.
TRANSFER = [
    ("ref:adaptive", "adaptive plan (defaults)"),
    ("ref:adaptive, shared forced", "shared covariance forced"),
    ("ref:adaptive, shared always", "shared covariance (also at ε=∞)"),
    ("ref:adaptive, spectral class deviation",
     "class deviations shrunk by the noise edge"),
]
TRANSFER_FIELDS = [
    ("accuracy", "logistic probe, validation rows"),
    ("mlp_accuracy", "paper's MLP, validation rows"),
    ("probe_synthetic_holdout", "logistic probe, synthetic hold-out"),
    ("mlp_synthetic_holdout", "paper's MLP, synthetic hold-out"),
]


def transfer_tables(rows: list, dataset: str) -> list:
    out = []
    for field, title in TRANSFER_FIELDS:
        out += [f"{title}:", ""]
        out += generator_table(rows, dataset, TRANSFER, {"mlp-transfer"},
                               field, EPS + (float("inf"),))
        out.append("")
    return out


FINAL = [
    ("old:issue-8 defaults", "issue-8 defaults (today)"),
    ("ref:adaptive", "**adaptive plan (the proposal)**"),
    ("ref:adaptive, fixed sum share", "… without the sum-share rule (0.40)"),
    ("ref:adaptive, no class subspace", "… without the class subspace"),
    ("ref:adaptive, class subspace always", "… class subspace at every s"),
    ("ref:adaptive, class modes for 2 classes", "… class modes also for K = 2"),
]


def section_table(rows: list, items: list) -> list:
    out = ["| generator | dataset | " + " | ".join(f"ε={e:g}" for e in EPS)
           + " |", "|---|---|" + "---|" * len(EPS)]
    for ds, tag, recipe, display in items:
        t = generator_table(rows, ds, [(recipe, display)],
                            None if tag is None else {tag})
        if len(t) > 2:
            out.append(t[2].replace(f"| {display} |",
                                    f"| {display} | {ds} |", 1))
    return out


def beam_table(rows: list) -> list:
    """The Beam job (benchmarks/studies/adaptive_beam.py): one line per
    (dataset, epsilon, mode), validation accuracy and wall times in the
    order they ran (with the 1-minute load average)."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["epsilon"], r["mode"]), []).append(r)
    out = ["| dataset | ε | `--covariance` | structure that ran | validation % "
           "| wall s (load) |", "|---|---|---|---|---|---|"]
    for (ds, eps, mode), rs in sorted(groups.items()):
        accs = sorted({r["val_accuracy"] for r in rs})
        walls = ", ".join(f"{r['wall_s']:.1f} ({r['load']:.0f})" for r in rs)
        out.append(f"| {ds} | {eps:g} | {mode} | {rs[0]['structure']} | "
                   f"{' / '.join(f'{a:.1f}' for a in accs)} | {walls} |")
    return out


def write_md(path: str) -> None:
    gen = read_jsonl("utility_study-issue13.jsonl")
    bars = read_jsonl("dpsgd_bars-issue13.jsonl")
    with open(os.path.join(os.path.dirname(__file__), "study13_text.md")) as fh:
        text = fh.read()
    blocks = {}
    for ds in ("20news", "cifar10"):
        blocks[f"CEILING-{ds}"] = "\n".join(ceiling_table(ds))
        blocks[f"BARS-{ds}"] = "\n".join(bars_table(bars, ds))
    blocks["EXACT"] = "\n".join(section_table(gen, SECTIONS["exact"]))
    for key in ("ideas-20news", "ideas-cifar10"):
        ds = key.split("-", 1)[1]
        blocks[key.upper()] = "\n".join(section_table(
            gen, [(ds, t, r, s) for t, r, s in SECTIONS[key]]))
    final_tags = {"20news": {"ref2"}, "cifar10": {"cifar3", "cifar1"},
                  "cifar-catdog": {"refproxy2"}, "20news-binary": {"refproxy2"}}
    for ds, tags in final_tags.items():
        blocks[f"FINAL-{ds}"] = "\n".join(generator_table(gen, ds, FINAL, tags))
    for ds in ("20news", "cifar10"):
        blocks[f"MLP-{ds}"] = "\n".join(generator_table(
            gen, ds, FINAL[:2], {"mlp1"}, "mlp_accuracy"))
    for ds in ("20news", "cifar10"):
        blocks[f"TRANSFER-{ds}"] = "\n".join(transfer_tables(gen, ds))
    blocks["BEAM"] = "\n".join(beam_table(
        read_jsonl("adaptive_beam-issue13.jsonl")))
    for key, table in blocks.items():
        text = text.replace("{{" + key + "}}", table)
    with open(path, "w") as fh:
        fh.write(text)
    print(f"wrote {path}")


if __name__ == "__main__" and "--write" in sys.argv:
    write_md(os.path.join(RESULTS, "utility_study-issue13.md"))
    sys.exit(0)
