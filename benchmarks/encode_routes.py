"""The EfficientNet-Lite0 routes side by side: CPU cost per image and agreement, measured in one run.

Each route (`efficientnet-lite0` = ONNX Runtime, `-keras` = TensorFlow, `-torch` = PyTorch where installed) runs in
its own process, with one framework thread, on the same shared CIFAR-10 train images (already resized to 160x160):
a warm-up batch, then `--repeats` timed batches. CPU time of the process (not wall time) is the measure, so a busy
shared machine changes it little. Then: max |difference| between routes and against the shared float16 embeddings
(../shared/data/cifar10-effnetlite0; up to ~4e-3 there is float16 rounding). Ratios are against the default route.

    nice -n 10 python benchmarks/encode_routes.py            # ~1-3 min
Results: benchmarks/results/encode_routes.json (and printed). The end-to-end Beam job: benchmarks/encode_speed.py.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
ROUTES = ("efficientnet-lite0", "efficientnet-lite0-keras", "efficientnet-lite0-torch")


def shared_images(per_class: int) -> tuple[list[str], np.ndarray]:
    """The first `per_class` train JPEGs of each class and their rows in the shared embeddings."""
    images = os.path.join(SHARED, "cifar10-images", "train")
    classes = sorted(os.listdir(images))
    files, rows = [], []
    for c, name in enumerate(classes):
        for f in sorted(os.listdir(os.path.join(images, name)))[:per_class]:
            files.append(os.path.join(images, name, f))
            rows.append(c * 5000 + int(f[:4]))  # shared layout: class-major, 5000 rows a class, by file number
    return files, np.array(rows)


def measure(route: str, per_class: int, repeats: int, out: str) -> dict:
    """Runs in the child process: one route, one thread."""
    sys.path.insert(0, ROOT)
    from PIL import Image

    from dpsynth.models.encoders import get_encoder
    encoder = get_encoder(route, num_threads=1)
    encoder.check_available()
    files, _ = shared_images(per_class)
    batch = np.stack([encoder.prepare(np.asarray(Image.open(f).convert("RGB"))) for f in files])
    start = time.process_time()
    encode = encoder.load()
    load_cpu = time.process_time() - start
    embeddings = encode(batch)  # warm-up (graph tracing, allocator)
    start = time.process_time()
    for _ in range(repeats):
        embeddings = encode(batch)
    cpu = time.process_time() - start
    np.save(out, embeddings)
    return {"route": route, "images": len(files) * repeats, "load_cpu_s": round(load_cpu, 2),
            "cpu_ms_per_image": round(1000 * cpu / (len(files) * repeats), 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-class", type=int, default=10, help="train images per class (default 10: 100 images)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--routes", nargs="+", default=list(ROUTES))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results", "encode_routes.json"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.per_class, args.repeats, args.out)))
        return 0
    if not os.path.isdir(os.path.join(SHARED, "cifar10-images")):
        print(f"skipped: {SHARED}/cifar10-images is absent (see ../shared/README.md)")
        return 0
    runs, outputs = [], {}
    work = tempfile.mkdtemp(prefix="dpsynth-routes-")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    for route in args.routes:
        out = os.path.join(work, f"{route}.npy")
        done = subprocess.run([sys.executable, __file__, "--child", route, "--out", out, "--per-class",
                               str(args.per_class), "--repeats", str(args.repeats)],
                              capture_output=True, text=True, env=env)
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or ["?"])[-1]
            runs.append({"route": route, "skipped": reason})
        else:
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            outputs[route] = np.load(out)
        print(json.dumps(runs[-1]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    base = next((r for r in runs if "cpu_ms_per_image" in r), None)
    for r in runs:
        if base and "cpu_ms_per_image" in r:
            r["cpu_vs_" + base["route"]] = round(r["cpu_ms_per_image"] / base["cpu_ms_per_image"], 2)
    _, rows = shared_images(args.per_class)
    ref = np.load(os.path.join(SHARED, "cifar10-effnetlite0", "train.npz"))["embeddings"][rows].astype(np.float32)
    agreement = {f"{route}_vs_shared_max_abs_diff": float(np.abs(x - ref).max()) for route, x in outputs.items()}
    names = list(outputs)
    agreement.update({f"{a}_vs_{b}_max_abs_diff": float(np.abs(outputs[a] - outputs[b]).max())
                      for i, a in enumerate(names) for b in names[i + 1:]})
    result = {"per_class": args.per_class, "repeats": args.repeats, "threads": 1,
              "load_avg_1m_at_end": os.getloadavg()[0], "runs": runs, "agreement": agreement}
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
