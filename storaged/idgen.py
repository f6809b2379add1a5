"""Message ids and timestamps that never go backwards, even when the wall clock does.

ULIDs sort by time; a store whose ids went back after an NTP step would break every keyset cursor
and the tie-break "recency, then id". So the generator remembers the newest millisecond and id it
has issued (recovered from the log at start) and never goes below them.

But it only remembers what is plausible: an id, timestamp or updated_at more than
``CLOCK_SKEW_MAX_MS`` beyond the wall clock (an imported message dated 9999, an id ``7ZZZ...``) is
stored as it is by the store, yet never observed here. Otherwise one such record would stamp every
later write with its year, or push the id clock past the 48 bits of a ULID's time (every later write
failing) — for good, since replay observes the same record again at every start. Observing through
the bound at replay is also what heals a store poisoned before the bound existed.
"""
from __future__ import annotations

import os
import time

from ulid import ULID

from protocol import limits as L

_RAND_MAX = (1 << 80) - 1
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# the wall-clock bound is recomputed at most this often (replay observes a million records)
_LIMIT_REFRESH_MS = 1000


def ulid_parts(ulid: str) -> tuple[int, int]:
    """(milliseconds, 80-bit random part) of a canonical ULID string."""
    value = int.from_bytes(ULID.from_str(ulid).bytes, "big")
    return value >> 80, value & _RAND_MAX


def ulid_ms(ulid: str) -> int:
    """The millisecond time of a canonical ULID string (its first 10 characters)."""
    ms = 0
    for ch in ulid[:10]:
        ms = (ms << 5) | _CROCKFORD.index(ch)
    return ms


def ms_prefix(ms: int) -> str:
    """The 10-character time prefix of the ULIDs of millisecond ``ms``."""
    return "".join(_CROCKFORD[(ms >> (5 * i)) & 31] for i in range(9, -1, -1))


def _fresh_rand() -> int:
    """The random part of a millisecond's first id: 79 random bits, so +1 within the ms has headroom."""
    return int.from_bytes(os.urandom(10), "big") >> 1


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


class IdClock:
    def __init__(self, wall_ms=_wall_ms) -> None:
        self._wall_ms = wall_ms
        self.last_ms = 0          # newest timestamp handed out (timestamp or updated_at)
        self.last_id_ms = 0
        self.last_rand = 0
        self.last_id = ""
        self._decoded = True
        self.rejected = 0         # observations ignored for lying beyond the bound
        self._limit_at = None     # wall ms when _limit_ms/_limit_prefix were computed
        self._limit_ms = 0
        self._limit_prefix = ""

    def wall_ms(self) -> int:
        return self._wall_ms()

    def limit_ms(self) -> int:
        """The latest time the clock accepts to observe: the wall clock plus the allowed skew."""
        wall = self._wall_ms()
        if self._limit_at is None or not 0 <= wall - self._limit_at < _LIMIT_REFRESH_MS:
            self._limit_at = wall
            self._limit_ms = min(wall + L.CLOCK_SKEW_MAX_MS, L.TIME_MS_MAX)
            self._limit_prefix = ms_prefix(self._limit_ms)
        return self._limit_ms

    def beyond_ms(self, ms: int) -> bool:
        return ms > self.limit_ms()

    def beyond_id(self, ulid: str) -> bool:
        self.limit_ms()
        return ulid[:10] > self._limit_prefix

    def observe_id(self, ulid: str) -> None:
        # Canonical ULID strings sort like their values; decoding waits until an id is needed,
        # so replaying a million records does not decode a million ids.
        if ulid > self.last_id:
            if self.beyond_id(ulid):
                self.rejected += 1
                return
            self.last_id = ulid
            self._decoded = False

    def _decode_last(self) -> None:
        if not self._decoded:
            self.last_id_ms, self.last_rand = ulid_parts(self.last_id)
            self.observe_ms(self.last_id_ms)
            self._decoded = True

    def observe_ms(self, ms: int) -> None:
        if ms > self.last_ms:
            if self.beyond_ms(ms):
                self.rejected += 1
                return
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
                ms, rand = ms + 1, _fresh_rand()
        else:
            rand = _fresh_rand()
        if ms > L.TIME_MS_MAX:
            # unreachable while observations are bounded (it needs a wall clock beyond the year
            # 10889); refuse rather than hand out an id that is no ULID
            raise OverflowError("the id clock ran beyond the 48-bit millisecond range of a ULID")
        value = (ms << 80) | rand
        ulid = str(ULID.from_bytes(value.to_bytes(16, "big")))
        self.last_id, self.last_id_ms, self.last_rand = ulid, ms, rand
        self.last_ms = max(self.last_ms, ms)
        return ulid, ms
