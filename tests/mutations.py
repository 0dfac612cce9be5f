"""Privacy mutations: break one privacy behaviour in a copy of the repo and
check that the tests meant to catch it fail (issue 54).

Each mutation names one function (``where``: "file.py:Class.method") and
an anchor inside it (``old``), which ``new`` replaces. The anchor follows
the code, not a line of text (issue 71):

* it is looked for only inside the named function, found by its AST node
  (``locate``), so the same text elsewhere in the file never counts and
  the function may move or be renamed around without losing its patch;
* whitespace in it is free: re-wrapping or re-indenting the line keeps
  the anchor (``new`` is re-indented to where the anchor is found);
* the patch must change the function's code (its AST), else it is refused
  (``MutationNoOp``): a patch that now only touches a comment, or text
  the function no longer runs, would break nothing and prove nothing.

A function renamed, or an anchor gone from it (or found twice), fails
loudly (``MutationTargetGone``) naming the mutation: update the patch and
its catchers rather than dropping it. The copy runs only the named
catching tests (``-x -q``, PYTHONPATH at the copy), one mutation after
the other.

ADD TO THIS LIST WHENEVER A PRIVACY PATH IS ADDED: a new mechanism, a new
step after a mechanism, a new check of the budget store, the attempt
protocol or the release. Pick catchers that take seconds.

    python -m tests.mutations            # all, prints the table
    python -m tests.mutations --only vote-exact-votes
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent


class MutationTargetGone(RuntimeError):
    """A mutation's function is not in its file, or its anchor is not
    (exactly once) in that function."""


class MutationNoOp(RuntimeError):
    """A mutation that leaves its function's code (its AST) unchanged."""


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    where: str  # "file.py:function", the one function the patch changes
    old: str
    new: str
    catchers: tuple[str, ...]  # pytest node ids that must fail

    @property
    def path(self) -> str:
        return self.where.split(":")[0]

    @property
    def function(self) -> str:
        return self.where.split(":", 1)[1]


UNITS = "tests/test_post_processing_units.py::"
STORE = "tests/test_budget_store.py::"
OWNERSHIP = "tests/test_attempt_ownership.py::"
WRITTEN = "tests/test_written_digests.py::"

MUTATIONS: tuple[Mutation, ...] = (
    # --- noise and calibration
    # (calibration itself certifies its sigmas with dp_accounting and
    # shrinks mu until they meet the target: a wrong sigma there is
    # re-calibrated away; the noise drawn is what must match the ledger)
    Mutation("sigma-x0.1", "dp_ops/generator.py:add_noise",
             "    return noise.add(exact, mech.sigma, name,",
             "    return noise.add(exact, mech.sigma * 0.1, name,",
             ("tests/test_audit.py::"
              "test_noise_bound_stays_below_the_claimed_epsilon[1.0]",)),
    Mutation("sigma-x0.5", "dp_ops/generator.py:add_noise",
             "    return noise.add(exact, mech.sigma, name,",
             "    return noise.add(exact, mech.sigma * 0.5, name,",
             ("tests/test_audit.py::"
              "test_noise_bound_stays_below_the_claimed_epsilon[1.0]",)),
    Mutation("noise-dropped", "dp_ops/noise.py:KeyedNoise.add",
             "total = steps + k.astype(np.float64)", "total = steps",
             ("tests/test_noise.py::"
              "test_add_is_exact_on_the_grid_and_refuses_off_grid_values",)),
    Mutation("pipelinedp-sums-exact",
             "transforms/pipelinedp.py:KeyedSumCombiner.compute_metrics",
             "        return self._release(self._ledger, self._noise,\n"
             "                             plan.name(label, self._family), total)",
             "        return total",
             ("tests/test_pipelinedp.py::test_class_counts_byte_identical",)),
    Mutation("no-clipping", "dp_ops/clipping.py:_clip_scale",
             "over = norms > clip_norm", "over = norms > np.inf",
             ("tests/test_clipping.py::"
              "test_clip_bounds_every_row_and_counts_clipped",)),
    Mutation("phase-1-counts-exact", "dp_ops/adaptive/ledgers.py:noisy_counts",
             "    return np.array([generator.add_noise(ledger, noise, "
             "count_name(c),",
             "    return np.asarray(exact, np.float64)\n"
             "    return np.array([generator.add_noise(ledger, noise, "
             "count_name(c),",
             ("tests/test_adaptive.py::"
              "test_ledger_lists_exactly_the_mechanisms_that_ran[shared]",)),
    Mutation("mechanism-missing-from-manifest",
             "dp_ops/ledger.py:PrivacyLedger.to_manifest",
             '"mechanisms": [m.to_dict() for m in self.mechanisms],',
             '"mechanisms": [m.to_dict() for m in self.mechanisms][1:],',
             ("tests/test_ledger.py::test_manifest_lists_every_mechanism",)),
    # --- steps after the mechanisms use only released values
    Mutation("tree-branches-on-exact-counts", "dp_ops/lsh_tree.py:build_tree",
             "branching = [k for k, v in zip(keys, released) if v >= threshold]",
             "branching = [k for k, v in zip(keys, values) if v >= threshold]",
             (UNITS + "test_tree_shape_is_a_function_of_the_released_level_counts",
              "tests/test_lsh_tree.py::test_branching_uses_only_noisy_counts")),
    Mutation("coreset-exact-leaf-sums", "dp_ops/generator.py:coreset_centres",
             "    points = sums[keep] / counts[keep, None]",
             "    points = exact_leaf_sums[keep] / counts[keep, None]",
             (UNITS + "test_coreset_centres_use_only_the_released_leaf_sums",)),
    Mutation("lloyd-exact-counts-sums", "dp_ops/generator.py:lloyd_update",
             "    return kmeans.update_centres(counts, sums, centres, min_count)",
             "    return kmeans.update_centres(exact_counts, exact_sums, "
             "centres, min_count)",
             (UNITS + "test_lloyd_moves_centres_with_the_released_counts_and_sums",)),
    Mutation("moments-exact", "dp_ops/generator.py:add_moment_noise",
             "        return add_noise(ledger, noise, name, getattr(exact, field))",
             "        add_noise(ledger, noise, name, getattr(exact, field))\n"
             "        return getattr(exact, field)",
             (UNITS + "test_mixture_uses_only_the_released_moments",)),
    Mutation("second-moment-exact-diagonal",
             "dp_ops/generator.py:noisy_second_moment",
             "    out[np.diag_indices(d)] = noise.add(np.diag(exact), sigma,",
             "    out[np.diag_indices(d)] = np.diag(exact) + 0 * noise.add("
             "np.diag(exact), sigma,",
             (UNITS + "test_covariance_factors_use_only_the_released_second_moment",)),
    # The studies' all-class post-processing (benchmarks/studies/
    # class_deviations.py, "shrunk") through the reference's class_post
    # hook, since issue 73 not in the product's code.
    Mutation("shrunk-weights-from-exact-moments",
             "benchmarks/reference.py:_adaptive_mixtures",
             "        return per_class_mixtures(released, noisy_n, n, means, "
             "centre,",
             "        if class_post is not None:\n"
             "            released = [0 * r + e for r, e in zip(released, "
             "exact_m)]\n"
             "        return per_class_mixtures(released, noisy_n, n, means, "
             "centre,",
             (UNITS + "test_shrunk_class_matrices_use_only_the_released_values",)),
    Mutation("vote-exact-votes", "dp_ops/generator.py:vote_copies",
             "    return vote.resample_copies(noisy, rows, rng)",
             "    return vote.resample_copies(exact_votes, rows, rng)",
             (UNITS + "test_vote_filter_keeps_candidates_by_the_released_votes",)),
    Mutation("vote-threshold-exact-votes", "dp_ops/generator.py:vote_copies",
             "        return vote.keep_mask(noisy, cfg.vote_threshold)"
             ".astype(np.int64)",
             "        return vote.keep_mask(exact_votes, cfg.vote_threshold)"
             ".astype(np.int64)",
             (UNITS + "test_vote_filter_keeps_candidates_by_the_released_votes",)),
    # --- the vote's signal rule: what the manifest says is what ran
    Mutation("vote-rule-ignored", "dp_ops/adaptive/ledgers.py:resolve_vote",
             "    return (cfg if runs else dataclasses.replace(cfg, "
             "vote_filter=False)), note",
             "    return cfg, note",
             ("tests/test_vote_resample.py::"
              "test_a_skipped_vote_releases_the_plain_release",
              "tests/test_vote_resample.py::"
              "test_the_vote_runs_only_where_its_histogram_can_carry_signal")),
    # --- the noise key stays out of the job graph
    Mutation("key-pickled-with-the-reference",
             "transforms/keyed_noise.py:StoredKeyNoise.__getstate__",
             'return {"uri": self._uri}  # never the key',
             'return {"uri": self._uri, "key": self._key}',
             ("tests/test_noise_key_location.py::"
              "test_only_the_reference_is_pickled_and_draws_are_the_keys",)),
    Mutation("key-left-in-the-graph", "pipelines/graph.py:store_noise_key",
             "    job.noise = StoredKeyNoise(uri, key)\n",
             "",
             ("tests/test_noise_key_location.py::"
              "test_the_launcher_gives_the_job_a_reference_not_the_key",)),
    Mutation("key-folder-open-to-others",
             "transforms/keyed_noise.py:check_key_folder",
             "    if info.st_mode & 0o066:", "    if False:",
             ("tests/test_noise_key_location.py::"
              "test_a_key_folder_others_can_read_or_write_is_refused_before_"
              "any_data[493]",)),
    # --- the lifetime budget store and the attempt protocol
    Mutation("label-rule-not-pinned", "pipelines/budget/label_rule.py:_pin_label_rule",
             "    if rule is None:\n        return\n",
             "    return\n",
             ("tests/test_label_rule.py::"
              "test_the_store_pins_the_rule_at_the_first_release[local]",)),
    Mutation("no-charge-recorded", "pipelines/budget/store.py:reserve",
             '        doc["releases"].append(entry)\n', "",
             (STORE + "test_refuses_over_the_cap_and_writes_nothing[local]",)),
    Mutation("cap-ignores-prior-spend", "pipelines/budget/store.py:reserve",
             'spent = _compose(doc["releases"] + [entry], cap_delta, accountant)',
             'spent = _compose([entry], cap_delta, accountant)',
             (STORE + "test_refuses_over_the_cap_and_writes_nothing[local]",)),
    Mutation("no-owner-check", "pipelines/budget/ownership.py:_check_owner",
             '    if entry.get("owner") not in (None, reservation.owner) or (',
             '    if False and (',
             (STORE + "test_retry_before_any_data_was_read_spends_nothing"
              "[local]",)),
    Mutation("no-live-lease-check", "pipelines/budget/ownership.py:_check_retry",
             "            and lease_left > 0):",
             "            and lease_left > 0 and False):",
             (OWNERSHIP + "test_a_launch_whose_lease_ran_out_can_change_nothing",)),
    # --- one run id, one release
    Mutation("publish-over-same-run-id", "pipelines/release/publisher.py:_is_published",
             '    if current.get("run_id") == run_id:',
             "    if False:",
             (OWNERSHIP + "test_one_run_id_never_replaces_its_own_release",)),
    Mutation("publish-unrecorded-manifest",
             "pipelines/release/publisher.py:_pinned_manifest",
             "    if sha256 is not None and hashlib.sha256(data).hexdigest() "
             "!= sha256:",
             "    if False:",
             ("tests/test_integrity_attacks.py::"
              "test_a_manifest_rewritten_after_it_was_recorded_local",)),
    Mutation("latest-names-a-non-private-release",
             "pipelines/release/reading.py:load_latest",
             '    if pinned.get("private") is not True:', "    if False:",
             ("tests/test_latest_digest.py::"
              "test_latest_edited_to_name_a_non_private_release_is_refused",)),
    Mutation("sample-claims-private", "pipelines/release/sample.py:sample_manifest",
             '    private = src.get("private") is True\n',
             "    private = True\n",
             ("tests/test_sample.py::"
              "test_the_sample_claims_what_its_source_claims[sample_source]",)),
    # --- the release's files: digests from the writers (issue 58)
    # The writers' record and phase 1's counts share one tagged-record
    # reader (digests.tagged_payload): its check, dropped, is caught by the
    # record's tests here and by phase 1's (round 5) ones.
    Mutation("digest-record-unauthenticated",
             "transforms/digests.py:tagged_payload",
             "                and hmac.compare_digest(tag, hmac_tag(key, signed))):",
             "                ):",
             (WRITTEN + "test_the_record_is_bound_to_the_run_key_and_staging_folder",
              WRITTEN + "test_shards_rewritten_after_the_writers_are_never_"
              "published[local-pipeline-done]")),
    Mutation("staged-manifest-digest-read-back",
             "pipelines/release/protocol.py:publish_attempt",
             "            # One digest from here on: the one written (or "
             "recorded) is the\n            # one published.\n",
             "            digest = release.manifest_digest(job.staging)\n",
             (WRITTEN + "test_shards_rewritten_after_the_writers_are_never_"
              "published[local-staged]",)),
    Mutation("verify-sizes-only", "pipelines/release/release.py:verify_files",
             "    if not problems and contents:\n",
             "    if False:\n",
             (WRITTEN + "test_a_flipped_byte_is_refused_by_verify_and_readers"
              "[local]",)),
    # Issue 60 item 4: GCS objects are checked by the store's md5s, and a
    # local publish hashes each file once, after placing it.
    Mutation("store-md5-not-compared",
             "pipelines/release/release.py:_differing",
             "    problems = [f\"{n} differs (md5)\" for n in by_store\n"
             "                if stored[n][1] != files[n][\"md5\"]]",
             "    problems = []",
             ("tests/test_publish_reads.py::"
              "test_a_same_size_rewrite_on_gcs_differs_in_md5",)),
    Mutation("placed-files-unchecked", "pipelines/release/publisher.py:_switch",
             "                verify_files(root, manifest)\n",
             "                pass\n",
             (WRITTEN + "test_a_flipped_byte_is_refused_by_publish[local]",
              "tests/test_publish_reads.py::"
              "test_a_local_publish_hashes_each_file_once")),
    Mutation("latest-ignores-the-store", "deploy/publish.py:summary",
             "    if budget_store is not None:\n        _check_recorded(",
             "    if False:\n        _check_recorded(",
             (WRITTEN + "test_latest_json_pins_only_the_manifest_the_store_"
              "recorded[local]",)),
    Mutation("placed-as-hard-link", "pipelines/release/publisher.py:_move",
             "        os.replace(src, dst)\n",
             "        os.link(src, dst)\n",
             (WRITTEN + "test_a_staged_file_rewritten_after_an_api_publish"
              "[local]",)),
    # --- the staged release's consistency check
    Mutation("check-staged-noop", "pipelines/release/consistency.py:check_staged",
             "    labels = [c[\"label\"] for c in summary]\n",
             "    return\n    labels = [c[\"label\"] for c in summary]\n",
             ("tests/test_consistency.py::"
              "test_a_shard_with_a_row_fewer_is_refused",
              "tests/test_consistency.py::test_a_missing_shard_is_refused")),
    # --- engines
    Mutation("dask-reshuffle-noop", "pipelines/runners/dask/runner.py:DaskRunner.to_dask_bag_visitor",
             "                if isinstance(node.transform, _Reshuffle):",
             "                if False:",
             ("tests/test_dask.py::test_one_file_is_read_by_both_workers",)),
)

# Issue 71 (round 5): the store, the readers and `dpsynth sample`.
ROUND5 = "tests/test_release_round5.py::"
MUTATIONS += (
    Mutation("unlabelled-store-pins-any-rule",
             "pipelines/budget/label_rule.py:_pin_label_rule",
             "        _check_unlabelled(doc, store_uri, rule)\n", "",
             (ROUND5 + "test_an_unlabelled_document_pins_no_rule_it_cannot_"
              "check[local-rule0]",)),
    Mutation("lifetime-delta-unbounded",
             "pipelines/budget/record.py:_check_cap",
             "    if not 0 < lifetime_delta <= MAX_DELTA:  # also rejects NaN\n",
             "    if not 0 < lifetime_delta < 1:\n",
             (ROUND5 + "test_a_cap_of_delta_half_admits_no_release[local]",)),
    Mutation("lifetime-epsilon-unbounded",
             "pipelines/budget/record.py:_check_cap",
             "            and 0 < lifetime_epsilon <= MAX_EPSILON):",
             "            and 0 < lifetime_epsilon):",
             (ROUND5 + "test_a_cap_out_of_the_run_bounds_is_refused"
              "[local-1001.0-1e-05---lifetime-epsilon]",)),
    Mutation("reader-parses-a-second-read",
             "pipelines/release/reading.py:_all_blocks",
             "                for x, y in blocks_of(shard, data)]\n",
             "                for x, y in blocks_of(shard)]\n",
             (ROUND5 + "test_a_shard_swapped_after_its_check_is_never_"
              "returned[local-load_release]",
              "tests/test_read_release.py::test_a_shard_is_parsed_from_the_"
              "bytes_it_was_checked_on[sample_source]")),
    Mutation("sample-overlap-by-spelling-only",
             "pipelines/release/sample.py:_check_apart",
             "            or _same_tree(source, output)):", "            ):",
             (ROUND5 + "test_sample_output_through_another_path_to_the_"
              "source_is_refused[self]",)),
    Mutation("sample-rows-unbounded-by-source",
             "pipelines/release/sample.py:run",
             "    _check_rows(spec, len(mixes))\n", "",
             (ROUND5 + "test_sample_rows_are_bounded_in_one_line",)),
    # --- the engine boundary (issue 70)
    Mutation("dask-compat-noop", "pipelines/runners/dask/compat.py:refusal",
             "    if not differ:\n        return None",
             "    if True:\n        return None",
             ("tests/test_beam_range.py::"
              "test_an_unforeseen_beam_stops_dask_before_the_budget_is_reserved",)),
    Mutation("dask-forget-noop",
             "pipelines/runners/dask/runner.py:forget_on_workers",
             "        client.run(forget_run)", "        pass",
             ("tests/test_dask.py::"
              "test_no_key_or_step_argument_is_left_in_the_workers_after_a_run",)),
    Mutation("dask-task-identity-noop",
             "pipelines/runners/dask/cluster.py:check_this_worker",
             "    if not ok:\n        raise ClusterMismatch(",
             "    if False:\n        raise ClusterMismatch(",
             ("tests/test_dask.py::"
              "test_a_task_on_a_worker_unlike_the_launcher_refuses_before_its_rows",)),
    Mutation("dask-local-cluster-without-tls",
             "pipelines/runners/dask/cluster.py:_LocalCluster.__init__",
             'host="127.0.0.1", protocol="tls://",\n'
             '                    security=self.security, ',
             'host="127.0.0.1", ',
             ("tests/test_dask.py::"
              "test_the_local_cluster_refuses_a_client_without_its_certificate",)),
    Mutation("dask-worker-elsewhere-noop",
             "pipelines/runners/dask/cluster.py:check_workers",
             "    if not (secure and off):\n        return",
             "    if True:\n        return",
             ("tests/test_cluster_boundary.py::"
              "test_a_secure_run_with_a_worker_elsewhere_needs_the_key_and_tls",)),
    Mutation("dataset-sets-operator-options",
             "deploy/runner_trust.py:refuse_operator_only",
             "        if option is not None:\n            raise ValueError(",
             "        if False:\n            raise ValueError(",
             ("tests/test_runner_trust.py::"
              "test_the_reviews_examples_are_refused_in_their_own_spellings",)),
    Mutation("input-not-bound-to-dataset",
             "deploy/airflow/dpsynth_nightly.py:check_input",
             "    if scheme != pinned_scheme or segments[:len(pinned)] != pinned:",
             "    if False:",
             ("tests/test_runner_trust.py::"
              "test_an_input_outside_the_pinned_prefix_is_refused",)),
    Mutation("charged-dim-from-a-row",
             "pipelines/job_plan.py:check_input_schema",
             "dim_from_rows=spec.budget.store is None)",
             "dim_from_rows=True)",
             ("tests/test_input_columns.py::"
              "test_a_charged_release_takes_no_dimension_from_a_row",)),
    Mutation("input-schema-after-the-charge", "pipelines/job.py:_run",
             "    job_plan.check_input_schema(job, spec)\n", "",
             ("tests/test_input_columns.py::"
              "test_a_charged_release_takes_no_dimension_from_a_row",)),
)

# Issue 71 items 3, 5, 6 and the suite's gaps (tests/test_round5_proofs.py).
PROOFS = "tests/test_round5_proofs.py::"
MUTATIONS += (
    Mutation("phase1-read-untagged", "transforms/two_phase.py:read_phase1",
             'doc = digests.tagged_payload(path, "doc", key, ("path", path))',
             'doc = json.loads(open(path).read())["doc"]  # unverified',
             (PROOFS + "test_phase1_replaced_before_its_read_is_never_"
              "published[tagged-local]",)),
    Mutation("record-key-derived-at-graph-build",
             "transforms/write.py:WriteRelease.expand",
             "        return (mixtures\n"
             "                | \"WriteSummary\" >> beam.Map(\n"
             "                    lambda mixes, info: _write_summary(\n"
             "                        staging, mixes, info, schema(mixes),\n"
             "                        None if noise is None\n"
             "                        else noise.derived_key(digests.PURPOSE)),",
             "        record_key = (None if noise is None\n"
             "                      else noise.derived_key(digests.PURPOSE))\n"
             "        return (mixtures\n"
             "                | \"WriteSummary\" >> beam.Map(\n"
             "                    lambda mixes, info: _write_summary(\n"
             "                        staging, mixes, info, schema(mixes),\n"
             "                        record_key),",
             (PROOFS + "test_the_record_key_never_travels_in_the_job_graph"
              "[shared]",)),
    Mutation("image-rule-from-the-embedding-input", "pipelines/job_plan.py:label_rule",
             '        rule = {"label_feature": images.label_feature or "label"}',
             '        rule = {"label_feature": spec.input.label_feature}',
             (PROOFS + "test_an_image_run_pins_the_images_label_feature"
              "[local]",)),
    Mutation("version-folder-extras-allowed",
             "pipelines/release/publisher.py:_switch",
             "                verify_files(root, manifest)\n",
             "                verify_files(root, manifest, "
             "names=list(manifest[\"files\"]))\n",
             (PROOFS + "test_a_file_planted_in_the_version_folder_is_never_"
              "published[local]",)),
    Mutation("published-read-from-the-folder", "pipelines/job_plan.py:_published_by",
             "    if store is None:\n",
             "    if True:\n        return \"published\"\n    if store is None:\n",
             (PROOFS + "test_a_planted_manifest_naming_the_run_is_not_"
              "already_published[False-local]",)),
    Mutation("copied-manifest-counts-as-published",
             "pipelines/release/publisher.py:_switch",
             "                    and _in_place(root, manifest)):",
             "                    ):",
             (PROOFS + "test_the_staged_manifest_copied_to_output_before_"
              "the_switch[True-local]",)),
    Mutation("uncharged-staging-blocks-the-run",
             "pipelines/release/protocol.py:check_staged_leftovers",
             "    for folder in sorted(f for t, f in complete.items() "
             "if t not in charged):\n",
             "    for folder in sorted(f for t, f in complete.items() "
             "if t not in charged):\n        raise release.ReleaseError(folder)\n",
             (PROOFS + "test_a_planted_staging_folder_is_set_aside_not_"
              "obeyed[local]",)),
    Mutation("latest-store-unchecked", "pipelines/release/reading.py:load_latest",
             "    if budget_store is not None:\n"
             "        _check_latest_recorded(",
             "    if False:\n        _check_latest_recorded(",
             (PROOFS + "test_latest_pointed_at_a_self_consistent_copy_is_"
              "refused_with_the_store[local]",)),
    Mutation("publish-ignores-the-named-store", "deploy/publish.py:summary",
             "    if named is not None and budget_store is None:",
             "    if False:",
             (PROOFS + "test_publish_without_the_store_of_a_release_made_"
              "with_one_is_refused[local]",)),
)

# Mutations whose catching tests are not written yet (none today).
PENDING: tuple[Mutation, ...] = ()


def _function_node(tree: ast.AST, qualname: str):
    """The function ``qualname`` ("f", "Class.method") of a module."""
    def walk(node, prefix: str):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                  ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if name == qualname and not isinstance(child, ast.ClassDef):
                    return child
                found = walk(child, name + ".")
                if found is not None:
                    return found
        return None
    return walk(tree, "")


def _anchor(old: str) -> re.Pattern:
    """``old`` with any whitespace allowed between its characters."""
    chars = [re.escape(c) for c in old if not c.isspace()]
    return re.compile(r"\s*".join(chars))


def locate(text: str, m: Mutation) -> tuple[int, int, str]:
    """(start, end, indentation) of ``m``'s anchor in ``text``: inside its
    function only; whole lines (from the indentation on, through the
    newline) where ``old`` is written as whole lines."""
    node = _function_node(ast.parse(text), m.function)
    if node is None:
        raise MutationTargetGone(
            f"mutation {m.name}: no function {m.function} in {m.path}; the "
            "code changed: update the patch in tests/mutations.py")
    lines = text.splitlines(keepends=True)
    first = node.decorator_list[0].lineno if node.decorator_list else \
        node.lineno
    begin = sum(len(line) for line in lines[:first - 1])
    finish = sum(len(line) for line in lines[:node.end_lineno])
    found = list(_anchor(m.old).finditer(text, begin, finish))
    if len(found) != 1:
        raise MutationTargetGone(
            f"mutation {m.name}: its anchor is in {m.where} {len(found)} "
            "times (expected once); the code changed: update the patch in "
            "tests/mutations.py")
    start, end = found[0].span()
    indent = ""
    line_start = text.rfind("\n", 0, start) + 1
    if m.old[:1].isspace() and not text[line_start:start].strip():
        start, indent = line_start, text[line_start:start]
    if m.old.endswith("\n") and text[end:end + 1] == "\n":
        end += 1
    return start, end, indent


def patched(text: str, m: Mutation) -> str:
    """``text`` with ``m`` applied (``new`` re-indented to the anchor's
    indentation); refuses a patch that leaves the function's AST as it
    was (``MutationNoOp``)."""
    start, end, indent = locate(text, m)
    written = m.old[:len(m.old) - len(m.old.lstrip(" "))]
    new = "".join(indent + line[len(written):]
                  if indent and line.startswith(written) else line
                  for line in m.new.splitlines(keepends=True))
    out = text[:start] + new + text[end:]
    before = ast.dump(_function_node(ast.parse(text), m.function))
    after = _function_node(ast.parse(out), m.function)
    if after is None or ast.dump(after) == before:
        raise MutationNoOp(f"mutation {m.name}: the patch leaves {m.where}'s "
                           "code unchanged; it breaks nothing: update it in "
                           "tests/mutations.py")
    return out


def apply(root: Path, m: Mutation) -> str:
    """Patches the copy at ``root``; returns the file's original text."""
    path = root / m.path
    text = path.read_text()
    path.write_text(patched(text, m))
    return text


def copy_repo(dst: Path) -> Path:
    """The working tree's tracked and untracked (not ignored) files."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
        check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def run_tests(root: Path, node_ids: Sequence[str],
              first_failure: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           *(["-x"] if first_failure else []), *node_ids]
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True,
                          text=True)


@dataclasses.dataclass
class Outcome:
    mutation: Mutation
    caught: bool
    seconds: float
    tail: str


def check(root: Path, m: Mutation) -> Outcome:
    """Applies ``m`` to the copy, runs its catchers, restores the file.
    Caught: pytest reports failed tests (exit 1), not a collection error."""
    original = apply(root, m)
    start = time.monotonic()
    try:
        done = run_tests(root, m.catchers)
    finally:
        (root / m.path).write_text(original)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    return Outcome(m, done.returncode == 1, time.monotonic() - start,
                   "\n".join(tail))


def run_all(mutations: Sequence[Mutation], workdir: Optional[Path] = None,
            baseline: bool = True) -> list[Outcome]:
    """Every mutation on one copy of the repo, sequentially. With
    ``baseline`` the catchers must first pass on the unmutated copy (else
    nothing is proved; in the suite, the suite itself runs them)."""
    with tempfile.TemporaryDirectory(prefix="dpsynth-mutations-",
                                     dir=workdir) as tmp:
        root = copy_repo(Path(tmp))
        for m in mutations:  # every target present, before any slow run
            apply(root, m)
            (root / m.path).write_text((ROOT / m.path).read_text())
        if baseline:
            check_baseline(root, mutations)
        return [check(root, m) for m in mutations]


class CatcherFailsOnCleanCode(RuntimeError):
    """A catching test fails without any mutation: its failure under a
    mutation proves nothing (``dask-reshuffle-noop`` on Beam 2.78 was
    counted as caught by a test that failed anyway)."""


def check_baseline(root: Path, mutations: Sequence[Mutation]) -> None:
    """Every catcher passes on the unmutated copy, else one line naming the
    ones that fail and the mutations they were to catch."""
    nodes = sorted({n for m in mutations for n in m.catchers})
    base = run_tests(root, nodes, first_failure=False)
    if base.returncode == 0:
        return
    failing = sorted({line.split()[1] for line in base.stdout.splitlines()
                      if line.startswith(("FAILED ", "ERROR "))
                      and len(line.split()) > 1})
    names = sorted({m.name for m in mutations
                    if any(n.split(" ")[0] in failing for n in m.catchers)})
    tail = (base.stdout + base.stderr).strip().splitlines()[-1:]
    raise CatcherFailsOnCleanCode(
        f"catching tests fail on clean code, so they prove nothing: "
        f"{', '.join(failing) or tail} (mutations {', '.join(names) or '?'})")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutation names")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    outcomes = run_all(chosen)
    for o in outcomes:
        print(f"{'caught ' if o.caught else 'MISSED '} {o.seconds:6.1f}s  "
              f"{o.mutation.name:34s} {o.mutation.where}")
    return 0 if all(o.caught for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
