"""Privacy mutations in CI (issue 54 item 4): every mutation listed in
tests/mutations.py must make its catching tests fail.

One copy of the repo, the mutations one after the other, each running only
its catchers (``-x -q``), after every catcher has passed once on the
unmutated copy (a catcher that fails anyway catches nothing). About 4-5
minutes on 2 cores; marked ``mutations`` (deselect with ``-m 'not
mutations'``).
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
                                 baseline=True)
    missed = [f"{o.mutation.name} ({o.mutation.where}): {o.tail}"
              for o in outcomes if not o.caught]
    assert not missed, "mutations the tests did not catch:\n" + "\n".join(
        missed)


def test_a_catcher_failing_on_clean_code_is_not_a_catch(tmp_path):
    """A mutation whose catcher fails without it is refused, not counted."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fake.py").write_text(
        "def test_fails():\n    assert False\n")
    m = mutations.Mutation("always-fails", "tests/test_fake.py:test_fails",
                           "assert False", "assert False",
                           ("tests/test_fake.py::test_fails",))
    with pytest.raises(mutations.CatcherFailsOnCleanCode,
                       match="test_fails.*always-fails"):
        mutations.check_baseline(tmp_path, [m])
