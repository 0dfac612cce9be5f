"""Encode-stage timing and quality on the shared CIFAR-10 JPEGs (../shared/data/cifar10-images).

For each DirectRunner worker count, runs `python -m dpsynth.pipelines.cli.encode` in a fresh process over all train+test
images (5,000 + 1,000, one job; a symlink tree ROOT/<class>/<split>-<file>.jpg keeps the split in the source
name) and reports wall time and images/s (start-up, model loading and writing included). Then:
  * determinism: max |difference| between the outputs of the different worker counts;
  * agreement with ../shared/data/cifar10-effnetlite0 (rows matched by class and file number; that file is
    float16, so differences up to ~4e-3 are rounding);
  * linear probe: StandardScaler + LogisticRegression fitted on the train split, accuracy on the test split.

    nice -n 10 python benchmarks/encode_speed.py                  # full run, ~10-20 min on 2 busy cores
    nice -n 10 python benchmarks/encode_speed.py --per-class 20   # quick check

Results: benchmarks/results/encode_speed.json (and printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
ROWS_PER_CLASS = {"train": 5000, "test": 1000}  # layout of cifar10-effnetlite0/{train,test}.npz


def build_tree(images: str, target: str, per_class: int | None) -> int:
    """Symlinks ROOT/<class>/<split>-<file> → the shared JPEGs; returns the image count."""
    count = 0
    for name in CLASSES:
        os.makedirs(os.path.join(target, name), exist_ok=True)
        for split in ("train", "test"):
            files = sorted(os.listdir(os.path.join(images, split, name)))
            for f in files[:per_class] if per_class else files:
                link = os.path.join(target, name, f"{split}-{f}")
                if not os.path.lexists(link):
                    os.symlink(os.path.join(images, split, name, f), link)
                count += 1
    return count


def encode(tree: str, output: str, encoder: str, workers: int, batch_size: int) -> float:
    cmd = [sys.executable, "-m", "dpsynth.pipelines.cli.encode", "--images", tree, "--encoder", encoder, "--output", output,
           "--batch-size", str(batch_size), "--keep-source-ids", "--runner=DirectRunner",
           f"--direct_num_workers={workers}",
           f"--direct_running_mode={'multi_processing' if workers > 1 else 'in_memory'}"]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"encode with {workers} worker(s) failed (rc={done.returncode})")
    # CPU time of the job and its worker processes: a load-independent cost measure on a shared machine.
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def split_rows(npz) -> dict:
    """{'train'|'test': (embeddings, labels, class names, file numbers)} from an encode output."""
    names = [os.path.basename(s) for s in npz["sources"]]
    split = np.array([n.split("-", 1)[0] for n in names])
    number = np.array([int(n.split("-", 1)[1][:4]) for n in names])
    out = {}
    for s in ("train", "test"):
        keep = split == s
        out[s] = (npz["embeddings"][keep], npz["labels"][keep], number[keep])
    return out


def compare_shared(parts: dict) -> dict:
    result = {}
    for s, (x, y, number) in parts.items():
        path = os.path.join(SHARED, "cifar10-effnetlite0", f"{s}.npz")
        if not os.path.exists(path):
            return {"skipped": f"{path} absent"}
        ref = np.load(path)
        assert list(ref["classes"]) == CLASSES
        rows = y * ROWS_PER_CLASS[s] + number
        diff = np.abs(x - ref["embeddings"][rows].astype(np.float32))
        result[s] = {"rows": int(len(rows)), "max_abs_diff": float(diff.max()),
                     "mean_abs_diff": float(diff.mean()),
                     "max_abs_value": float(np.abs(x).max())}
    return result


def probe(parts: dict, c_values=(0.001, 1.0)) -> dict:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler
    (xtr, ytr, _), (xte, yte, _) = parts["train"], parts["test"]
    scaler = StandardScaler().fit(xtr)
    out = {"train_rows": int(len(ytr)), "test_rows": int(len(yte))}
    for c in c_values:  # both reported; nothing is chosen on the test split
        clf = LogisticRegression(C=c, max_iter=2000).fit(scaler.transform(xtr), ytr)
        out[f"test_accuracy_C={c}"] = float((clf.predict(scaler.transform(xte)) == yte).mean())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", default=os.path.join(SHARED, "cifar10-images"))
    ap.add_argument("--encoder", default="efficientnet-lite0")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--per-class", type=int, default=None, help="images per class and split (default: all)")
    ap.add_argument("--work", default=os.path.join(ROOT, "benchmarks", "cache", "encode"))
    ap.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results", "encode_speed.json"))
    args = ap.parse_args(argv)
    if not os.path.isdir(args.images):
        print(f"skipped: {args.images} is absent (see ../shared/README.md)")
        return 0
    tree = os.path.join(args.work, f"tree-{args.per_class or 'all'}")
    n = build_tree(args.images, tree, args.per_class)
    runs, outputs = [], {}
    for workers in args.workers:
        output = os.path.join(args.work, f"emb-{args.per_class or 'all'}-w{workers}.npz")
        load_before = os.getloadavg()[0]
        wall, cpu = encode(tree, output, args.encoder, workers, args.batch_size)
        runs.append({"workers": workers, "images": n, "wall_s": round(wall, 1), "images_per_s": round(n / wall, 1),
                     "cpu_s": round(cpu, 1), "cpu_ms_per_image": round(1000 * cpu / n, 2),
                     "load_avg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]})
        print(json.dumps(runs[-1]), flush=True)
        outputs[workers] = np.load(output)
    first = outputs[args.workers[0]]
    determinism = {f"w{w}_vs_w{args.workers[0]}_max_abs_diff":
                   float(np.abs(o["embeddings"] - first["embeddings"]).max())
                   for w, o in outputs.items()
                   if w != args.workers[0] and list(o["sources"]) == list(first["sources"])}
    parts = split_rows(first)
    result = {"encoder": args.encoder, "batch_size": args.batch_size, "per_class": args.per_class,
              "cpu_count": os.cpu_count(), "load_avg_1m_at_end": os.getloadavg()[0],
              "machine": platform.platform(), "runs": runs, "determinism": determinism,
              "vs_shared_embeddings": compare_shared(parts) if args.encoder.startswith("efficientnet-lite0") else None,
              "probe": probe(parts)}
    print(json.dumps(result, indent=2))
    os.makedirs(os.path.dirname(args.results), exist_ok=True)
    with open(args.results, "w") as f:
        json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
