"""Measurements of dpsynth (see each module's docstring)."""


def publish(text: str, results: str, save: bool) -> None:
    """Prints a benchmark's report and, with ``save``, appends it to its
    results file."""
    print(text)
    if save:
        with open(results, "a") as f:
            f.write(text)
