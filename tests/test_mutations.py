"""Privacy mutations in CI (issue 54 item 4): every mutation listed in
tests/mutations.py must make its catching tests fail.

One copy of the repo, the mutations one after the other, each running only
its catchers (``-x -q``). About 3-4 minutes on 2 cores; marked
``mutations`` (deselect with ``-m 'not mutations'``). The catchers' passing
on the unmutated code is the rest of the suite's job (``python -m
tests.mutations`` checks it first when run by hand).
"""

from __future__ import annotations

import pytest

from tests import mutations


def test_every_mutation_target_is_in_the_code():
    """Loud and fast: a patch whose target text moved fails here, naming
    the mutation and its file:function, before any slow run."""
    for m in mutations.MUTATIONS + mutations.PENDING:
        text = (mutations.ROOT / m.path).read_text()
        assert text.count(m.old) == 1, (
            f"mutation {m.name}: target text gone from {m.where}; update "
            f"tests/mutations.py")
        assert m.catchers or m in mutations.PENDING, m.name


@pytest.mark.mutations
def test_every_privacy_mutation_is_caught(tmp_path):
    outcomes = mutations.run_all(mutations.MUTATIONS, workdir=tmp_path,
                                 baseline=False)
    missed = [f"{o.mutation.name} ({o.mutation.where}): {o.tail}"
              for o in outcomes if not o.caught]
    assert not missed, "mutations the tests did not catch:\n" + "\n".join(
        missed)
