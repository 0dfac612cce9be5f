"""``benchmarks/scaling.py --hosts`` (issue 52 item 5): its flags, the
job's command line, the sweep order, the step timings it reads from the
job's console and the table, without a cluster; and one tiny sweep on 1
and 2 hosts (needs root, ~20 s here; skips with the reason elsewhere). The
measured run: benchmarks/results/scaling.md, section "Hosts"."""

from __future__ import annotations

import os

import pytest

from benchmarks import scaling, scaling_hosts


def _args(*flags: str):
    return scaling.parser().parse_args(["--hosts", "1,2", *flags])


def test_hosts_flag_and_job_command():
    args = _args("--dims", "384", "--sizes", "200000")
    assert args.hosts == [1, 2]
    args.clusters, args.vote = scaling.CONFIGS["default"]
    cmd = scaling_hosts.job_command(args, "bkt", "tcp://10.231.7.2:8786", 2,
                                    384, repeat=1)
    assert cmd[1:4] == ["-m", "dpsynth.pipelines.cli", "generate"]
    flag = {a: b for a, b in zip(cmd, cmd[1:])}
    assert flag["--input"] == "gs://bkt/in/part-*"
    assert flag["--output"] == "gs://bkt/out-h2-r1"
    assert "--embedding-dim" not in cmd  # .npz records its dimension
    assert "--dask_client_address=tcp://10.231.7.2:8786" in cmd
    assert {"--record-timings", "--runner"} <= set(cmd)
    assert "--vote-filter" not in cmd  # config `default`
    # generate's own parser takes every flag (unknown flags are errors)
    from dpsynth.pipelines.cli import generate
    generate.parser().parse_args(cmd[4:cmd.index("--runner")])


def test_tfrecord_files_name_their_dimension():
    args = _args("--files", "2", "--format", "tfrecord")
    args.clusters, args.vote = scaling.CONFIGS["default"]
    cmd = scaling_hosts.job_command(args, "b", "tcp://x:1", 1, 384)
    assert cmd[cmd.index("--embedding-dim") + 1] == "384"


@pytest.mark.parametrize("counts", [[0, 1], [2, 2], []])
def test_bad_host_counts_are_one_line_errors(counts):
    with pytest.raises(SystemExit, match="--hosts: distinct counts >= 1"):
        scaling_hosts.check_hosts(counts)


def test_repeats_go_up_then_down():
    assert scaling_hosts.sweep_order([1, 2], 3) == [
        (0, 1), (0, 2), (1, 2), (1, 1), (2, 1), (2, 2)]


def test_timings_and_table():
    log = ("x\nINFO wall times (s, operator only, not DP): {'phase1': 4.0, "
           "'pipeline': 14.0, 'total': 20.0}\n")
    assert scaling_hosts.parse_timings(log)["total"] == 20.0
    assert scaling_hosts.parse_timings("no timings") == {}
    io = {"files": 4, "bytes": 3e8, "upload_s": 2.0, "read_s": 1.0}
    runs = [{"rc": 0, "hosts": h, "repeat": 0, "n": 200_000, "d": 384,
             "format": "npz", "flags": "--clusters 1", "io": io,
             "wall_s": t + 2, "load": (0.5, 0.6),
             "timings": {"total": t, "phase1": 1.0, "pipeline": t - 2}}
            for h, t in ((1, 20.0), (2, 12.5))]
    text = scaling_hosts.hosts_report(runs, "cmd")
    row = next(line for line in text.splitlines() if line.startswith("| 2 "))
    assert "| 1.60x (0.25) |" in row  # job: f = 2/1.6 - 1
    assert "| 10.5 | 2.0 |" in row  # pipeline s, launcher s = job - it
    assert "300 MB/s" in text
    assert "2 runs, 2 without a release digest." in text


def test_the_cpu_bound_is_cores_times_the_base_wall_over_cpu_spent():
    """A 2-host run that kept the machine's cores busy for 150 CPU s could
    not end before 150 / cores s: over a 1-host run of 100 s wall its
    speed-up is at most cores x 100 / 150."""
    base = {"wall_s": 100.0, "cpu": {"machine": 110.0}}
    run = {"wall_s": 80.0, "cpu": {"machine": 150.0}}
    assert scaling_hosts.cpu_bound(base, run, 2) == pytest.approx(4 / 3)
    assert scaling_hosts.cpu_bound(base, {"wall_s": 1.0}, 2) is None
    spent = scaling_hosts.cpu_spent(
        {"machine": 10.0, "emulator": 1.0, "workers": 2.0, "scheduler": 0.5},
        {"machine": 60.0, "emulator": 21.0, "workers": 27.0,
         "scheduler": 1.0})
    assert spent == {"machine": 50.0, "emulator": 20.0, "workers": 25.0,
                     "scheduler": 0.5}
    io = {"files": 1, "bytes": 1e6, "upload_s": 1.0, "read_s": 1.0}
    runs = [{"rc": 0, "hosts": h, "repeat": 0, "n": 10, "d": 8,
             "format": "npz", "flags": "", "io": io, "wall_s": w,
             "load": (0.1, 0.2), "cpu": {"machine": c, "emulator": 1.0,
                                         "workers": 2.0, "scheduler": 0.0},
             "timings": {"total": w - 1, "pipeline": w - 3}}
            for h, w, c in ((1, 100.0, 110.0), (2, 80.0, 150.0))]
    text = scaling_hosts.hosts_report(runs, "cmd")
    row = next(line for line in text.splitlines() if line.startswith("| 2 "))
    cores = os.cpu_count() or 1
    assert f"| {cores * 100 / 150:.2f}x |" in row
    assert "| 150 / 1 / 2 / 0 | 1.88 |" in row  # busy cores = 150 / 80


def test_a_tiny_sweep_on_one_and_two_hosts(tmp_path):
    """2,000 x 8 rows on 1 then 2 hosts, after an unrecorded warm-up job:
    both publish to the emulator and the table has their rows, not the
    warm-up's (~30 s here: the cluster's start)."""
    from benchmarks import hosts
    reason = hosts.unavailable()
    if reason:
        pytest.skip(f"no namespaces here: {reason}")
    out = tmp_path / "scaling.md"
    assert scaling.main(["--hosts", "1,2", "--dims", "8", "--sizes", "2000",
                         "--cache", str(tmp_path / "cache"), "--out",
                         str(out), "--nice", "0", "--warmup"]) == 0
    rows = [line for line in out.read_text().splitlines()
            if line.startswith(("| 1 | 1 |", "| 2 | 1 |"))]
    assert len(rows) == 2, out.read_text()
    assert "| -1 |" not in out.read_text()  # no row of the warm-up
    # Same seed on 1 and 2 hosts: the same release (from the manifests;
    # each run's output is deleted after it, as the emulator keeps bytes
    # in memory).
    assert "2 runs, all byte-identical." in out.read_text()
