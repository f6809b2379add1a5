"""Review of the message table (storaged/columns.py) and row segments of version 2: a message the
row cannot hold changes nothing; a damaged (but checksummed) row segment is refused at load, never
loaded into rows that fail when read; a mapped segment with a bad tail is refused, not a BufferError."""
from __future__ import annotations

import os

import msgpack
import numpy as np
import pytest

from storaged import snapshot
from storaged.columns import ROW_DTYPE, MessageTable
from storaged.fileio import FileIO
from storaged.store import Store
from tests.support.faultio import write
from tests.unit.test_columns import SRC, _message, _state, _table_of, _ulid


def test_a_value_the_row_cannot_hold_changes_nothing():
    """A hand-made log's timestamp or importance of 2^63 and more (check_message checks types only):
    the put is refused with ValueError and the table is as it was (it used to raise struct.error
    with the seq counted, its id answered by by_id, and a replaced row half zeroed)."""
    t = MessageTable()
    t.put(_message(1, summary="kept"))
    with pytest.raises(ValueError):
        t.put(_message(1, importance=2 ** 63, summary="new"))
    with pytest.raises(ValueError):
        t.put(_message(2, timestamp=2 ** 63))
    assert len(t) == 1 and list(t.by_seq) == [1]
    assert _ulid(2) not in t.by_id and t.by_id.get(_ulid(2)) is None
    assert _state(t.get(1)) == _state(_message(1, summary="kept"))
