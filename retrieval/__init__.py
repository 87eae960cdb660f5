"""Loading, splitting, embedding and storing passages (never imports decoding)."""
