"""The shipped verifier on held-out QQP pairs (the repository's sample of the test split, never trained or calibrated on)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import skip_without_extra

skip_without_extra("semantic")  # faiss

from sdk.cache import qqp, readings  # noqa: E402
from sdk.cache.verifier import TUNED_WEIGHTS, WEIGHTS, Verifier  # noqa: E402
from sdk.services import default_data_dir  # noqa: E402


@pytest.mark.timeout(300)  # a first run embeds ~2,300 questions: ~30 s on 2 quiet cores, minutes on a loaded machine
def test_held_out_precision_meets_each_target_and_beats_a_cosine_cut(cache_embedder):
    # 1,200 of the sample's 2,000 pairs keep a first run (no memoized embeddings) near half a minute on 2 cores.
    workload = qqp.Workload.of(qqp.sample(qqp.load_pairs(qqp.HELD_OUT_SAMPLE), 1200))
    vectors = qqp.embed_cached(workload.stored + workload.lookups, cache_embedder.embed_many, default_data_dir() / "qqp", cache_embedder.model_id)
    verifier = Verifier.for_embedder(cache_embedder.model_id)
    results = qqp.outcomes(workload, vectors, verifier)
    baseline = qqp.served_by_cosine(results, 0.8)
    by_labels = [t for t, read in zip(verifier.targets, verifier.read, strict=True) if not read and t >= 0.9]
    assert by_labels == [0.97, 0.98]  # 0.90 and 0.95 are calibrated by reading: the next test
    for target in (0.97,):
        got = qqp.served_by_verifier(results, verifier.threshold(target))
        assert got.hits >= 50, got
        # The threshold was set for this target with 97.5% confidence on the calibration split; allow this
        # slice's own sampling error (two standard errors) before calling it a miss.
        slack = 2 * np.sqrt(target * (1 - target) / got.hits)
        assert got.precision >= target - slack, (target, got)
        assert got.precision > baseline.precision + 0.15, (got, baseline)


@pytest.mark.timeout(300)
def test_targets_calibrated_by_reading_hold_on_the_read_held_out_hits(cache_embedder):
    # QQP's labels undercount precision at the top (same questions labelled "not duplicate", entries of
    # other pairs never labelled): thresholds for 0.90 and 0.95 were set on calibration hits judged by
    # reading, and every hit of the sample's independent pairs at those thresholds was judged the same way.
    workload = qqp.Workload.of(readings.independent(qqp.load_pairs(qqp.HELD_OUT_SAMPLE)))
    vectors = qqp.embed_cached(workload.stored + workload.lookups, cache_embedder.embed_many, default_data_dir() / "qqp", cache_embedder.model_id)
    verifier = Verifier.for_embedder(cache_embedder.model_id)
    results = qqp.outcomes(workload, vectors, verifier)
    judged = readings.judged(readings.load(readings.HELD_OUT))
    for target in (0.90, 0.95):
        assert verifier.read[list(verifier.targets).index(target)]
        threshold = verifier.threshold(target)
        assert threshold is not None
        hits = [(r.query, r.served) for r in qqp.verifier_hits(results, threshold) if r.served is not None]
        unread = [hit for hit in hits if hit not in judged]
        assert not unread, f"hits nobody judged (the verifier or embedder changed? judge them: sdk/cache/readings.py): {unread[:3]}"
        same = sum(judged[hit] for hit in hits)
        slack = 2 * np.sqrt(target * (1 - target) / len(hits))
        assert len(hits) >= 100 and same / len(hits) >= target - slack, (target, same, len(hits))
        by_labels = qqp.served_by_verifier(results, threshold)
        assert by_labels.recall >= (0.4 if target == 0.90 else 0.28), by_labels


def test_targets_are_monotone_and_an_unreachable_target_disables_the_semantic_tier():
    for path in (WEIGHTS, TUNED_WEIGHTS):
        verifier = Verifier.load(path)
        assert np.all(np.diff(verifier.targets) > 0) and np.all(np.diff(verifier.thresholds) >= 0)
        assert verifier.threshold(1.0) is None


def test_a_verifier_refuses_an_embedder_it_was_not_trained_for(cache_embedder):
    assert Verifier.for_embedder("minilm").embedder == "minilm"
    assert Verifier.for_embedder(cache_embedder.model_id).embedder == cache_embedder.model_id
    with pytest.raises(ValueError, match="retrain"):
        Verifier.for_embedder("minilm-qqp-0000000000")
