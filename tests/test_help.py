"""`--help`, `--version` and flag typos answer without loading Beam
(issue 29), of every command and of `dpsynth` itself: the parser is built
from light modules only, and errors share one prefix."""

from __future__ import annotations

import argparse
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


def _declared(*options_classes, leave_out=()) -> list:
    """The option fields (``spec.option``) of ``options_classes``."""
    import dataclasses
    return [f for options in options_classes
            for f in dataclasses.fields(options)
            if "flag" in f.metadata and f not in leave_out]


def _commands():
    """(command, its parser, the option fields its flags are built from)."""
    import dataclasses

    from dpsynth.pipelines import spec
    from dpsynth.pipelines.cli import encode, evaluate, generate
    image_label = {f.name: f for f in dataclasses.fields(spec.ImageOptions)}[
        "label_feature"]  # generate's --label-feature is InputOptions'
    return [
        ("generate", generate.parser(), _declared(
            spec.InputOptions, spec.GeneratorOptions, spec.OutputOptions,
            spec.BudgetOptions, spec.RunOptions, spec.ImageOptions,
            leave_out=(image_label,))),
        ("encode", encode.parser(), _declared(spec.ImageOptions,
                                              spec.EncodeSpec)),
        ("evaluate", evaluate.parser(), _declared(spec.EvaluateSpec,
                                                  spec.MLPOptions))]


@pytest.mark.parametrize("command", ["generate", "encode", "evaluate"])
def test_every_declared_option_is_one_flag_with_the_fields_default(command):
    """Each option is declared once, by its spec field (spec.option): a
    declared field left out of a command's groups would be no flag, and
    the flag's default, read back into the spec, is the field's."""
    import dataclasses

    from dpsynth.pipelines.cli import spec_flags
    _, parser, declared = [c for c in _commands() if c[0] == command][0]
    actions = {}
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag not in actions, f"{command}: {flag} twice"
            actions[flag] = action
    flags = [f.metadata["flag"] for f in declared]
    assert len(flags) == len(set(flags)), f"{command}: a flag declared twice"
    assert set(flags) <= set(actions), set(flags) - set(actions)
    assert len(flags) > {"generate": 55, "encode": 18, "evaluate": 30}[command]
    for field in declared:
        action = actions[field.metadata["flag"]]
        if field.default is dataclasses.MISSING:  # a required flag
            assert field.metadata["required"]
            assert action.required or action.default is None, action
            continue
        args = argparse.Namespace(**{action.dest: action.default})
        assert spec_flags.field_value(args, field) == field.default, (
            command, field.name, action.default, field.default)
