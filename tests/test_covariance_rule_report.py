"""The issue-53 report of the covariance sweep
(``covariance_sweep.issue53_report``): the rule's pick is read from each
run's recorded public inputs, marked in its row, and its gap is to the
best structure measured, spiked class matrices included."""

from benchmarks.studies import covariance_sweep as sweep

MU = {1.0: 0.268, 8.0: 1.666}  # gdp_mu(eps, 1e-5)


def _records(shape, d, counts, acc):
    """acc: {eps: {mode: accuracy}}, the same for seeds 0-2."""
    out = []
    for eps, by_mode in acc.items():
        for seed in sweep.SEEDS:
            for mode, a in by_mode.items():
                out.append({"shape": shape, "mode": mode, "epsilon": eps,
                            "seed": seed, "accuracy": a, "d": d,
                            "classes": len(counts), "mu": MU[eps],
                            "noisy_counts": counts})
    return out


def test_the_report_marks_the_pick_and_measures_its_gap():
    # CIFAR-10-sized public inputs: shared at eps 1, spiked per-class at 8
    modes = lambda s, sub, pc, spk: {  # noqa: E731
        "shared": s, "subspace": sub, "per-class": pc, sweep.SPIKED: spk}
    recs = _records("cifar10-full", 1280, [5000.0] * 10,
                    {1.0: modes(0.75, 0.76, 0.74, 0.73),
                     8.0: modes(0.76, 0.77, 0.79, 0.78)})
    recs += _records("k10-n5000-d1280-class", 1280, [5000.0] * 10,
                     {1.0: modes(0.22, 0.21, 0.18, 0.19),
                      8.0: modes(0.33, 0.33, 0.29, 0.21)})
    text = sweep.issue53_report(recs)
    rows = [line for line in text.splitlines()
            if line.startswith("| cifar10-full")]
    assert rows == [
        "| cifar10-full | 1 | **75.00** | 76.00 | 74.00 | 73.00 | shared | 1.00 |",
        "| cifar10-full | 8 | 76.00 | 77.00 | 79.00 | **78.00** | "
        "per-class+spiked | 1.00 |"]
    assert "k10-n5000-d1280-class |" not in text  # simulated: summary only
    assert "Largest gap on the simulated sweep: 12.00 points " \
           "(k10-n5000-d1280-class, eps 8" in text
    assert "Drops of the pick's 3-seed mean as epsilon grows: 1; " \
           "k10-n5000-d1280-class 1->8 (-1.00)" in text
