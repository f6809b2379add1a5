"""Opaque, tamper-evident, keyset pagination cursors.

A cursor carries the key of the last item served (not an offset), so writes and deletes between
pages never make a page skip or repeat an item. It is MAC'ed with the data directory's key: a
cursor that was edited, belongs to another view or session, or comes from another store is refused
as a VALIDATION_ERROR rather than silently misread.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any

import msgpack

from protocol.errors import invalid

_MAC_BYTES = 12


def encode(key: bytes, view: str, scope: str, position: list[Any]) -> str:
    body = msgpack.packb([view, scope, position], use_bin_type=True)
    mac = hmac.new(key, body, hashlib.sha256).digest()[:_MAC_BYTES]
    return base64.urlsafe_b64encode(body + mac).decode("ascii").rstrip("=")


def decode(key: bytes, token: str, view: str, scope: str) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except Exception:
        raise invalid("cursor is malformed") from None
    body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
    if len(raw) <= _MAC_BYTES or not hmac.compare_digest(mac, hmac.new(key, body, hashlib.sha256).digest()[:_MAC_BYTES]):
        raise invalid("cursor is not one this store issued (edited, truncated or foreign)")
    try:
        c_view, c_scope, position = msgpack.unpackb(body, raw=False)
    except Exception:
        raise invalid("cursor is malformed") from None
    if c_view != view:
        raise invalid(f"cursor belongs to another view, not {view}")
    if c_scope != scope:
        raise invalid("cursor was issued for other parameters (another session_id, or another sessions "
                      "window or order)")
    return position
