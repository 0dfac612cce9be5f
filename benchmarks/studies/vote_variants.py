"""Issue 74, exploratory: vote variants the product does not ship, on a
validation split of a train file (``benchmarks/studies/vote_resample.py``'s split).

Replaces ``reference.sample_class`` for the vote with:
  share/over/s/ratio  vote share of mu^2 (0: no vote, the default release),
                      candidates per row (< 1 allowed here), s: redraw
                      "around the winners" x = mu + sqrt(1 - s^2)(c - mu) +
                      s (g - mu), g a fresh mixture draw (keeps the mixture's
                      covariance; s = 1 is the plain mixture), ratio: a > 0
                      weights votes by 1 / (votes of a public mixture sample
                      + a) (a hubness correction), spread: 1 rescales the
                      selected rows' deviations from the mean to the
                      candidates' total variance

    PYTHONPATH=. python benchmarks/studies/vote_variants.py 20news-minilm 0 \
        out.jsonl 8,1000 0/1/0 0.1/0.2/0.5 0.1/1/0/1
(args: dataset, train rows (0: all), output, epsilons, variants...)
"""

import dataclasses
import json
import sys
import time

import numpy as np

from benchmarks.studies import vote_resample as vr
from dpsynth.dp_ops import generator, sampling, vote
from benchmarks import reference
from dpsynth.dp_ops.config import GeneratorConfig
from dpsynth.dp_ops.noise import make_noise_source

PARAMS = {}


def sample_class(mix, x, cfg, ledger, noise, timings=None):
    if not cfg.vote_filter:
        return generator.sample(mix, cfg)
    n = generator.num_samples(mix, cfg)
    m = max(1, int(round(n * PARAMS["over"])))
    cands = generator.sample_rows(mix, cfg, m, 0, m)
    votes = vote.block_votes(x, generator.centred(cands, mix))
    noisy = generator.noisy_votes(votes, mix.label, ledger, noise)
    if PARAMS["ratio"]:  # public: votes of mixture draws, not of records
        ref = generator.sample_rows(
            mix, dataclasses.replace(cfg, seed=cfg.seed + 99991), n, 0, n)
        h0 = vote.block_votes(generator.centred(ref, mix),
                              generator.centred(cands, mix))
        noisy = np.clip(noisy, 0, None) / (h0 + PARAMS["ratio"])
    rng = np.random.default_rng([cfg.seed, mix.label, 3])
    rows = cands[np.repeat(np.arange(m), vote.resample_copies(noisy, n, rng))]
    if PARAMS.get("spread"):  # rescale deviations to the mixture's spread
        mu = (mix.weights[:, None] * mix.means).sum(0) / mix.weights.sum()
        want = np.sum((cands - cands.mean(0)) ** 2) / len(cands)
        got = np.sum((rows - rows.mean(0)) ** 2) / max(len(rows), 1)
        rows = mu + np.sqrt(want / max(got, 1e-300)) * (rows - mu)
        if cfg.normalize == "unit":
            rows = sampling.project_to_sphere(rows, cfg.sample_radius)
    s = PARAMS["s"]
    if s > 0:
        fresh = generator.sample_rows(mix, cfg, n + m, m, m + n)
        mu = (mix.weights[:, None] * mix.means).sum(0) / mix.weights.sum()
        rows = mu + np.sqrt(1 - s * s) * (rows - mu) + s * (fresh - mu)
        if cfg.normalize == "unit":
            rows = sampling.project_to_sphere(rows, cfg.sample_radius)
    return rows


def main(argv):
    reference.sample_class = sample_class
    args = type("A", (), {})()
    args.dataset, args.split = argv[0], "val"
    args.train_rows = int(argv[1]) or None
    x, y, xe, ye = vr.data(args)
    labels = sorted(np.unique(y).tolist())
    with open(argv[2], "a") as out:
        for eps in map(float, argv[3].split(",")):
            for seed in (0, 1):
                for spec in argv[4:]:
                    share, over, s, ratio, spread = map(
                        float, (spec + "/0/0").split("/")[:5])
                    PARAMS.update(over=over, s=s, ratio=ratio, spread=spread)
                    vf = share > 0
                    cfg = GeneratorConfig(
                        labels=tuple(labels), epsilon=eps, delta=vr.DELTA,
                        seed=seed, covariance="auto", vote_filter=vf,
                        **({"vote_share": share} if vf else {}))
                    t = time.time()
                    _, xs, ys, _, _ = reference.generate_adaptive(
                        x, y, cfg, make_noise_source(None))
                    acc = vr.probe(xs, ys, xe, ye, labels, seed)
                    rec = dict(eps=eps, seed=seed, spec=spec, rows=len(ys),
                               probe=round(100 * acc, 2),
                               s=round(time.time() - t, 1))
                    print(json.dumps(rec), flush=True)
                    out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
