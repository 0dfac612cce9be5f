"""Screenshot of `dpsynth report` on the demo release, for the README.

Runs the demo (`dpsynth generate`, seeded noise so the picture is
reproducible), `dpsynth evaluate` on the demo's real split (its default for
a demo release; skip with --no-evaluate: ~15 s), `dpsynth report`, loads the
page in headless Chromium and lays the page out in two columns, 65 % size,
256 colours. The long tables are collapsed on the page, as a reader first
sees it.

    nice -n 10 python benchmarks/report_screenshot.py

Result: benchmarks/results/report-screenshot.png
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULT = os.path.join(ROOT, "benchmarks", "results", "report-screenshot.png")


def screenshot(page: str, png: str, width: int = 1000,
               height: int = 6000) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit("needs chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--disable-quic", "--no-first-run",
                        "--disable-background-networking",
                        "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={profile}", "--hide-scrollbars",
                        f"--window-size={width},{height}",
                        f"--screenshot={png}", "file://" + page],
                       check=True, capture_output=True, timeout=120)


def two_columns(png: str, out: str, scale: float = 0.65) -> None:
    """The page split at a blank line near its middle, side by side."""
    from PIL import Image
    im = Image.open(png).convert("RGB")
    a = np.asarray(im)
    end = int(np.flatnonzero((a < 250).any(axis=(1, 2))).max()) + 30
    blank = np.flatnonzero((a >= 250).all(axis=(1, 2)))
    cut = int(blank[np.argmin(np.abs(blank - end // 2))])
    left, right = im.crop((0, 0, im.width, cut)), im.crop((0, cut, im.width, end))
    page = Image.new("RGB", (2 * im.width, max(left.height, right.height)),
                     "white")
    page.paste(left, (0, 0))
    page.paste(right, (im.width, 0))
    page = page.resize((int(page.width * scale), int(page.height * scale)),
                       Image.LANCZOS)
    page.quantize(colors=256, method=Image.Quantize.FASTOCTREE).save(
        out, optimize=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-evaluate", action="store_true")
    p.add_argument("--output", default=RESULT)
    args = p.parse_args(argv)
    from dpsynth.pipelines import cli
    work = tempfile.mkdtemp(prefix="report-screenshot-")
    try:
        release = os.path.join(work, "demo")
        assert cli.main(["generate", "--output", release, "--noise-seed", "1",
                         "--run-id", "demo"]) == 0
        if not args.no_evaluate:
            # A demo release: evaluate picks the demo's train/test split.
            assert cli.main(["evaluate", "--synthetic", release,
                             "--output", release + "-evaluation.json"]) == 0
        report = ["report", release]
        if not args.no_evaluate:  # embedded only when named explicitly
            report += ["--evaluation", release + "-evaluation.json"]
        assert cli.main(report) == 0
        shot = os.path.join(work, "page.png")
        screenshot(os.path.join(release + "-report", "index.html"), shot)
        two_columns(shot, args.output)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"screenshot written to {args.output} "
          f"({os.path.getsize(args.output) // 1024} KB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
