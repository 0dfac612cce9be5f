"""Test-only Dask worker preload (tests/test_hosts.py): a deterministic
moment to kill a worker host in the middle of a step.

``dask worker ... --preload host_faults`` wraps dpsynth's Dask bundle
function. Inert until the launcher writes ``/tmp/dpsynth-fault`` in the
host (its private /tmp): ``<step> <when>`` (the test arms one host). Then the
host's first bundle of a step whose name contains ``<step>`` writes
``/tmp/dpsynth-fault-hit`` (once per host); with ``when`` =
``before`` or ``after`` it then hangs until the test kills the host,
before running the bundle or after it (its outputs written but not
returned); with ``mark`` it waits 3 s (the test acts meanwhile) and runs.
"""

import os
import time

from dpsynth.pipelines.runners.dask import runner as dask_runner

ARM = "/tmp/dpsynth-fault"
HIT = "/tmp/dpsynth-fault-hit"
_original = dask_runner.apply_dofn_to_bundle


def _armed(step_name: str):
    """(step, when) when this bundle takes the fault, else None."""
    if os.path.exists(HIT):
        return None
    try:
        with open(ARM) as f:
            step, when = f.read().split()
    except (OSError, ValueError):
        return None
    return (step, when) if step in step_name else None


def _hang() -> None:
    while True:
        time.sleep(60)


def apply_dofn_to_bundle(items, invoker_args, invoker_kwargs, receivers):
    armed = _armed(dask_runner._step_name(invoker_args))
    if armed is None:
        return _original(items, invoker_args, invoker_kwargs, receivers)
    with open(HIT, "w") as f:
        f.write(armed[0])
    when = armed[1]
    if when == "mark":
        time.sleep(3)
    elif when == "before":
        _hang()
    result = _original(items, invoker_args, invoker_kwargs, receivers)
    if when == "after":
        _hang()
    return result


# the task graph names dpsynth's function: unpickled here, it is this one
dask_runner.apply_dofn_to_bundle = apply_dofn_to_bundle
