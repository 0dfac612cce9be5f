"""Beam's IPython check without importing IPython (pipelines/runners/ipython_check).

Building a dpsynth pipeline must not import IPython (~0.5 s in the launcher
where it is installed), and the check must still give Beam's answer.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from dpsynth.pipelines.runners import ipython_check

BUILD = """
import sys
import apache_beam as beam
from dpsynth.pipelines.runners.options import beam_options
p = beam.Pipeline(options=beam_options([]))
_ = p | beam.Create([1, 2]) | beam.Map(str)
p.run().wait_until_finish()
print("IPython" in sys.modules)
"""


def test_building_and_running_a_pipeline_does_not_import_ipython():
    pytest.importorskip("IPython", reason="IPython is not installed: Beam "
                        "cannot import it either")
    out = subprocess.run([sys.executable, "-c", BUILD], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False"


def test_without_ipython_imported_the_answer_is_no(monkeypatch):
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    monkeypatch.setattr(ipython_check, "_original", lambda: True)
    assert ipython_check.is_in_ipython() is False


def test_with_ipython_imported_beam_answers(monkeypatch):
    monkeypatch.setitem(sys.modules, "IPython", object())
    monkeypatch.setattr(ipython_check, "_original", lambda: True)
    assert ipython_check.is_in_ipython() is True
    monkeypatch.setattr(ipython_check, "_original", lambda: False)
    assert ipython_check.is_in_ipython() is False


def test_install_points_beam_at_the_check():
    from apache_beam import pipeline
    from apache_beam.utils import interactive_utils
    ipython_check.install()
    assert interactive_utils.is_in_ipython is ipython_check.is_in_ipython
    assert pipeline.is_in_ipython is ipython_check.is_in_ipython
