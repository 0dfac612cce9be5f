"""A flag typo or a missing --input is refused before Beam or TensorFlow is
imported (issue 72: answers in a second; `benchmarks/refusal_time.py`
measures it), and the early checks never refuse what the full checks
accept."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dpsynth.pipelines.cli import early_checks, generate
from dpsynth.pipelines.cli.beam_flags import BEAM_FLAGS

REPO = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from dpsynth.pipelines import cli
    code = cli.main({argv!r})
    heavy = [m for m in ("apache_beam", "tensorflow") if m in sys.modules]
    print("EXIT", code, "HEAVY", ",".join(heavy))
""")


@pytest.mark.parametrize("argv, message", [
    (["generate", "--inptu", "x"], "unknown flag --inptu; did you mean --input?"),
    (["generate", "--input", "/nonexistent/e-*.npz", "--num-classes", "3"],
     "--input '/nonexistent/e-*.npz': no files match"),
    (["generate", "--runner", "DirectRunner", "--direct_num_wrokers", "2"],
     "did you mean --direct_num_workers?"),
    (["encode", "--images", "a", "--output", "b", "--encodr", "x"],
     "unknown flag --encodr"),
])
def test_refusals_come_before_beam_and_tensorflow(argv, message):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(repo=str(REPO), argv=argv)],
        capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip().splitlines()[-1] == "EXIT 2 HEAVY", proc.stdout
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_every_beam_flag_is_known_to_the_early_check():
    # The modules `generate` and `encode` import before the full check.
    from dpsynth.pipelines import job  # noqa: F401
    from dpsynth.pipelines.runners.options import _beam_parser, _flag_names
    live = set(_flag_names(_beam_parser()))
    missing = sorted(n for n in live - BEAM_FLAGS if not n.startswith("--dask_"))
    assert not missing, f"add to pipelines/cli/beam_flags.py: {missing}"
    argv = [n + "=1" for n in sorted(live)]
    assert early_checks.unknown_flag(generate.parser(), argv, "generate") is None


@pytest.mark.parametrize("pattern", [
    "x*.npz", "*.npz", "./x*.npz", "{d}/*.npz", "{d}/**.npz", "{d}/**/y.npz",
    "{d}/s?b/y.npz", "{d}/*/y.npz", "{d}/x1.npz", "{d}/none*.npz",
    "{d}/nodir/*.npz", "{d}/.h*", "{d}/[xs]*", "{d}/sub/z*", "x1.npz"])
def test_the_early_input_check_refuses_only_what_beam_finds_nothing_for(
        tmp_path, monkeypatch, pattern):
    from dpsynth.transforms import io
    (tmp_path / "sub").mkdir()
    for name in ("x1.npz", ".hid.npz", "sub/y.npz"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    pattern = pattern.format(d=tmp_path)
    refusal = early_checks.missing_input(pattern)
    try:
        found = io.match_files(pattern)
    except io.InputError as err:
        found, message = [], str(err)
    if refusal is not None:
        assert not found and message == refusal
