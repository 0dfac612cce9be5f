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
    """Loud and fast: a mutation whose function is gone, whose anchor is
    not once in that function, or whose patch changes no code fails here,
    naming the mutation and its file:function, before any slow run."""
    for m in mutations.MUTATIONS + mutations.PENDING:
        mutations.patched((mutations.ROOT / m.path).read_text(), m)
        assert m.catchers or m in mutations.PENDING, m.name


MODULE = """\
def release(exact, mech, noise, name, grid):
    # the noise of one mechanism
    return noise.add(exact, mech.sigma, name,
                     grid)


def other(exact, mech, noise, name, grid):
    return 0
"""
SIGMA = mutations.Mutation(
    "sigma-x0.1", "m.py:release",
    "    return noise.add(exact, mech.sigma, name,\n",
    "    return noise.add(exact, mech.sigma * 0.1, name,\n", ("t",))


def test_a_target_follows_its_function_not_its_line():
    """Re-wrapped, re-indented (moved into a class) or moved down the
    file, the anchor is still found and the patch still lands."""
    rewrapped = MODULE.replace("noise.add(exact, mech.sigma, name,",
                               "noise.add(\n        exact, mech.sigma,\n"
                               "        name,")
    assert "mech.sigma * 0.1" in mutations.patched(rewrapped, SIGMA)
    nested = "class Mech:\n" + "".join(
        "    " + line if line.strip() else line
        for line in MODULE.splitlines(keepends=True))
    method = dataclasses_replace(SIGMA, where="m.py:Mech.release")
    out = mutations.patched(nested, method)
    assert "        return noise.add(exact, mech.sigma * 0.1, name," in out
    compile(out, "m.py", "exec")  # indentation kept
    moved = "X = 1\n\n\n" + MODULE.split("\n\n\n")[1] + "\n\n" + \
        MODULE.split("\n\n\n")[0] + "\n"
    assert "mech.sigma * 0.1" in mutations.patched(moved, SIGMA)


def test_the_same_text_in_another_function_does_not_count():
    """The anchor moved out of the named function (the behaviour now lives
    elsewhere): gone, even though the file still holds the text once."""
    line = "    return noise.add(exact, mech.sigma, name,\n                     grid)\n"
    swapped = MODULE.replace(line, "    return 0\n").replace(
        "def other(exact, mech, noise, name, grid):\n    return 0\n",
        "def other(exact, mech, noise, name, grid):\n" + line)
    assert swapped.count("mech.sigma, name") == 1
    with pytest.raises(mutations.MutationTargetGone, match="sigma-x0.1"):
        mutations.patched(swapped, SIGMA)
    renamed = MODULE.replace("def release(", "def release_noise(")
    with pytest.raises(mutations.MutationTargetGone, match="no function"):
        mutations.patched(renamed, SIGMA)


def test_a_patch_that_changes_no_code_is_refused():
    comment = mutations.Mutation("comment-only", "m.py:release",
                                 "# the noise of one mechanism",
                                 "# no noise at all", ("t",))
    with pytest.raises(mutations.MutationNoOp, match="comment-only"):
        mutations.patched(MODULE, comment)


def dataclasses_replace(m, **changes):
    import dataclasses
    return dataclasses.replace(m, **changes)


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
