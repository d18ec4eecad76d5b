"""Speculative decoding: proposers (n-gram, draft model), exact verification, adaptive k, metrics."""
