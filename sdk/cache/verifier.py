"""The learned hit verifier: is a cached question the same question as the new one?

A cosine threshold alone cannot say: on Quora Question Pairs, cosine ≥ 0.8 with MiniLM serves a
wrong entry about 40% of the time. The verifier is a one-hidden-layer MLP over
[u·v, |u−v|, cos, lexical rule features], trained by `sdk/cache/train_verifier.py` on part of
QQP (with hard negatives mined the way a cache meets them: nearest neighbours that are not
duplicates), and calibrated on a separate part: for each precision target it stores the lowest
score threshold at which served hits reached that precision, by QQP's labels or, where those
undercount it, by hits judged by reading (sdk/cache/readings.py). Rule vetoes (numbers, negation,
swapped entities, ...) reject before the model is asked. A verifier belongs to one embedding space:
`verifier-tuned.npz` to MiniLM with the QQP adapter (the default), `verifier.npz` to MiniLM as
shipped; each file records the embedder id it was trained on, and loading it for another refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sdk.cache import rules

WEIGHTS = Path(__file__).with_name("verifier.npz")  # for MiniLM as shipped (id "minilm")
TUNED_WEIGHTS = Path(__file__).with_name("verifier-tuned.npz")  # for MiniLM with the QQP adapter


def weights_for(embedder_id: str) -> Path:
    return WEIGHTS if embedder_id == "minilm" else TUNED_WEIGHTS


def pair_features(u: np.ndarray, v: np.ndarray, check: rules.RuleCheck) -> np.ndarray:
    """Features of one (query, candidate) pair: [u·v, |u−v|, cos, rule features of check(query, candidate)]."""
    cosine = float(np.dot(u, v))
    return np.concatenate([u * v, np.abs(u - v), np.array([cosine], dtype=np.float32), check.vector()]).astype(np.float32)


@dataclass(frozen=True)
class Verifier:
    w1: np.ndarray
    b1: np.ndarray
    w2: np.ndarray
    b2: np.ndarray
    targets: np.ndarray  # precision targets, ascending
    thresholds: np.ndarray  # score threshold reaching each target on the calibration split
    embedder: str  # id of the embedding space it was trained in (Embedder.model_id)
    read: np.ndarray  # per target: True where the threshold was set on hits judged by reading (sdk/cache/readings.py)

    @classmethod
    def load(cls, path: Path) -> Verifier:
        with np.load(path) as data:
            w1, b1, w2, b2, targets, thresholds = (np.asarray(data[name]) for name in ("w1", "b1", "w2", "b2", "targets", "thresholds"))
            read = np.asarray(data["read"], dtype=bool) if "read" in data else np.zeros(len(targets), dtype=bool)
            return cls(w1, b1, w2, b2, targets, thresholds, embedder=str(data["embedder"]) if "embedder" in data else "minilm", read=read)

    @classmethod
    def for_embedder(cls, embedder_id: str) -> Verifier:
        verifier = cls.load(weights_for(embedder_id))
        if verifier.embedder != embedder_id:
            raise ValueError(f"the verifier was trained for embedder {verifier.embedder}, not {embedder_id}: retrain it (python -m sdk.cache.train_verifier)")
        return verifier

    def save(self, path: Path) -> None:
        np.savez_compressed(path, w1=self.w1, b1=self.b1, w2=self.w2, b2=self.b2, targets=self.targets, thresholds=self.thresholds,
                            embedder=np.array(self.embedder), read=self.read)

    def scores(self, features: np.ndarray) -> np.ndarray:
        hidden = np.maximum(features @ self.w1 + self.b1, 0.0)
        logits = (hidden @ self.w2 + self.b2).reshape(-1)
        probabilities: np.ndarray = 1.0 / (1.0 + np.exp(-logits))
        return probabilities

    def threshold(self, min_precision: float) -> float | None:
        """Score threshold for the least calibrated target at or above `min_precision`; None if none reaches it."""
        reached = np.nonzero(self.targets >= min_precision - 1e-9)[0]
        return float(self.thresholds[reached[0]]) if len(reached) else None

    def rank(self, query: str, vector: np.ndarray, candidates: list[tuple[str, np.ndarray]]) -> tuple[int, float] | None:
        """(index, score) of the best candidate no rule vetoes; None when every one is vetoed."""
        checks = [(i, rules.check(query, text)) for i, (text, _) in enumerate(candidates)]
        allowed = [(i, check) for i, check in checks if not check.veto]
        if not allowed:
            return None
        features = np.stack([pair_features(vector, candidates[i][1], check) for i, check in allowed])
        scores = self.scores(features)
        top = int(np.argmax(scores))
        return allowed[top][0], float(scores[top])

    def best(self, query: str, vector: np.ndarray, candidates: list[tuple[str, np.ndarray]], min_precision: float) -> int | None:
        """Index of the candidate to serve, or None: vetoed by a rule, or below the calibrated threshold."""
        threshold = self.threshold(min_precision)
        if threshold is None or not candidates:
            return None
        ranked = self.rank(query, vector, candidates)
        return ranked[0] if ranked is not None and ranked[1] >= threshold else None
