"""`--help`, `--version` and flag typos answer without loading Beam
(issue 29), of every command and of `dpsynth` itself: the parser is built
from light modules only, and errors share one prefix."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PROBE = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from dpsynth.pipelines import cli
    try:
        cli.main({argv!r})
    except SystemExit:
        pass
    heavy = [m for m in ("apache_beam", "tensorflow", "sklearn", "pyarrow",
                         "scipy")
             if m in sys.modules]
    print("HEAVY", ",".join(heavy))
""")


def _probe(argv: list[str]) -> tuple[str, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(repo=str(REPO), argv=argv)],
        capture_output=True, text=True, timeout=120)
    heavy = proc.stdout.strip().splitlines()[-1]
    return heavy[len("HEAVY "):], proc.stdout + proc.stderr


@pytest.mark.parametrize("argv", [
    ["generate", "--help"], ["--version"], ["generate", "--epsilon", "abc"],
    ["--help"], ["encode", "--help"], ["evaluate", "--help"],
    ["report", "--help"], ["encode", "--images"], ["budget", "--help"],
    ["budget", "show", "--help"]])
def test_the_help_path_loads_no_pipeline_library(argv):
    heavy, out = _probe(argv)
    assert heavy == "", f"{argv} imported {heavy}"
    if argv == ["--version"]:
        assert out.startswith("dpsynth ")


def test_generate_help_starts_with_the_embeddings_and_explains_every_flag():
    from dpsynth.pipelines.cli import generate
    text = generate.parser().format_help()
    groups = [line for line in text.splitlines() if line.endswith(":")
              and not line.startswith(" ")]
    assert groups[1].startswith("input (private labelled embeddings)")
    assert groups.index("privacy:") < groups.index("generator:") < [
        i for i, g in enumerate(groups) if g.startswith("images")][0]
    for action in generate.parser()._actions:
        assert action.help, action.option_strings
    assert "REQUIRED with --input" in text


def test_typos_suggest_the_flag_meant(capsys):
    from dpsynth.pipelines import cli
    assert cli.main(["generate", "--eps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("dpsynth: error: unknown flag --eps; did you mean "
                           "--epsilon?")
    with pytest.raises(SystemExit):
        cli.main(["generate", "--epsilon", "abc"])
    assert capsys.readouterr().err.startswith("dpsynth: error: ")


def test_every_declared_generate_option_is_a_flag():
    """Each option is declared once, by its spec field (spec.option):
    a declared field left out of generate's groups would be no flag."""
    import dataclasses

    from dpsynth.pipelines import spec
    from dpsynth.pipelines.cli import generate
    flags = {s for a in generate.parser()._actions for s in a.option_strings}
    declared = [f.metadata["flag"] for options in (
        spec.InputOptions, spec.GeneratorOptions, spec.OutputOptions,
        spec.BudgetOptions, spec.RunOptions)
        for f in dataclasses.fields(options) if "flag" in f.metadata]
    assert len(declared) == len(set(declared)) > 40
    assert set(declared) <= flags, set(declared) - flags
