"""Running a Beam pipeline without leaving temporary files behind.

Beam leaves some of its temporary folders in the system's temporary
directory: the pipeline's own local folder when its build stops before
``run()`` (Ctrl-C, bad input found while building), and, on the portable
runners (Prism, Flink, Spark), an empty folder for each environment it
builds (``environments.python_sdk_dependencies``: four a job on Prism)
plus an empty ``beam-requirements-cache``; and a job server's folder when
its start is interrupted (Ctrl-C while Prism starts: Beam removes it only
at the exit of a job server that started). A nightly job would pile them
up; ``pipeline_run`` removes them when the pipeline ends.

Measured on Beam 2.77 (Prism, the Ctrl-C fuzz of
benchmarks/results/interrupt_fuzz.md): four empty folders a job and a job
server's folder per interrupted start, none with the patch. What it buys
is a clean ``/tmp``, not time. Where Beam's environment builder or job
server start has another signature (or the start no longer keeps
``_local_temp_root``), that hook is not installed: Beam's own behaviour
(the folders left) and one debug line (``beam_patch.kept``).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import tempfile
from typing import Iterator, Optional

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from dpsynth.pipelines.runners.runner_names import JobServerFailed
from dpsynth.pipelines.runners.beam_patch import (all_of, reads, replace_once,
                                                  takes)

# The folder this context's pipeline puts Beam's dependency folders in.
_scratch: contextvars.ContextVar[Optional[str]] = contextvars.ContextVar(
    "dpsynth_beam_scratch", default=None)


@contextlib.contextmanager
def pipeline_run(options: PipelineOptions) -> Iterator[beam.Pipeline]:
    """A pipeline to build in the block; on leaving it, runs it to the end.
    Its temporary folders go whatever happens (see the module docstring)."""
    _install()
    cache = os.path.join(tempfile.gettempdir(), "beam-requirements-cache")
    had_cache = os.path.exists(cache)
    scratch = tempfile.mkdtemp(prefix="dpsynth-beam-")
    token = _scratch.set(scratch)
    try:
        p = beam.Pipeline(options=options)
        try:
            yield p
            p.run().wait_until_finish()
        finally:
            shutil.rmtree(p.local_tempdir, ignore_errors=True)
    finally:
        _scratch.reset(token)
        shutil.rmtree(scratch, ignore_errors=True)
        if not had_cache:
            with contextlib.suppress(OSError):  # kept if Beam filled it
                os.rmdir(cache)


def _install() -> None:
    """Points Beam's environment builder at the current pipeline's scratch
    folder (outside ``pipeline_run`` it is Beam's), and has a job server
    whose start failed remove its folder and say so in one line
    (``runner_names.JobServerFailed``; each once per process)."""
    from apache_beam.runners.portability import job_server
    from apache_beam.transforms import environments
    replace_once(environments, "python_sdk_dependencies", _in_scratch,
                 fits=takes("options", "tmp_dir"))
    replace_once(job_server.SubprocessJobServer, "start", _cleaned_start,
                 fits=all_of(takes("self"), reads("_local_temp_root")))


def _in_scratch(beams):
    def python_sdk_dependencies(options, tmp_dir=None):
        scratch = _scratch.get()
        if tmp_dir is None and scratch is not None:
            tmp_dir = tempfile.mkdtemp(dir=scratch)
        return beams(options, tmp_dir)
    return python_sdk_dependencies


def _cleaned_start(beams):
    def start(self):
        try:
            return beams(self)
        except BaseException as err:
            if self._local_temp_root:
                shutil.rmtree(self._local_temp_root, ignore_errors=True)
                self._local_temp_root = None
            if isinstance(err, Exception) and not _stopped(err):
                raise JobServerFailed(type(self).__name__, err) from err
            raise  # Ctrl-C keeps its own one line and exit 130
    return start


def _stopped(err: BaseException) -> bool:
    """Whether a failed start was Ctrl-C (or SIGTERM) in another form."""
    from dpsynth.pipelines import console
    return console.interrupted(err) or console.ctrl_c_pressed()
