"""The folder backend: PassageStore (store), LangChain's FAISS vector store on our own files.

persist (the index on disk: written atomically, read without unpickling), documents (passages in
and out of LangChain Documents), ann (approximate dense search for a large index)."""
