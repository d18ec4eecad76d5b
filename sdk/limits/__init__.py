"""The limits stage: a team's rate limits, concurrency caps and budgets, checked before anything else
runs (`stage.py`); the counters live in the state backend (sdk/state/), so replicas share them."""
