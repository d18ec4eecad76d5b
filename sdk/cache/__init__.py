"""The response cache: an exact tier (canonical request hash) and a semantic tier (MiniLM with a
QQP-trained adapter + faiss + rule vetoes + a calibrated verifier), partitioned per team, persisted in
SQLite. See docs/semantic-cache.md.

keys.py        canonical hashing: exact key, partition key, the text compared by meaning
answers.py     the stored answer shape; folding streams into it; replay as body or SSE
store.py       SQLite entries + per-team, per-partition in-memory indexes; TTL, LRU, caps, invalidation
index.py       one faiss index per partition (flat, then IVF when large)
rules.py       lexical vetoes and features (numbers, negation, swapped arguments, units, dates, names)
verifier.py    the learned hit verifier and its calibrated thresholds (verifier-tuned.npz; verifier.npz
               for MiniLM as shipped)
adapter.py     the LoRA adapter merged into MiniLM at load (minilm-qqp-lora.safetensors)
response_cache.py  the process-wide object the stage and admin functions use
stage.py       the pipeline stage (lookup before the router, store after); embedding_stage.py the exact
               cache for /v1/embeddings
qqp.py, train_embedder.py, train_verifier.py  the data, training and calibration behind the shipped files
"""
