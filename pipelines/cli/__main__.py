"""``python -m dpsynth.pipelines.cli``: the ``dpsynth`` command."""

from dpsynth.pipelines.cli import run

if __name__ == "__main__":  # not when a spawned process re-imports __main__
    run()
