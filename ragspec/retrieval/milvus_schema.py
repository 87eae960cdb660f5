"""The Milvus collections of one ragspec index (see milvus_store.py for what each row means).

Contract: `create_collections(client, (passages, documents, meta), dim)` creates whichever of
the three does not exist yet, with its indexes, and loads them; existing ones are left as they
are. Vectors are searched exactly (FLAT, inner product on normalised vectors: cosine
similarity), like the FAISS folder store, so both backends rank the same passages the same way;
the text field is analysed by Milvus' standard tokenizer with lowercasing, and its BM25 function
fills the sparse field that keyword search ranks.
"""

from __future__ import annotations

BM25_PARAMS = {"bm25_k1": 1.2, "bm25_b": 0.75}
ANALYZER = {"tokenizer": "standard", "filter": ["lowercase"]}
# A placeholder vector for the two collections that are tables (Milvus needs one per collection).
PLACEHOLDER_DIM = 2


def create_collections(client, names: tuple[str, str, str], dim: int) -> None:
    from pymilvus import DataType, Function, FunctionType

    passages, documents, meta = names
    if not client.has_collection(passages):
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("pk", DataType.VARCHAR, is_primary=True, max_length=200)
        schema.add_field("pid", DataType.VARCHAR, max_length=160)
        schema.add_field("doc_id", DataType.VARCHAR, max_length=64)
        schema.add_field("gen", DataType.INT64)
        schema.add_field("page", DataType.INT64)
        schema.add_field("start", DataType.INT64)
        schema.add_field("text", DataType.VARCHAR, max_length=65535, enable_analyzer=True,
                         analyzer_params=ANALYZER)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("sparse", DataType.SPARSE_FLOAT_VECTOR)
        schema.add_function(Function(name="text_bm25", function_type=FunctionType.BM25,
                                     input_field_names=["text"],
                                     output_field_names=["sparse"]))
        index = client.prepare_index_params()
        index.add_index("vector", index_type="FLAT", metric_type="IP")
        index.add_index("sparse", index_type="SPARSE_INVERTED_INDEX", metric_type="BM25",
                        params=BM25_PARAMS)
        client.create_collection(passages, schema=schema, index_params=index,
                                 consistency_level="Strong")
    if not client.has_collection(documents):
        _table(client, documents, [
            ("pk", DataType.VARCHAR, {"is_primary": True, "max_length": 100}),
            ("doc_id", DataType.VARCHAR, {"max_length": 64}), ("gen", DataType.INT64, {}),
            ("source", DataType.VARCHAR, {"max_length": 8192}),
            ("sha256", DataType.VARCHAR, {"max_length": 64}),
            ("size_bytes", DataType.INT64, {}),
            ("ingested_at", DataType.VARCHAR, {"max_length": 64}),
            ("passages", DataType.INT64, {})])
    if not client.has_collection(meta):
        _table(client, meta, [
            ("pk", DataType.VARCHAR, {"is_primary": True, "max_length": 200}),
            ("kind", DataType.VARCHAR, {"max_length": 16}), ("gen", DataType.INT64, {}),
            ("body", DataType.VARCHAR, {"max_length": 65535})])


def _table(client, name: str, fields: list[tuple]) -> None:
    """A collection used as a table: the fields, and the placeholder vector Milvus needs."""
    from pymilvus import DataType

    schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
    for field, kind, options in fields:
        schema.add_field(field, kind, **options)
    schema.add_field("v", DataType.FLOAT_VECTOR, dim=PLACEHOLDER_DIM)
    index = client.prepare_index_params()
    index.add_index("v", index_type="FLAT", metric_type="L2")
    client.create_collection(name, schema=schema, index_params=index, consistency_level="Strong")
