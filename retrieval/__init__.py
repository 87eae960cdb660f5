"""Retrieval: files in, passages with exact provenance out.

loaders (file -> text per page) -> passages (token-aware splitting) -> embeddings (bundled
all-MiniLM-L6-v2) -> store (FAISS through LangChain, persisted without pickle) ; ingest ties
them together per file. Never imports `decoding` or `app`.

Public entry points: retrieval.embeddings.Embedder, retrieval.store.PassageStore (with Passage,
Hit, DocumentInfo), retrieval.ingest.ingest_paths / IngestReport / SUPPORTED_SUFFIXES.
"""
