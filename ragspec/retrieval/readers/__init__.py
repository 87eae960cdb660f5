"""Readers: one file's bytes into text per page, with the work and memory each may cost bounded.

loaders (the dispatch by type, bounded by limits) -> pdf_text, docx_text (with archive and
xml_parts), html_text, ebooks, opendoc, sheets, slides, images and ocr (pictures of pages, with
Tesseract); encoding (text files in whatever encoding they were written)."""
