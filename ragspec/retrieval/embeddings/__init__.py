"""Sentence embeddings for passages and queries: embedder (the bundled all-MiniLM-L6-v2, loaded
once, offline), precision (fp32, or bfloat16 where the CPU has it natively), onnx_model (the same
model's transformer run by onnxruntime), tokens (word pieces counted without loading the model)."""
