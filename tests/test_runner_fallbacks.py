"""Each patch of Beam's or Dask's internals (dpsynth.pipelines.runners)
checks what it replaces when installed: where a Beam has another shape of
that internal (simulated here by putting a function of another signature,
or an object of another kind, in its place), the patch is not installed,
Beam's own stays in place, and one debug line says so. No job fails for
a Beam the patches were not measured on."""

from __future__ import annotations

import logging
import types

import pytest

from dpsynth.pipelines.runners import beam_patch

KEPT = "Beam's own behaviour is kept"


@pytest.fixture
def kept_lines(monkeypatch, caplog):
    """The debug lines of patches left out (fresh for each test)."""
    monkeypatch.setattr(beam_patch, "_said", set())
    caplog.set_level(logging.DEBUG, logger=beam_patch.log.name)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == beam_patch.log.name and KEPT in r.getMessage()]
    return lines


def _other_shape(*args, **kwargs):
    """A Beam internal of another signature than the one measured."""
    return "beam's"


def _assert_kept(owner, name, kept_lines, fake=_other_shape) -> None:
    assert getattr(owner, name) is fake  # Beam's own, not replaced
    lines = [line for line in kept_lines() if name in line]
    assert len(lines) == 1, kept_lines()


def test_temp_cleanup_keeps_beams_environment_builder(monkeypatch, kept_lines):
    from apache_beam.runners.portability import job_server
    from apache_beam.transforms import environments

    from dpsynth.pipelines.runners import temp_cleanup
    monkeypatch.setattr(environments, "python_sdk_dependencies",
                        _other_shape)
    monkeypatch.setattr(job_server.SubprocessJobServer, "start",
                        _other_shape)
    temp_cleanup._install()
    temp_cleanup._install()  # asked again: still one line each
    _assert_kept(environments, "python_sdk_dependencies", kept_lines)
    _assert_kept(job_server.SubprocessJobServer, "start", kept_lines)


def test_bundle_sampler_keeps_beams_period(monkeypatch, kept_lines):
    from apache_beam.runners.worker import statesampler

    from dpsynth.pipelines.runners import bundle_sampler
    monkeypatch.setattr(statesampler.StateSampler, "__init__", _other_shape)
    bundle_sampler.install()
    _assert_kept(statesampler.StateSampler, "__init__", kept_lines)


def test_dofn_specs_keeps_beams_check(monkeypatch, kept_lines):
    from apache_beam.transforms import userstate

    from dpsynth.pipelines.runners import dofn_specs
    monkeypatch.setattr(userstate, "get_dofn_specs", _other_shape)
    dofn_specs.install()
    _assert_kept(userstate, "get_dofn_specs", kept_lines)
    assert userstate.get_dofn_specs(object()) == "beam's"


def test_option_views_keeps_beams_view_as(monkeypatch, kept_lines):
    from apache_beam.options.pipeline_options import PipelineOptions

    from dpsynth.pipelines.runners import option_views

    def view_as(self, cls):  # right parameters, other attributes
        return cls(self._other_store)
    monkeypatch.setattr(PipelineOptions, "view_as", view_as)
    option_views.install()
    _assert_kept(PipelineOptions, "view_as", kept_lines, fake=view_as)


def test_ipython_check_keeps_beams_check(monkeypatch, kept_lines):
    from apache_beam.utils import interactive_utils

    from dpsynth.pipelines.runners import ipython_check
    monkeypatch.setattr(interactive_utils, "is_in_ipython", _other_shape)
    ipython_check.install()
    _assert_kept(interactive_utils, "is_in_ipython", kept_lines)


def test_parallel_shutdown_keeps_beams_close(monkeypatch, kept_lines):
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    from dpsynth.pipelines.runners import parallel_shutdown

    def close_all(self):  # right parameters, other attributes
        self._handlers_elsewhere.clear()
    monkeypatch.setattr(worker_handlers.WorkerHandlerManager, "close_all",
                        close_all)
    parallel_shutdown.install()
    _assert_kept(worker_handlers.WorkerHandlerManager, "close_all",
                 kept_lines, fake=close_all)


def test_skip_empty_bundles_keeps_beams_bundles(monkeypatch, kept_lines):
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    from dpsynth.pipelines.runners import skip_empty_bundles
    monkeypatch.setattr(fn_runner.ParallelBundleManager, "process_bundle",
                        _other_shape)
    skip_empty_bundles.install()
    _assert_kept(fn_runner.ParallelBundleManager, "process_bundle",
                 kept_lines)


def test_worker_fork_keeps_beams_worker_start(monkeypatch, kept_lines):
    from apache_beam.runners.portability import local_job_service

    from dpsynth.pipelines.runners import direct_runner
    launcher = types.SimpleNamespace(Popen=_other_shape)  # not subprocess
    monkeypatch.setattr(local_job_service, "subprocess", launcher)
    direct_runner.install()
    _assert_kept(local_job_service, "subprocess", kept_lines, fake=launcher)


def test_dask_workaround_keeps_beams_bundle_function(monkeypatch,
                                                     kept_lines):
    pytest.importorskip("distributed", reason="the dask extra is not "
                        "installed")
    from apache_beam.runners.dask import transform_evaluator

    from dpsynth.pipelines.runners.dask import runner as dask_runner
    monkeypatch.setattr(transform_evaluator, "apply_dofn_to_bundle",
                        _other_shape)
    dask_runner.install_workaround()
    _assert_kept(transform_evaluator, "apply_dofn_to_bundle", kept_lines)


def test_dask_translations_keep_beams_translation(monkeypatch, kept_lines):
    pytest.importorskip("distributed", reason="the dask extra is not "
                        "installed")
    import apache_beam as beam
    from apache_beam.runners.dask import transform_evaluator

    from dpsynth.pipelines.runners.dask import runner as dask_runner

    class OtherParDo:  # another Beam's translation
        pass
    monkeypatch.setitem(transform_evaluator.TRANSLATIONS, beam.ParDo,
                        OtherParDo)
    dask_runner.install_translations()
    assert transform_evaluator.TRANSLATIONS[beam.ParDo] is OtherParDo
    assert [line for line in kept_lines() if "ParDo" in line]


def test_a_patch_installs_where_beam_has_the_measured_shape(monkeypatch,
                                                             kept_lines):
    """The negative control: the same checks pass on this Beam."""
    owner = types.SimpleNamespace()

    def measured(dofn):
        return dofn
    owner.f = measured
    beams = beam_patch.replace_once(owner, "f", lambda b: lambda d: b(d),
                                    fits=beam_patch.takes("dofn"))
    assert beams is measured and owner.f is not measured
    from dpsynth.pipelines.runners import (temp_cleanup, bundle_sampler,
                                           direct_runner, dofn_specs,
                                           ipython_check, option_views)
    for install in (temp_cleanup._install, bundle_sampler.install,
                    direct_runner.install, dofn_specs.install,
                    ipython_check.install, option_views.install):
        install()  # this Beam (the one measured): every patch goes in
    assert not kept_lines()
