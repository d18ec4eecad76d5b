"""Routing parts the router composes: target ordering, circuit breaker, backoff, hedging,
cross-protocol translation and team limits. One job per module; `sdk/routing/router.py` ties them together.
"""
