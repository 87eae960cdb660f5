"""Retrieval: files in, passages with exact provenance out.

sources (which files; each read once) -> readers/ (bytes -> text per page, bounded by
readers.limits) -> passages (token-aware splitting in one linear pass) -> embeddings/ (bundled
all-MiniLM-L6-v2) -> a store: the rules every backend keeps are base.py's (search modes, fusion
by fusion.py, the writing protocol, provenance); the backends are faiss/ (a folder: FAISS
through LangChain, persisted without pickle, committed under lock.py's write lock, with our BM25
keyword index, bm25/) and milvus/ (Milvus Lite or a Milvus server through langchain-milvus, with
Milvus' own BM25); backends.py picks one from an --index value. ingest ties them together,
committing in batches. Never imports `decoding` or `app`.

Public entry points: ragspec.retrieval.backends.open_index,
ragspec.retrieval.embeddings.embedder.Embedder, ragspec.retrieval.faiss.store.PassageStore
(with Passage, Hit, DocumentInfo), ragspec.retrieval.ingest.ingest_paths / IngestReport /
SUPPORTED_SUFFIXES, ragspec.retrieval.readers.limits.IngestLimits.
"""
