"""Prompt compression: query-aware pruning of documents, history compaction, token pruning.

One job per module: `documents` (where documents are in a request), `splitting` (units),
`scoring` (relevance), `protection` + `budget` (what must stay, what fits), `extractive` (one
document end to end), `history` (compaction of older turns), `surprisal` (token-level pruning),
`report` (metrics). The stage that runs them is sdk/stages/compression.py; docs/compression.md.
"""
