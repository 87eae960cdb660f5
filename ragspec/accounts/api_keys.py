"""The HTTP API's sign-in: one call from an `Authorization` header to a user.

`authenticate_api_key(header_value)` takes the header's value ("Bearer rsk_..." or the bare
key) and returns the `User` whose key it is, or None for a missing, malformed, unknown or
revoked key (or a removed user). It never raises for a bad header and never logs the key.
Keys are made by `ragspec users key NAME` (ragspec.accounts.users.AccountStore.create_key).
The caller turns the user into a `Principal` (ragspec.accounts.policy) for its checks.
"""

from __future__ import annotations

from ragspec.accounts.users import AccountStore, User


def authenticate_api_key(header_value: str | None,
                         accounts: AccountStore | None = None) -> User | None:
    if not header_value or not isinstance(header_value, str):
        return None
    scheme, _, rest = header_value.strip().partition(" ")
    key = rest.strip() if scheme.lower() == "bearer" else header_value.strip()
    return (accounts or AccountStore()).verify_key(key)
