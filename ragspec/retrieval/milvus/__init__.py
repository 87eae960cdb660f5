"""The Milvus backend: MilvusStore (store) over Milvus Lite (a local file) or a Milvus server.

location (the parsed --index value), client (the connection, the collections, rows in batches),
schema (the collections of one index), and the copies kept on this machine beside Milvus
(copies): keywords (ragspec's BM25), vectors and records (Milvus Lite), each a side file that
follows sidefile's protocol."""
