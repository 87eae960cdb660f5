"""The web chat (Streamlit): the page, its queue of answers, uploads and saved chats."""
