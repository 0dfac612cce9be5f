"""What a user sees: strict flags, one-line errors, quiet output, Ctrl-C."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dpsynth.pipelines import cli, job
from dpsynth.pipelines.release import protocol
from tests.conftest import gmm_data

REPO = Path(__file__).resolve().parent.parent


def _npz(tmp_path):
    x, y = gmm_data(300, d=4, classes=2)
    path = tmp_path / "in.npz"
    np.savez(path, embeddings=x, labels=y)
    return path


@pytest.mark.parametrize("typo,meant", [
    (["--epsilom", "1"], "--epsilon"),
    (["--clip_norm", "0.5"], "--clip-norm"),
    (["--direct_num_worker=2"], "--direct_num_workers"),
    (["--covarance", "shared"], "--covariance"),
])
def test_a_mistyped_flag_stops_the_run_before_any_data_is_read(
        tmp_path, capsys, monkeypatch, typo, meant):
    def never(*args, **kwargs):
        raise AssertionError("data was read despite an unknown flag")
    monkeypatch.setattr(job, "run", never)
    rc = cli.main(["generate", "--input", str(tmp_path / "in.npz"),
                   "--output", str(tmp_path / "out"), *typo])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert f"unknown flag {typo[0].split('=')[0]}" in err
    assert f"did you mean {meant}?" in err
    assert not (tmp_path / "out").exists()


def test_an_unknown_runner_stops_the_run_before_any_data_is_read(
        tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("data was read despite an unknown runner")
    monkeypatch.setattr(job, "run", never)
    rc = cli.main(["generate", "--output", str(tmp_path / "out"),
                   "--runner", "DataflowRuner"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.splitlines() == [err]
    assert "unknown runner --runner DataflowRuner" in err
    assert "did you mean DataflowRunner?" in err


def test_beam_options_still_pass(tmp_path, capsys):
    rc = cli.main(["generate", "--input", str(_npz(tmp_path)),
                   "--num-classes", "2", "--output", str(tmp_path / "out"),
                   "--direct_num_workers", "1", "--runner=DirectRunner",
                   "--noise-seed", "1"])
    assert rc == 0, capsys.readouterr().err


def test_stray_argument_and_bad_value_are_one_line(tmp_path, capsys):
    assert cli.main(["generate", "--output", str(tmp_path / "o"),
                     "stray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and "'stray'" in err
    with pytest.raises(SystemExit) as stop:
        cli.main(["generate", "--epsilon", "abc"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--epsilon" in err


def test_abbreviated_flags_are_refused(tmp_path, capsys):
    """--clip must not silently mean --clip-norm."""
    assert cli.main(["generate", "--output", str(tmp_path / "o"),
                     "--clip", "0.5"]) == 2
    assert "unknown flag --clip" in capsys.readouterr().err


def test_encode_refuses_unknown_flags_too(tmp_path, capsys):
    rc = cli.main(["encode", "--images", str(tmp_path), "--output",
                   str(tmp_path / "e.npz"), "--batch_size", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and "did you mean --batch-size?" in err


def test_ctrl_c_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    def interrupt(step):
        if step == "running":
            raise KeyboardInterrupt
    monkeypatch.setattr(protocol, "checkpoint", interrupt)
    out = tmp_path / "out"
    rc = cli.main(["generate", "--input", str(_npz(tmp_path)),
                   "--num-classes", "2", "--output", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 130
    assert [l for l in err if "error" in l or "interrupted" in l] == [
        "dpsynth: interrupted; nothing was published"]
    assert sorted(os.listdir(tmp_path)) == ["in.npz"]


def _cli(*argv, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "dpsynth.pipelines.cli", *argv],
                          cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_help_is_quiet(tmp_path):
    proc = _cli("generate", "--help", cwd=tmp_path)
    assert proc.returncode == 0
    assert proc.stderr == ""  # no apitools / TensorFlow start-up lines
    assert "(default: 4.0)" in proc.stdout  # defaults are shown


def test_default_output_is_the_few_lines_that_matter(tmp_path):
    """Two worker processes, and still no Beam worker or TensorFlow log
    lines: progress, the summary, the demo's utility line."""
    proc = _cli("generate", "--output", str(tmp_path / "r"),
                "--direct_num_workers", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    noise = [l for l in lines if not (l.startswith(("dpsynth", "release:",
             "privacy:", "  budget", "rows per class", "read it:",
                                                    "utility")))]
    assert noise == []
    assert len(lines) <= 16
    assert not list(tmp_path.glob("dpsynth-*.log"))


def _progress(tmp_path, caplog, text: str, **printer) -> list[str]:
    """The operator's lines of a ProgressPrinter over a progress file that
    already holds ``text`` (every pass ran before the first poll)."""
    import logging

    from dpsynth.pipelines import console
    path = tmp_path / "progress"
    path.write_text(text)
    with caplog.at_level(logging.INFO, logger="dpsynth.operator"):
        with console.ProgressPrinter(str(path), ["Centre", "Moments"],
                                     **printer):
            pass
    return [r.getMessage() for r in caplog.records
            if r.name == "dpsynth.operator"]


def test_a_job_faster_than_the_poll_still_shows_its_last_pass(tmp_path,
                                                              caplog):
    """Every pass ran between two polls: the end still names the last one."""
    lines = _progress(tmp_path, caplog, "Centre\t300\nMoments\t300\n")
    assert lines[-2].endswith("pass 2/2: moments")
    assert lines[-1].endswith("pipeline finished")
    assert not any("300" in line for line in lines)  # exact n: opt-in only


def test_exact_row_counts_only_when_the_operator_asks(tmp_path, caplog):
    lines = _progress(tmp_path, caplog, "Centre\t300\nMoments\t300\n",
                      show_rows=True)
    assert lines[-2].endswith("pass 2/2, moments: 300 rows read")


def test_the_adaptive_plans_two_phases_count_their_passes_as_one(
        tmp_path, caplog):
    """Phase 1 (its pass count not final: phase 2's is chosen from its
    noisy counts), then phase 2 going on from it: never "pass 1/1" twice."""
    import logging

    from dpsynth.pipelines import console
    path = tmp_path / "progress"
    with caplog.at_level(logging.INFO, logger="dpsynth.operator"):
        path.write_text("Counts\t300\n")
        with console.ProgressPrinter(str(path), ["Counts"],
                                     more_to_come=True, interactive=False):
            pass
        path.write_text("Moments\t300\n")
        with console.ProgressPrinter(str(path), ["Moments"], done=1,
                                     interactive=False):
            pass
    lines = [r.getMessage() for r in caplog.records
             if r.name == "dpsynth.operator" and "pass" in r.getMessage()]
    assert lines == [
        "pass 1: DP centre + class counts", "pass 2/2: moments"]


def _worker_gone_record() -> None:
    """What Beam's runner logs when a worker's data stream breaks (its
    worker ended: Ctrl-C reached it before the runner saw it)."""
    import logging
    try:
        raise ConnectionError("Socket closed")
    except ConnectionError:
        logging.getLogger("apache_beam.runners.worker.data_plane").exception(
            "Failed to read inputs in the data plane.")


def test_ctrl_c_after_a_worker_ended_first_is_still_one_line(
        tmp_path, capsys, monkeypatch):
    """The runner logs a worker's broken stream before the interrupt
    reaches its own thread: nothing of it on the console, no log left."""
    from dpsynth.pipelines import console
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    console.setup_logging()
    with pytest.raises(KeyboardInterrupt):
        with console.quiet_stderr(False):
            _worker_gone_record()
            raise KeyboardInterrupt
    assert capsys.readouterr().err == ""
    assert not list(tmp_path.glob("dpsynth-*.log"))


def test_library_errors_of_a_job_that_worked_are_kept_in_its_log(
        tmp_path, capsys, monkeypatch):
    from dpsynth.pipelines import console
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    console.setup_logging()
    with console.quiet_stderr(False):
        _worker_gone_record()
        console.log.info("published")
    err = capsys.readouterr().err.splitlines()
    (log,) = tmp_path.glob("dpsynth-*.log")
    assert err == ["dpsynth: published",
                   f"dpsynth: the runner's own log is in {log}"]
    assert "Failed to read inputs in the data plane" in log.read_text()


def test_library_errors_of_a_failed_job_are_in_its_log_not_the_console(
        tmp_path, capsys, monkeypatch):
    from dpsynth.pipelines import console
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    console.setup_logging()
    with pytest.raises(RuntimeError):
        with console.quiet_stderr(False):
            _worker_gone_record()
            raise RuntimeError("Worker subprocess exited with return code 1")
    (log,) = tmp_path.glob("dpsynth-*.log")
    assert capsys.readouterr().err.splitlines() == [
        f"dpsynth: the runner's own log is in {log}"]
    assert "ConnectionError: Socket closed" in log.read_text()


EXIT_PROBE = """
import atexit, os, signal, sys, time
from dpsynth.pipelines import cli

class Teardown:
    def __del__(self):
        print("torn down", flush=True)

kept = Teardown()  # collected only by the interpreter's teardown


def clean_up():  # Ctrl-C while it runs: it still runs to its end
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    print("exit handler ran")


atexit.register(clean_up)
print("before", end="")  # unflushed: the exit must flush it
sys.argv = ["dpsynth", *sys.argv[1:]]
cli.run()
"""


@pytest.mark.parametrize("argv,code", [(["--version"], 0),
                                       (["generate", "--epsilom", "1"], 2)])
def test_the_command_exits_with_its_code_after_its_exit_handlers(
        tmp_path, argv, code):
    """`dpsynth` ends without the interpreter's teardown (0.5-0.8 s after
    Beam and PipelineDP are imported) but with its exit handlers, flushed
    output and the command's exit code."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", EXIT_PROBE, *argv],
                          cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.startswith("before")
    assert proc.stdout.rstrip().endswith("exit handler ran")
    assert "torn down" not in proc.stdout
    assert "KeyboardInterrupt" not in proc.stderr, proc.stderr


def test_ctrl_c_caught_inside_the_capture_leaves_no_log_and_no_line(
        tmp_path, capsys, monkeypatch):
    """`dpsynth generate` turns Ctrl-C into its line inside the capture
    (run_command under quiet_stderr): the library errors of the stop (a
    Dask worker that never started) are no reason to keep the log, and a
    library's record after the end (asyncio's task, collected at exit)
    does not reach the console."""
    import logging

    from dpsynth.pipelines import console
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    monkeypatch.setattr(console, "_stopped", False)
    console.setup_logging()

    def job() -> int:
        _worker_gone_record()
        raise KeyboardInterrupt
    with console.quiet_stderr(False):
        assert console.run_command(job, "generate", ()) == 130
    logging.getLogger("asyncio").error("Task exception was never retrieved")
    assert capsys.readouterr().err.splitlines() == [
        "dpsynth: interrupted; nothing was published"]
    assert not list(tmp_path.glob("dpsynth-*.log"))


def test_a_non_interactive_log_has_no_clocks_and_every_pass_once(
        tmp_path, caplog):
    """An Airflow task log (not a terminal): no [m:ss] elapsed clocks (they
    grow with n) and no periodic lines; every pass of the plan is named
    once, in order, however fast each ran (which lines appear must not
    depend on timing)."""
    from dpsynth.pipelines import console
    assert not console.console_is_terminal()  # pytest captures the console
    lines = _progress(tmp_path, caplog, "Centre\t300\nMoments\t300\n",
                      every=0.0)
    assert lines == ["pass 1/2: DP centre", "pass 2/2: moments",
                     "pipeline finished"]


def test_a_terminal_keeps_its_elapsed_clock(tmp_path, caplog):
    lines = _progress(tmp_path, caplog, "Centre\t300\n", interactive=True)
    assert lines[-1] == "[0:00] pipeline finished"


@pytest.mark.parametrize("sigint", ["handled", "ignored"])
def test_a_failed_pass_boundary_check_stops_the_main_thread(tmp_path,
                                                            sigint):
    """on_pass (the lease check) raising at a new pass interrupts the run
    in the main thread, where the pipeline waits; the reason is kept. Also
    where SIGINT is ignored (a background job of a non-interactive shell
    inherits that; interrupt_main alone then did nothing)."""
    import signal
    import time

    from dpsynth.pipelines import console
    previous = signal.signal(signal.SIGINT, signal.default_int_handler
                             if sigint == "handled" else signal.SIG_IGN)
    try:
        _stops_the_main_thread(tmp_path, console, time)
    finally:
        signal.signal(signal.SIGINT, previous)


def _stops_the_main_thread(tmp_path, console, time):
    path = tmp_path / "progress"
    path.write_text("Centre\t3\n")

    def taken_over():
        raise RuntimeError("taken over")

    printer = console.ProgressPrinter(str(path), ["Centre"],
                                      on_pass=taken_over)
    with pytest.raises(KeyboardInterrupt):
        with printer:
            for _ in range(300):  # the printer polls every second
                time.sleep(0.1)
    assert str(printer.stopped_by) == "taken over"
