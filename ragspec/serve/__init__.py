"""`ragspec serve`: an OpenAI-compatible HTTP API over one scheduler that owns the model.

Modules: app (the FastAPI routes), answers (from a request to a scheduled generation: plain
chat, or retrieval for the `ragspec` model ids), requests (the accepted request bodies),
responses (the OpenAI response and chunk objects, and the `ragspec` extension), errors (the
OpenAI error object), limits (request size and in-flight bounds), auth (the hook that decides who
may call). The model itself is only ever called by ragspec.decoding.scheduler's thread.
"""
