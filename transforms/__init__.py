"""dpsynth transforms."""
