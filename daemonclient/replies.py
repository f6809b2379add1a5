"""What a reply means to the program that asked: its kind, told by code and fields, never by message text.

The daemon's replies are the contract's maps and stay so; so do the ones this layer makes up when no
daemon answered (``unavailable``, ``outcome_unknown``), which reach MCP hosts as they are. What differs
is who made them: a made-up one is an ``Unanswered`` — a plain dict to every reader (JSON, the SDK's
structuredContent), whose type tells this layer that no daemon said BUSY, so a caller can wait out a
busy daemon yet give up on an absent one without reading the message.
"""
from __future__ import annotations

import enum
from typing import Any

from protocol import errors as E
from protocol import limits as L

# How long a caller should wait after "daemon unavailable" before trying again.
UNAVAILABLE_RETRY_AFTER_MS = 1000
UNAVAILABLE_MESSAGE = "storage daemon unavailable (no reply in time); retry later"
# A retry never comes sooner than this, whatever retry_after_ms says (no busy loop on a bad value).
RETRY_MIN_S = 0.05


class Unanswered(dict):
    """A reply this process made because no daemon answered in time (its content is the contract's)."""


class Kind(enum.Enum):
    DONE = "done"                        # not an error: OK, REBUILDING, ...
    BUSY = "busy"                        # the daemon said BUSY: the same request may succeed later
    UNAVAILABLE = "unavailable"          # no daemon answered (a read, or a request that never left)
    OUTCOME_UNKNOWN = "outcome_unknown"  # no answer to a mutation that may have been applied
    NOT_FOUND = "not_found"
    REFUSED = "refused"                  # any other error: the same request fails again


# The kinds a caller that keeps trying (the ingester) waits out: busy, and away (restarting).
RETRY_AWAY = frozenset({Kind.BUSY, Kind.UNAVAILABLE, Kind.OUTCOME_UNKNOWN})
# The kinds a one-shot command waits out: a busy daemon (a rebuild running), not an absent one.
RETRY_BUSY = frozenset({Kind.BUSY})
NO_RETRY: frozenset[Kind] = frozenset()


def unavailable() -> Unanswered:
    """The contract's retryable BUSY for a request no daemon answered."""
    return Unanswered(E.error_reply(E.BUSY, UNAVAILABLE_MESSAGE, UNAVAILABLE_RETRY_AFTER_MS))


def outcome_unknown(request_id: str) -> Unanswered:
    """The contract's BUSY for a mutation that was sent and not answered (``protocol.errors``)."""
    return Unanswered(E.outcome_unknown(request_id, UNAVAILABLE_RETRY_AFTER_MS))


def kind(reply: Any) -> Kind:
    if not E.is_error_reply(reply):
        return Kind.NOT_FOUND if isinstance(reply, dict) and reply.get("status") == "NOT_FOUND" else Kind.DONE
    err = reply.get("error")
    err = err if isinstance(err, dict) else {}
    code = err.get("code")
    if code == E.BUSY:
        if err.get("outcome_unknown") is True:
            return Kind.OUTCOME_UNKNOWN
        return Kind.UNAVAILABLE if isinstance(reply, Unanswered) else Kind.BUSY
    return Kind.NOT_FOUND if code == E.NOT_FOUND else Kind.REFUSED


def is_unavailable(reply: Any) -> bool:
    """True when no daemon answered (made up here, not a daemon's BUSY): the spawner should look again."""
    return kind(reply) in (Kind.UNAVAILABLE, Kind.OUTCOME_UNKNOWN)


def retry_after_s(reply: dict[str, Any]) -> float:
    """How long to wait before sending again: the reply's retry_after_ms, else the daemon's usual."""
    err = reply.get("error")
    ms = err.get("retry_after_ms", L.BUSY_RETRY_AFTER_MS) if isinstance(err, dict) else L.BUSY_RETRY_AFTER_MS
    return max(RETRY_MIN_S, ms / 1000)


def describe(op: str, reply: dict[str, Any]) -> str:
    """An error reply as one line for a person: ``op: CODE: message``."""
    err = reply.get("error") or {}
    return f"{op}: {err.get('code')}: {err.get('message')}"
