"""Prompt compression: query-aware pruning of reference material, history compaction, token pruning.

One job per module: `places` (where the material is, per the policy's scope), `framing` (inside a
plain text: lead-in, material, question), `documents` (explicit documents; writing edits back), `splitting` (units),
`scoring` (relevance), `protection` + `budget` (what must stay, what fits), `extractive` (one
document end to end), `history` (compaction of older turns), `surprisal` (token-level pruning),
`report` (metrics). The stage that runs them is sdk/compression/stage.py; docs/compression.md.
"""
