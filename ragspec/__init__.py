"""ragspec's application layer: the pipeline, the CLI and the Streamlit UI."""
