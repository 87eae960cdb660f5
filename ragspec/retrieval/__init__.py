"""Retrieval: files in, passages with exact provenance out.

sources (which files; each read once) -> loaders (bytes -> text per page, bounded by limits;
html_text, docx_text, archive) -> passages (token-aware splitting in one linear pass) ->
embeddings (bundled all-MiniLM-L6-v2) -> store (FAISS through LangChain, persisted without pickle,
committed under lock.py's write lock, with a BM25 keyword index of the same passages, bm25.py,
for hybrid search fused by fusion.py); ingest ties them together, committing in batches. Never
imports `decoding` or `app`.

Public entry points: ragspec.retrieval.embeddings.Embedder, ragspec.retrieval.store.PassageStore (with Passage,
Hit, DocumentInfo), ragspec.retrieval.ingest.ingest_paths / IngestReport / SUPPORTED_SUFFIXES,
ragspec.retrieval.limits.IngestLimits.
"""
