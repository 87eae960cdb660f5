"""Retrieval: files in, passages with exact provenance out.

sources (which files; each read once) -> loaders (bytes -> text per page, bounded by limits;
html_text, docx_text, archive) -> passages (token-aware splitting in one linear pass) ->
embeddings (bundled all-MiniLM-L6-v2) -> a store: the rules every backend keeps are
store_base.py's (search modes, fusion by fusion.py, the writing protocol, provenance); the
backends are store.py (a folder: FAISS through LangChain, persisted without pickle, committed
under lock.py's write lock, with our BM25 keyword index, bm25.py) and milvus_store.py (Milvus
Lite or a Milvus server through langchain-milvus, with Milvus' own BM25); backends.py picks one
from an --index value. ingest ties them together, committing in batches. Never imports
`decoding` or `app`.

Public entry points: ragspec.retrieval.backends.open_index, ragspec.retrieval.embeddings.Embedder,
ragspec.retrieval.store.PassageStore (with Passage, Hit, DocumentInfo),
ragspec.retrieval.ingest.ingest_paths / IngestReport / SUPPORTED_SUFFIXES,
ragspec.retrieval.limits.IngestLimits.
"""
