"""Speculative decoding with an n-gram drafter (no LangChain, FAISS or Streamlit here)."""
