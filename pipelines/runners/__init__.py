"""Beam and Dask adaptation layer: each module patches or replaces one Beam
or Dask internal, says which versions it was measured on, and falls back to
Beam's own behaviour where the internals differ."""
