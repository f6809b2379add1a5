"""The history interface's typed ids: ``session:…``, ``turn:…``, ``event:…``, opaque and tamper-evident.

An id is its kind, a colon and base64url of ``payload | mac``, the MAC (8 bytes of HMAC-SHA256 over
the kind and the payload, keyed with the data directory's cursor key) making an edited, truncated or
foreign id an ``invalid_id`` rather than a silent miss. Payloads are small, so ids stay short in an
agent's context:

* event: the message's ULID as 16 bytes (the same message the first interface calls ``message_id``);
* turn: the ULID of the ``user_input`` event that starts it, or, for the events before a session's
  first user input, a zero byte and the session's digest;
* session: a 12-byte SHA-256 digest of the session id, resolved through the store's digest map.

Ids depend on the store's key, not on sequence numbers, so they survive restarts and rebuild_index.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import re
from typing import Any

from ulid import ULID

from protocol.history import INVALID_ID, HistoryError

MAC_BYTES = 8
DIGEST_BYTES = 12
_PREAMBLE = b"\x00"


def session_digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("utf-8")).digest()[:DIGEST_BYTES]


def _mac(key: bytes, kind: str, payload: bytes) -> bytes:
    return hmac.new(key, kind.encode("ascii") + b":" + payload, hashlib.sha256).digest()[:MAC_BYTES]


def _encode(key: bytes, kind: str, payload: bytes) -> str:
    return f"{kind}:" + base64.urlsafe_b64encode(payload + _mac(key, kind, payload)).decode("ascii").rstrip("=")


def _payload(key: bytes, kind: str, token: str, field: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except Exception:
        raw = b""
    payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
    if len(raw) <= MAC_BYTES or not hmac.compare_digest(mac, _mac(key, kind, payload)):
        raise HistoryError(INVALID_ID, f"{field} is not an id this store issued (edited, truncated or from "
                                       "another store); pass ids exactly as they were returned",
                           {"field": field})
    return payload


def _bad(field: str) -> HistoryError:
    return HistoryError(INVALID_ID, f"{field} is not a valid convmem id", {"field": field})


# A ULID's text (Crockford base32, either case; its first digit at most 7, so that it fits 128 bits) as
# Python's own base-32 digits, which int() reads in C: ~1 µs where ULID.from_str took ~10 (a search_sessions
# call makes ~35 ids). Anything else goes to ULID.from_str, which says what is wrong with it.
_ULID_TEXT = re.compile("[0-7][0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{25}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_AS_INT_DIGITS = str.maketrans(_CROCKFORD + _CROCKFORD.lower(), "0123456789abcdefghijklmnopqrstuv" * 2)


def ulid_bytes(text: str) -> bytes:
    """``ULID.from_str(text).bytes``, the same bytes and the same errors."""
    if _ULID_TEXT.fullmatch(text) is None:
        return ULID.from_str(text).bytes
    return int(text.translate(_AS_INT_DIGITS), 32).to_bytes(16, "big")


def event_id(key: bytes, message_id: str) -> str:
    return _encode(key, "event", ulid_bytes(message_id))


def session_id(key: bytes, sid: str) -> str:
    return _encode(key, "session", session_digest(sid))


def turn_id(key: bytes, anchor_message_id: str | None, sid: str) -> str:
    """The turn started by ``anchor_message_id`` (a user_input event), or the preamble turn of ``sid``."""
    if anchor_message_id is None:
        return _encode(key, "turn", _PREAMBLE + session_digest(sid))
    return _encode(key, "turn", ulid_bytes(anchor_message_id))


def decode(key: bytes, kind: str, token: str, field: str) -> Any:
    """event → message_id; session → digest (bytes); turn → ("event", message_id) | ("preamble", digest)."""
    payload = _payload(key, kind, token, field)
    if kind == "session":
        if len(payload) != DIGEST_BYTES:
            raise _bad(field)
        return payload
    if kind == "turn" and payload[:1] == _PREAMBLE:
        if len(payload) != 1 + DIGEST_BYTES:
            raise _bad(field)
        return ("preamble", payload[1:])
    if len(payload) != 16:
        raise _bad(field)
    mid = str(ULID.from_bytes(payload))
    return ("event", mid) if kind == "turn" else mid
