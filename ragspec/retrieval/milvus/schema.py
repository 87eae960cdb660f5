"""The Milvus collections of one ragspec index (see milvus_store.py for what each row means).

Contract: `create_collections(client, (passages, documents, meta), dim, vector_index)` creates
whichever of the three does not exist yet, with its indexes, and loads them; existing ones are
left as they are. Vectors are searched by inner product on normalised vectors (cosine
similarity). RAGSPEC_MILVUS_INDEX, read when the collection is created, is "FLAT" by default
(exact, like the FAISS folder store, so both backends rank the same passages the same way);
"AUTO" is FLAT until a commit leaves APPROX_THRESHOLD passages, when `use_ivf` rebuilds the
vector index as IVF_FLAT (not the default: on Milvus Lite 2.5.1 its recall@10 measured 0.67 at
100k passages, whatever the number of lists probed; see docs/scaling.md): the vectors clustered into IVF_NLIST lists, the IVF_NPROBE nearest searched
(approximate, for indexes too large to scan on every question; the same threshold as the FAISS
folder's, faiss_ann.py). "FLAT" or "IVF_FLAT" fixes the index (Milvus Lite offers these two; a
server offers more);
the text field is analysed by Milvus' standard tokenizer with lowercasing, and its BM25 function
fills the sparse field that keyword search ranks. Also here: `quiet_imports` (pymilvus and
milvus-lite without their log noise) and `document_row` (a documents-collection row).
"""

from __future__ import annotations

import logging
import warnings

from ragspec.retrieval.records import DocumentInfo

BM25_PARAMS = {"bm25_k1": 1.2, "bm25_b": 0.75}
INDEX_ENV = "RAGSPEC_MILVUS_INDEX"
VECTOR_INDEXES = ("AUTO", "FLAT", "IVF_FLAT")
APPROX_THRESHOLD = 50_000
IVF_NLIST = 1024
IVF_NPROBE = 256  # a quarter of the lists: questions sit far from the passages (faiss_ann.py)


def vector_index_from_env() -> str:
    """The vector index policy of a new collection (RAGSPEC_MILVUS_INDEX, default FLAT)."""
    import os

    kind = (os.environ.get(INDEX_ENV) or "FLAT").upper()
    if kind not in VECTOR_INDEXES:
        raise ValueError(f"{INDEX_ENV}={kind!r}: use one of {', '.join(VECTOR_INDEXES)}")
    return kind


def _vector_index_params(client, kind: str):
    index = client.prepare_index_params()
    index.add_index("vector", index_type=kind, metric_type="IP",
                    params={"nlist": IVF_NLIST} if kind == "IVF_FLAT" else {})
    return index


def use_ivf(client, passages: str) -> None:
    """Rebuild the passages collection's vector index as IVF_FLAT (the data stays)."""
    client.release_collection(passages)
    for name in client.list_indexes(passages, field_name="vector"):
        client.drop_index(passages, name)
    client.create_index(passages, _vector_index_params(client, "IVF_FLAT"))
    client.load_collection(passages)


def search_params(kind: str) -> dict:
    """Milvus search parameters for the dense field under index `kind`."""
    return {"metric_type": "IP", "params": {"nprobe": IVF_NPROBE} if kind == "IVF_FLAT" else {}}
ANALYZER = {"tokenizer": "standard", "filter": ["lowercase"]}
# A placeholder vector for the two collections that are tables (Milvus needs one per collection).
PLACEHOLDER_DIM = 2


def create_collections(client, names: tuple[str, str, str], dim: int,
                       vector_index: str = "FLAT") -> None:
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
        index = _vector_index_params(client, vector_index)
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


def quiet_imports() -> None:
    """pymilvus logs a warning per query iterator ("failed to get mvccTs", harmless with Milvus
    Lite) and milvus-lite warns about pkg_resources on import: neither is the user's concern."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            import milvus_lite  # noqa: F401
        except ImportError:
            pass  # a server location needs no Milvus Lite
    import pymilvus  # noqa: F401  (configures its loggers on import: quieten them after)

    logging.getLogger("pymilvus").setLevel(logging.ERROR)


def document_row(info: DocumentInfo, gen: int) -> dict:
    """The documents-collection row of one document version."""
    return {"pk": f"{info.doc_id}@{gen}", "doc_id": info.doc_id, "gen": gen,
            "source": info.source, "sha256": info.sha256, "size_bytes": info.size_bytes,
            "ingested_at": info.ingested_at, "passages": info.passages, "v": [0.0, 0.0]}
