"""Accounts, roles, quotas and the audit log, for the chat and the HTTP API.

users (accounts.json: roles, quotas, argon2id password hashes, hashed API keys), sessions
(sign-in tokens that expire), policy (who may do what; quota checks), audit (audit.jsonl),
binding (which addresses need accounts), api_keys (`authenticate_api_key`). Nothing here
imports a web framework.
"""
