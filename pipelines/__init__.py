"""dpsynth pipelines."""
