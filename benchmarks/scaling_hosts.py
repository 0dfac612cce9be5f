"""``benchmarks/scaling.py --hosts 1,2`` (issue 52 item 5): the job on the
multi-host harness (``benchmarks/hosts.py``: a GCS emulator on a bridge, a
Dask scheduler and N single-threaded worker hosts, each in its own network
and mount namespace), reading ``--input gs://...`` and publishing to
``--output gs://...`` on the emulator.

One cluster serves the whole sweep: worker hosts are added as N grows, so
every N sees the same emulator, scheduler and input (hosts are killed as
N shrinks: `--repeat` runs the counts up, then down). Where the time goes:

* ``upload s`` / ``read s``: the input's bytes put into / read back out of
  the emulator by the launcher (the emulator's own I/O rate, once);
* from the job's own ``--record-timings``: ``job s`` (total), ``plan s``
  (before the pipelines: listing and sizing the input on gs://),
  ``pipeline s`` (the Beam pipelines on the hosts, phase 1 of the
  adaptive plan included) and ``launcher s`` = job - pipeline (plan,
  staging checks, publish: serial on the launcher; ``publish s`` alone: a
  copy made by the store, checked against the store's md5s, so no file's
  bytes pass through the launcher), each with its speed-up;
* CPU seconds during each run (``cpu_use``): the whole machine's, the
  emulator's, the worker hosts' and the scheduler's, and from them the
  most a run on N hosts could gain on this machine: it cannot end before
  its CPU seconds are spent on the machine's cores, so its speed-up is at
  most cores x T_1 / CPU_N (``cpu_bound``). The emulator is part of the
  storage service here and runs on the same cores as the hosts.

Needs root (namespaces): ``hosts.unavailable()`` says why not.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import platform
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional, Sequence

from benchmarks import hosts as harness
from benchmarks import scaling

TIMINGS = re.compile(r"wall times \(s, operator only, not DP\): (\{.*\})")


def job_command(args: argparse.Namespace, bucket: str, address: str,
                hosts: int, dim: int, repeat: int = 0) -> list[str]:
    """``dpsynth generate`` on the cluster at ``address``: the benchmark's
    flags, gs:// input and output, and the job's own step timings."""
    dim_flag = ([] if args.format == "npz" or args.files is None
                else ["--embedding-dim", str(dim)])
    return [sys.executable, "-m", "dpsynth.pipelines.cli", "generate",
            "--input", f"gs://{bucket}/in/part-*", *dim_flag,
            "--output", f"gs://{bucket}/out-h{hosts}-r{repeat}",
            *scaling._gen_flags(args), "--runner", "dask",
            f"--dask_client_address={address}", "--record-timings"]


def parse_timings(log: str) -> dict:
    """The last ``--record-timings`` line of a job's console ({} if none)."""
    found = TIMINGS.findall(log)
    return ast.literal_eval(found[-1]) if found else {}


def sweep_order(counts: Sequence[int], repeat: int) -> list[tuple[int, int]]:
    """(repeat, hosts) in run order: up the counts, then down, ... (ABBA:
    a warm-up or a slow spell of the shared machine is not all on one
    count)."""
    return [(rep, hosts) for rep in range(repeat)
            for hosts in (counts if rep % 2 == 0 else counts[::-1])]


def check_hosts(counts: Sequence[int]) -> list[int]:
    """The sorted host counts (one cluster grows through them)."""
    if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
        raise SystemExit(f"--hosts: distinct counts >= 1, got "
                         f"{','.join(map(str, counts))}")
    return sorted(counts)


def _storage(cluster: harness.Cluster):
    """A google-cloud-storage client on the cluster's emulator."""
    os.environ.update({k: v for k, v in cluster.launcher_env().items()
                       if k in ("STORAGE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT",
                                "NO_GCE_CHECK")})
    from google.cloud import storage
    return storage.Client(project=harness.EMULATOR_PROJECT)


def release_digest(client, bucket: str, out: str) -> Optional[str]:
    """One sha256 over the release's data files' and mixture's names and
    digests as its manifest lists them (the writers' own; no download):
    with --noise-seed every host count gives the same. None: no release."""
    blob = client.bucket(bucket).get_blob(f"{out}/_manifest.json")
    if blob is None:
        return None
    files = json.loads(blob.download_as_bytes()).get("files", {})
    listed = sorted((name, entry["sha256"]) for name, entry in files.items()
                    if not name.endswith(".json"))
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()


def stage_input(client, bucket: str, data: str) -> dict:
    """Uploads the data folder's files to gs://bucket/in/ and reads them
    back: seconds and bytes of each way."""
    files = sorted(f for f in os.listdir(data) if f.startswith("part-"))
    t0 = time.perf_counter()
    for name in files:
        client.bucket(bucket).blob(f"in/{name}").upload_from_filename(
            os.path.join(data, name))
    up = time.perf_counter() - t0
    size = 0
    t0 = time.perf_counter()
    for blob in client.list_blobs(bucket, prefix="in/"):
        size += len(blob.download_as_bytes())
    return {"upload_s": up, "read_s": time.perf_counter() - t0,
            "bytes": size, "files": len(files)}


def _tree_cpu(pid: Optional[int]) -> float:
    """CPU seconds (user + system) of a live process and its children."""
    import psutil
    if pid is None:
        return 0.0
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def cpu_use(cluster: harness.Cluster) -> dict:
    """CPU seconds so far: the machine's (every core, busy time), the
    emulator's, the live worker hosts' and the scheduler's."""
    import psutil
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0) \
        + getattr(t, "softirq", 0) + getattr(t, "steal", 0)
    pid = lambda h: None if h is None or h.proc is None else h.proc.pid
    return {"machine": busy,
            "emulator": _tree_cpu(cluster.emulator.pid
                                  if cluster.emulator else None),
            "workers": sum(_tree_cpu(pid(h)) for h in cluster.hosts),
            "scheduler": _tree_cpu(pid(cluster.scheduler))}


def cpu_spent(before: dict, after: dict) -> dict:
    """CPU seconds spent between two ``cpu_use`` readings (the hosts'
    from the hosts alive at both)."""
    return {k: round(after[k] - before[k], 2) for k in before}


def cpu_bound(base: dict, r: dict, cores: int) -> Optional[float]:
    """The largest speed-up the run ``r`` could have had over ``base`` on
    ``cores`` cores: it took ``cpu.machine`` CPU seconds, so it could not
    end before cpu / cores seconds (wall times of both runs' processes)."""
    spent = r.get("cpu", {}).get("machine")
    if not spent:
        return None
    return cores * base["wall_s"] / spent


def run_hosts(args: argparse.Namespace) -> list[dict]:
    """Every host count of --hosts on one cluster; one result per count."""
    counts = check_hosts(args.hosts)
    reason = harness.unavailable()
    if reason:
        raise SystemExit(f"--hosts: {reason}")
    d, n = args.dims[0], (args.sizes or [200_000])[0]
    args.clusters, args.vote = scaling.CONFIGS[
        ([c for c in args.configs.split(",") if c] or ["default"])[0]]
    data = (scaling.make_data(args.cache, n, d) if args.files is None else
            scaling.make_files(args.cache, n, d, args.files, args.format))
    harness.cleanup_leftovers()
    results = []
    with tempfile.TemporaryDirectory(prefix="dpsynth-hosts-") as folder, \
            harness.Cluster(Path(folder)) as cluster:
        cluster.start_emulator(harness.emulator_binary())
        cluster.start_scheduler()
        client = _storage(cluster)
        bucket = f"dpsynth-{uuid.uuid4().hex[:8]}"
        client.create_bucket(bucket)
        io = stage_input(client, bucket, data)
        print(f"input {n:,} x {d}: {io['bytes'] / 1e6:.0f} MB in "
              f"{io['files']} files; upload {io['upload_s']:.1f} s, read "
              f"back {io['read_s']:.1f} s", flush=True)
        if args.warmup:
            warm = _job(args, cluster, client, bucket, counts[0], d, -1)
            print(f"  warm-up hosts={counts[0]} job "
                  f"{warm['timings'].get('total', 0):.1f} s (not recorded)",
                  flush=True)
        for rep, hosts in sweep_order(counts, args.repeat):
            r = _job(args, cluster, client, bucket, hosts, d, rep)
            r.update(n=n, io=io)
            results.append(r)
            if args.save:  # one JSON line per run (--report-from)
                with open(args.save, "a") as out:
                    out.write(json.dumps(r) + "\n")
            print(f"  #{rep + 1} hosts={hosts} job {r['timings'].get('total', 0):.1f} s"
                  f"  wall {r['wall_s']:.1f} s  load {scaling._load(r)}"
                  f"  rc={r['rc']}", flush=True)
            if r["rc"]:
                print(r["log_tail"], flush=True)
    return results


def _job(args: argparse.Namespace, cluster: harness.Cluster, client,
         bucket: str, hosts: int, d: int, rep: int) -> dict:
    """One job on ``hosts`` worker hosts (added or killed to that count);
    its measurement, timings, CPU seconds and release digest (the release
    is then deleted)."""
    while len(cluster.hosts) < hosts:
        cluster.add_worker()
    while len(cluster.hosts) > hosts:  # a host leaves: gone for good
        cluster.kill(cluster.hosts[-1])
    cluster.wait_workers(hosts)
    cmd = job_command(args, bucket, cluster.address, hosts, d, rep)
    cmd = ["nice", "-n", str(args.nice), *cmd] if args.nice else cmd
    before = cpu_use(cluster)
    r = scaling.measure(cmd, args.timeout, args.max_rss_gb * 2 ** 30,
                        env=cluster.launcher_env())
    r["cpu"] = cpu_spent(before, cpu_use(cluster))
    r.update(hosts=hosts, repeat=rep, format=args.format, d=d,
             timings=parse_timings(r["log_tail"]),
             flags=" ".join(scaling._gen_flags(args)))
    prefix = f"out-h{hosts}-r{rep}"
    r["release_sha256"] = release_digest(client, bucket, prefix)
    # The emulator keeps every object in memory: 3 GB a release at
    # 2M x 384 (two kept took it past 19 GB: killed).
    for blob in client.list_blobs(bucket, prefix=prefix):
        blob.delete()
    return r


def hosts_report(results: list[dict], command: str) -> str:
    """The host-scaling table: same-run speed-ups against the fewest hosts
    (Amdahl f = (N/S - 1)/(N - 1); N = 2: 2/S(2) - 1)."""
    ok = [r for r in results if r["rc"] == 0 and r["timings"].get("total")]
    if not ok:
        return "no successful runs\n"
    first, io = ok[0], ok[0]["io"]
    lines = [f"`{command}`", "",
             f"{first['n']:,} x {first['d']} float32 ({first['format']}, "
             f"{io['files']} files, {io['bytes'] / 1e6:.0f} MB) on the GCS "
             f"emulator; flags `{first['flags']}`; one Dask worker "
             f"(--nthreads 1) per host, hosts unpinned on a "
             f"{os.cpu_count()}-core {platform.machine()} machine. Emulator "
             f"I/O by the launcher: upload {io['upload_s']:.1f} s, read back "
             f"{io['read_s']:.1f} s ({io['bytes'] / 1e6 / io['read_s']:.0f} "
             f"MB/s). Times from generate's own `--record-timings`: job s = "
             f"total; plan s = before the pipelines (listing and sizing "
             f"the input on gs://); pipeline s = the Beam pipelines on the "
             f"hosts (phase 1 of the adaptive plan included); launcher s = "
             f"job - pipeline: plan, staging checks and publish (publish s: "
             f"a copy the store makes, checked by the store's md5s; no "
             f"file's bytes through the launcher), serial on the launcher; "
             f"speed-up: against the same repeat's run on the fewest hosts "
             f"(repeats run the counts up, then down); launcher peak MB: "
             f"the launcher process tree's peak resident memory (PSS; the "
             f"workers live on the hosts); Amdahl f = "
             f"(N/S - 1)/(N - 1) (N = 2: 2/S(2) - 1); load = 1-min load "
             f"average before / after the run. CPU s during the run's "
             f"process (wall {first['wall_s']:.0f} s and so on): the "
             f"machine's (all cores) / the emulator's / the worker hosts' / "
             f"the scheduler's; busy cores = machine CPU s / wall s; CPU "
             f"bound = cores x the wall s of the same repeat's fewest-hosts "
             f"run / this run's machine CPU s: a run cannot end before its "
             f"CPU s are spent on the {os.cpu_count()} cores, so that is the "
             f"most it could gain over that run (on the fewest-hosts row: "
             f"the most any run doing that run's work could gain; -: not "
             f"measured).", "",
             "| hosts | repeat | job s | plan s | phase 1 s | pipeline s | "
             "launcher s | publish s | launcher peak MB | job speed-up (f) | "
             "pipeline speed-up (f) | CPU s machine / emulator / hosts / "
             "scheduler | busy cores | CPU bound | load |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- | --- | --- | --- | --- |"]
    fewest = min(r["hosts"] for r in ok)
    for r in ok:
        t = r["timings"]
        base = next((b for b in ok if b["hosts"] == fewest
                     and b["repeat"] == r["repeat"]), None)
        lines.append(
            f"| {r['hosts']} | {r['repeat'] + 1} | {t['total']:.1f} | "
            f"{t.get('plan', 0):.1f} | {t.get('phase1', 0):.1f} | "
            f"{t.get('pipeline', 0):.1f} | "
            f"{t['total'] - t.get('pipeline', 0):.1f} | "
            f"{t.get('publish', 0):.1f} | "
            f"{r.get('peak_rss_sum', 0) / 2 ** 20:.0f} | "
            f"{_speedup(base, r, 'total', fewest)} | "
            f"{_speedup(base, r, 'pipeline', fewest)} | "
            f"{_cpu(r)} | {_bound(base, r)} | {scaling._load(r)} |")
    lines += ["", f"Releases (the manifest's writer digests of the data files "
              f"and mixture): {len(ok)} runs, {_identity(ok)}"]
    return "\n".join(lines) + "\n"


def _cpu(r: dict) -> str:
    """The run's CPU seconds and busy cores (two cells)."""
    c = r.get("cpu")
    if not c:
        return "- | -"
    return (f"{c['machine']:.0f} / {c['emulator']:.0f} / {c['workers']:.0f} "
            f"/ {c['scheduler']:.0f} | {c['machine'] / r['wall_s']:.2f}")


def _bound(base: Optional[dict], r: dict) -> str:
    bound = None if base is None else cpu_bound(base, r, os.cpu_count() or 1)
    return "-" if bound is None else f"{bound:.2f}x"


def _identity(runs: list[dict]) -> str:
    digests = [r.get("release_sha256") for r in runs]
    if None in digests:
        return f"{digests.count(None)} without a release digest."
    if len(set(digests)) == 1:
        return "all byte-identical."
    return f"{len(set(digests))} different releases."


def _speedup(base: Optional[dict], r: dict, step: str, fewest: int) -> str:
    """``S (f)`` of one step against the same repeat's fewest-hosts run."""
    if base is None or not r["timings"].get(step):
        return "-"
    s = base["timings"][step] / r["timings"][step]
    f = scaling.amdahl_serial(s, r["hosts"]) if fewest == 1 else None
    return f"{s:.2f}x" + ("" if f is None else f" ({f:.2f})")


def sweep_hosts(args: argparse.Namespace, argv: Optional[Sequence[str]]
                ) -> int:
    """--hosts: run, print and write the table (section ``hosts``)."""
    if args.report_from:
        with open(args.report_from) as f:
            results = [json.loads(line) for line in f if line.strip()]
    else:
        results = run_hosts(args)
    command = "python benchmarks/scaling.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    text = hosts_report(results, command)
    print(text)
    scaling.write_section(args.out, args.section if args.section != "latest"
                          else "hosts", text)
    return 0 if all(r["rc"] == 0 for r in results) else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m benchmarks.scaling_hosts --hosts 1,2 ...`` (what
    ``benchmarks/scaling.py --hosts`` runs): scaling.py's flags."""
    args = scaling.parser().parse_args(argv)
    return sweep_hosts(args, argv)


if __name__ == "__main__":
    sys.exit(main())
