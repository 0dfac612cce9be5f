"""The README is a user's guide that stays true: short, its commands,
modules, extras and paths exist, and no development history; the help
texts' references to the docs point at files and sections that exist."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def test_the_readme_is_at_most_300_lines():
    assert len(README.splitlines()) <= 300


def test_the_quickstart_makes_a_venv_and_runs_what_ci_runs():
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", README, re.S)
                if "venv" in b]
    lines = block.strip().splitlines()
    assert lines[0] == "python -m venv .venv && . .venv/bin/activate"
    assert lines[1] == "pip install . && dpsynth generate"
    assert lines[2] == 'pip install -e ".[test]" && python -m pytest tests'
    ci = (REPO / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]"' in ci
    assert re.search(r"^python -m pytest .*tests$", ci, re.M)


def test_every_extra_named_exists():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    named = set(re.findall(r'"\.\[(\w[\w-]*)\]"', README))
    assert named and named <= set(extras), named - set(extras)


def _subcommands() -> set[str]:
    from dpsynth.pipelines import cli
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions
              if isinstance(a, argparse._SubParsersAction)]
    return set(sub.choices)


def _code() -> str:
    """The README's code: its blocks and its inline code spans."""
    blocks = re.findall(r"```.*?```", README, re.S)
    prose = re.sub(r"```.*?```", "", README, flags=re.S)
    return "\n".join(blocks + re.findall(r"`([^`\n]+)`", prose))


def test_every_dpsynth_command_named_exists():
    named = set(re.findall(r"(?:^|[\s&])dpsynth ([a-z]+)\b", _code(), re.M))
    assert named <= _subcommands(), named - _subcommands()
    assert {"generate", "encode", "evaluate", "report"} <= named


def test_every_module_and_import_named_exists():
    modules = set(re.findall(r"python -m (dpsynth[\w.]+)", README))
    modules |= set(re.findall(r"--preload (dpsynth[\w.]+)", README))
    assert modules
    for name in sorted(modules):
        assert importlib.util.find_spec(name) is not None, name
    imports = re.findall(r"^from (dpsynth[\w.]+) import (.+)$", README, re.M)
    assert imports
    for module, names in imports:
        loaded = importlib.import_module(module)
        for name in names.split(","):
            assert hasattr(loaded, name.strip()), f"{module}.{name}"


def test_every_repository_path_named_exists():
    paths = set(re.findall(
        r"`((?:docs|deploy|tests|benchmarks|pipelines|transforms|dp_ops|"
        r"models)/[\w./-]*)`", README))
    paths |= set(re.findall(r"\]\(((?:docs|deploy)/[\w./-]+)", README))
    assert paths
    missing = [p for p in sorted(paths) if not (REPO / p).exists()]
    assert not missing


def test_no_development_history():
    for word in ("Amdahl", "session", "issue 30", "2026-11-28"):
        assert word not in README, word


def _help_texts() -> dict[str, str]:
    from dpsynth.pipelines import cli
    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions
              if isinstance(a, argparse._SubParsersAction)]
    return {name: p.format_help() for name, p in sub.choices.items()}


def _headings(path: Path) -> set[str]:
    return {h.strip().lower() for h in
            re.findall(r"^#+ (.+)$", path.read_text(), re.M)}


def test_help_texts_point_at_sections_that_exist():
    texts = _help_texts()
    assert "generate" in texts
    refs = []
    for name, text in texts.items():
        flat = " ".join(text.split())
        for doc, section in re.findall(r"\b((?:docs/\w+|README)(?:\.md)?): "
                                       r"([A-Z][\w ]+?)[;,)]", flat):
            path = REPO / (doc if doc.endswith(".md") else doc + ".md")
            assert path.exists(), (name, doc)
            assert any(h.startswith(section.strip().lower())
                       for h in _headings(path)), (name, doc, section)
            refs.append(section)
        for stem in re.findall(r"(?<![\w_])(schema|manifest|summary|gmm)"
                               r"\.(?:json|npz)", flat):
            pytest.fail(f"dpsynth {name} --help names {stem} without the "
                        f"release's '_' prefix")
    assert "Covariance defaults" in refs


def test_the_docs_link_only_to_files_a_clone_has():
    """Relative links of README.md, deploy/README.md and docs/*.md resolve
    inside the repository (docs/results.md pointed at ../shared/README.md,
    which a clone does not have)."""
    pages = [REPO / "README.md", REPO / "deploy" / "README.md",
             *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text()
        if "../shared/" in text:
            broken.append(f"{page.relative_to(REPO)}: names ../shared/")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#", 1)[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            resolved = (page.parent / path).resolve()
            if REPO not in resolved.parents or not resolved.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken
