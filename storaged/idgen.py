"""Message ids and timestamps that never go backwards, even when the wall clock does.

ULIDs sort by time; a store whose ids went back after an NTP step would break every keyset cursor
and the tie-break "recency, then id". So the generator remembers the newest millisecond and id it
has issued (recovered from the log at start) and never goes below them.
"""
from __future__ import annotations

import os
import time

from ulid import ULID

_RAND_MAX = (1 << 80) - 1


def ulid_parts(ulid: str) -> tuple[int, int]:
    """(milliseconds, 80-bit random part) of a canonical ULID string."""
    value = int.from_bytes(ULID.from_str(ulid).bytes, "big")
    return value >> 80, value & _RAND_MAX


class IdClock:
    def __init__(self, wall_ms=lambda: time.time_ns() // 1_000_000) -> None:
        self._wall_ms = wall_ms
        self.last_ms = 0          # newest timestamp handed out (timestamp or updated_at)
        self.last_id_ms = 0
        self.last_rand = 0
        self.last_id = ""
        self._decoded = True

    def observe_id(self, ulid: str) -> None:
        # Canonical ULID strings sort like their values; decoding waits until an id is needed,
        # so replaying a million records does not decode a million ids.
        if ulid > self.last_id:
            self.last_id = ulid
            self._decoded = False

    def _decode_last(self) -> None:
        if not self._decoded:
            self.last_id_ms, self.last_rand = ulid_parts(self.last_id)
            self.observe_ms(self.last_id_ms)
            self._decoded = True

    def observe_ms(self, ms: int) -> None:
        if ms > self.last_ms:
            self.last_ms = ms

    def now_ms(self) -> int:
        self._decode_last()
        ms = max(self._wall_ms(), self.last_ms)
        self.last_ms = ms
        return ms

    def new_id(self) -> tuple[str, int]:
        """A fresh ULID strictly above every id seen so far, and its millisecond."""
        ms = self.now_ms()
        if ms <= self.last_id_ms:
            ms = self.last_id_ms
            rand = self.last_rand + 1
            if rand > _RAND_MAX:  # 2^80 ids in one millisecond: move to the next one
                ms, rand = ms + 1, int.from_bytes(os.urandom(10), "big") >> 1
        else:
            rand = int.from_bytes(os.urandom(10), "big") >> 1  # headroom for +1 within the ms
        value = (ms << 80) | rand
        ulid = str(ULID.from_bytes(value.to_bytes(16, "big")))
        self.last_id, self.last_id_ms, self.last_rand = ulid, ms, rand
        self.last_ms = max(self.last_ms, ms)
        return ulid, ms
