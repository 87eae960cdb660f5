"""Keyword search: BM25 over the stored passages.

index (BM25Index: numpy postings, updated passage by passage) on postings (sorted posting
segments and per-term score bounds); top-k by MaxScore in C (native, compiled on first use from
bm25_native.c) or, where it cannot be compiled, in numpy (maxscore) with the same result."""
