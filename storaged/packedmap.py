"""A mapping whose values are kept as msgpack bytes and unpacked on each read.

The sessions' metadata and the ingesters' checkpoints are small maps, one a session or a file: as
Python dicts they cost ~2.7 KB a session in the scale bench (keys, strings, a ``calls`` dict each),
~64 bytes a message, 300 MB at five million events. Packed, the same facts take their msgpack size
(~900 bytes a session) in one bytes object each. They are read a few at a time (a listing's page, a
status call, a snapshot's tail), so unpacking on access costs microseconds where it is paid.

A few fields that filters read for every session (a session's harness, source and mode when a
listing filters by them) are kept beside the bytes as one shared tuple (``hot``), so a scan over
every session unpacks nothing.

Values come back as fresh dicts: a caller that changes one changes nothing here (put it back).
"""
from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from sys import intern
from typing import Any

import msgpack

_HOT_SHARED_MAX = 4096   # distinct hot tuples kept shared (harness × source × mode: a handful)


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def unpack(raw: bytes) -> Any:
    # the log's own rules: map keys of any msgpack type, str as str and bin as bytes
    return msgpack.unpackb(raw, raw=False, strict_map_key=False, use_list=True)


def is_packed_map(raw: bytes) -> bool:
    """Whether ``raw`` begins as msgpack's map does (fixmap, map 16, map 32): what a start checks of
    values it keeps without unpacking them."""
    return bool(raw) and (0x80 <= raw[0] <= 0x8F or raw[0] in (0xDE, 0xDF))


class PackedMap(MutableMapping):
    """key → value (a msgpack-able map), stored packed. ``hot_fields`` names the fields ``hot(key)``
    answers without unpacking."""

    __slots__ = ("_packed", "_hot", "_hot_fields", "_shared")

    def __init__(self, hot_fields: tuple[str, ...] = ()) -> None:
        self._packed: dict[Any, bytes] = {}
        self._hot: dict[Any, tuple] = {}
        self._hot_fields = hot_fields
        self._shared: dict[tuple, tuple] = {}

    def __getitem__(self, key: Any) -> Any:
        return unpack(self._packed[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        self.set_packed(key, pack(value), value)

    def set_packed(self, key: Any, raw: bytes, value: Any = None, hot: Any = None) -> Any:
        """Store ``raw`` (the msgpack of ``value``; unpacked here when ``value`` is None and hot
        fields are kept, unless ``hot`` gives their values as ``hot(key)`` did where ``raw`` was
        stored before: a row segment's tail, which a start then takes without unpacking anything).
        Returns ``value`` (None if it was not needed)."""
        if self._hot_fields:
            shared = None if hot is None else self._tail_hot(hot)
            if shared is None:
                if value is None:
                    value = unpack(raw)
                shared = self._share(tuple(_hot_value(value.get(f)) if isinstance(value, dict) else None
                                           for f in self._hot_fields))
            self._hot[key] = shared
        self._packed[key] = raw
        return value

    def _tail_hot(self, hot: Any) -> tuple | None:
        """A tail's list of hot values as the shared tuple ``hot(key)`` gives (looked up as it is
        first: a store has a handful of them), or None when it is not one (not as long as the hot
        fields, or a value that cannot be a dict key: a list, a map)."""
        if hot.__class__ is not list or len(hot) != len(self._hot_fields):
            return None
        hot = tuple(hot)
        try:
            shared = self._shared.get(hot)
        except TypeError:
            return None
        return shared if shared is not None else self._share(tuple(map(_hot_value, hot)))

    def _share(self, hot: tuple) -> tuple:
        shared = self._shared.get(hot)
        if shared is None:
            shared = hot
            if len(self._shared) < _HOT_SHARED_MAX:
                self._shared[hot] = hot
        return shared

    def pop_packed(self, key: Any) -> bytes | None:
        """Remove ``key`` (if here) without unpacking it; its bytes."""
        self._hot.pop(key, None)
        return self._packed.pop(key, None)

    def __delitem__(self, key: Any) -> None:
        del self._packed[key]
        self._hot.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._packed

    def __iter__(self) -> Iterator[Any]:
        return iter(self._packed)

    def __len__(self) -> int:
        return len(self._packed)

    def only(self, keys: Any) -> "PackedMap":
        """A copy holding the entries of ``keys`` that are here (their bytes and hot tuples shared), in
        this map's order. The dicts copied and the few entries not kept deleted, in C but for those: a
        rebuild keeps every session that still has messages, and a key at a time took 59 ms of the
        request loop at 91k sessions."""
        out = PackedMap(self._hot_fields)
        out._shared = self._shared
        out._packed = dict(self._packed)
        gone = out._packed.keys() - (keys.keys() if isinstance(keys, dict) else set(keys))
        for key in gone:
            del out._packed[key]
        if self._hot_fields:
            out._hot = dict(self._hot)
            for key in gone:
                del out._hot[key]
        return out

    def field(self, key: Any, name: str) -> Any:
        """One hot field's value of ``key`` (None when absent)."""
        hot = self._hot.get(key)
        return hot[self._hot_fields.index(name)] if hot is not None else None

    def packed(self, key: Any) -> bytes | None:
        return self._packed.get(key)

    def hot(self, key: Any) -> tuple:
        """The hot fields' values of ``key`` (Nones when it is absent or lacks them)."""
        return self._hot.get(key) or (None,) * len(self._hot_fields)


def _hot_value(v: Any) -> Any:
    return intern(v) if v.__class__ is str and len(v) <= 64 else v
