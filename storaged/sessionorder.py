"""The order of the ``sessions`` view, and how it moved while someone was paging through it.

Sessions are listed by (started_at, session_id), where started_at is the earliest timestamp among a
session's live messages. That key is not fixed: importing an older message moves a session earlier,
deleting its earliest message moves it later. A plain keyset cursor would then show a session twice
when it moves from the pages already served to those still ahead (and miss one moving the other way).

Skipping is unavoidable without a snapshot of the whole list, but repeating is not: every move of an
existing session is journalled with a counter, a cursor carries the counter of its first page, and a
later page leaves out a session whose key *at that time* lay on the side already served. The
journal is bounded; a cursor older than what it still holds pages as a plain keyset (and a cursor of
an earlier daemon process, whose journal is gone, too).
"""
from __future__ import annotations

import os
from collections import deque
from typing import Any

MOVES_KEPT = 4096


class SessionOrder:
    def __init__(self) -> None:
        self._cache: list[tuple[int, str]] | None = None
        self._moves: deque[tuple[int, str, int]] = deque(maxlen=MOVES_KEPT)  # (clock, session id, old key)
        self.clock = 0
        self.nonce = os.urandom(4).hex()  # tells this process's clock values from another's

    def invalidate(self) -> None:
        self._cache = None

    def moved(self, sid: str, old_key: int) -> None:
        """An existing session's started_at changed from ``old_key``."""
        self._cache = None
        self.clock += 1
        self._moves.append((self.clock, sid, old_key))

    def order(self, sessions: dict[str, Any]) -> list[tuple[int, str]]:
        if self._cache is None:
            self._cache = sorted((s.min_ts, sid) for sid, s in sessions.items())
        return self._cache

    def keys_then(self, nonce: str, since_clock: int) -> dict[str, int] | None:
        """The started_at, as of ``since_clock``, of every session that moved since; None when that is
        no longer known (another process's cursor, or more moves since than the journal keeps)."""
        if nonce != self.nonce or since_clock > self.clock:
            return None
        if self._moves and self._moves[0][0] > since_clock + 1 and len(self._moves) == MOVES_KEPT:
            return None
        then: dict[str, int] = {}
        for clock, sid, old in reversed(self._moves):
            if clock <= since_clock:
                break
            then[sid] = old  # the earliest move after since_clock wins: it is overwritten last
        return then
