"""dpsynth models."""
