"""A background snapshot's base takes the place of the rows the daemon holds in memory (columns.py
``MessageTable.rebase_*``, Store.rebase_step): written by a forked child in the table's own numbering,
mapped copy-on-write once installed, checked against the rows a step at a time with the rows written
since the fork put into the mapping, then put in place of the rows below its end. What the table
answers is what a replay of the log builds, at every step and after a restart; a base that is not the
rows is given up and the rows stay."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from storaged import snapshot
from storaged.columns import ROW_DTYPE
from storaged.store import Store
from tests.support.faultio import delete, live_state, update, write
from tests.support.replayed import opened, replay_copy

pytestmark = pytest.mark.unit

N = 3000


def _replayed(d: str, tmp_path, name: str = "replayed") -> dict:
    s = Store.open(replay_copy(d, str(tmp_path / name)))
    try:
        return live_state(s)
    finally:
        s.close()


def _filled(d: str, n: int = N) -> tuple[Store, list[str]]:
    s = Store.open(d)
    ids = [write(s, f"s{i % 13}", f"message {i} about the rebase", ("user", "assistant", "system")[i % 3], tags=[f"t{i % 5}"],
                 **({"summary": f"sum {i}"} if i % 11 == 0 else {}))["message"]["message_id"] for i in range(n)]
    return s, ids


def _forked(s: Store, plan, meanwhile) -> int:
    """Write ``plan``'s snapshot in a forked child, as the daemon's background snapshot does, while this
    process runs ``meanwhile`` (rows changed after the fork); returns the log position it covers."""
    tmp = s.snapshot_path + ".bg"
    pos = s.writer.size
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its own frozen copy of the store
        code = 1
        try:
            os.close(r)
            s.write_snapshot_file(tmp, plan)
            os.replace(tmp, s.snapshot_path)
            code = 0
        finally:
            os.write(w, bytes([code]))
            os._exit(code)
    os.close(w)
    meanwhile()
    assert os.read(r, 1) == b"\x00"
    os.close(r)
    assert os.waitpid(pid, 0)[1] == 0
    return pos


def _installed(s: Store, plan, meanwhile=lambda: None) -> None:
    """_forked, then installed as the daemon installs a background snapshot (which maps its base)."""
    s.install_snapshot(None, _forked(s, plan, meanwhile), plan, background=True)


def test_a_background_base_takes_the_place_of_the_rows(tmp_path):
    d = str(tmp_path / "d")
    s, ids = _filled(d)
    try:
        t = s.table
        plan = s.plan_snapshot()
        first, end = plan.rebase   # (seqs count from 1: a base's rows from 0, never used)
        assert plan.rows_base and (first, end) == (0, N + 1)

        def meanwhile():   # updated, deleted and new rows, the fork's copy never sees them
            for i in (0, 1, 1500, N - 1):
                update(s, ids[i], content=f"changed {i}", tags=["changed"])
            delete(s, ids[7])
            for i in range(40):
                write(s, "s-late", f"after the fork {i}")

        _installed(s, plan, meanwhile)
        assert t.rebasing and t.nbase == 0 and plan.rows_name in t.mapped_names()
        steps = 0
        while s.rebase_step(257):
            if steps == 3:   # a row of a part already checked, written before the mapping is put in place
                update(s, ids[10], content="changed during the check")
            if steps == 6:
                assert live_state(s) == _replayed(d, tmp_path, "during")
            steps += 1
        assert steps >= N // 257
        assert t.nbase == end and t._base_map is not None and t._rows_file == plan.rows_name
        assert len(t.rows) == (len(t.etype) - end) * ROW_DTYPE.itemsize   # only the rows past the base
        while t.rebasing:   # the rows it replaced, freed a step at a time
            s.rebase_step(257)
        assert t._rows_retired == []
        assert live_state(s) == _replayed(d, tmp_path, "after")
        # the base's id keys, mapped, are the lookup's base level; the merged ones only those past it
        assert t._keys_file == plan.rows_name and not t.base_keys.flags.writeable
        assert len(t.base_keys) == N and (t.key_seqs >= end).all()
        assert all(t.seq_of(mid) is not None for i, mid in enumerate(ids) if i != 7) and t.seq_of(ids[7]) is None
        write(s, "s-later", "after the rebase")
        update(s, ids[20], content="a mapped row changed")
        state = live_state(s)
        assert state == _replayed(d, tmp_path, "later")
        assert s.write_snapshot()
    finally:
        s.close()
    s = Store.open(d)   # the base loads as any base: mapped, with the deltas after it
    try:
        assert s.table.nbase >= end and live_state(s) == state
    finally:
        s.close()


def _damage_a_row(f, where, first: int) -> None:
    """A row the table never wrote since differs in the file."""
    f.seek(where.rows_at + (2000 - first) * ROW_DTYPE.itemsize + ROW_DTYPE.fields["ts"][1])
    f.write(b"\xff")


def _damage_a_key(f, where, first: int) -> None:
    """The last id key one more: still sorted, no longer the key of the row it names."""
    f.seek(where.keys_at + 8 * (where.keys - 1))
    last = int.from_bytes(f.read(8), "little")
    f.seek(where.keys_at + 8 * (where.keys - 1))
    f.write((last + 1).to_bytes(8, "little"))


@pytest.mark.parametrize("damage, said", [(_damage_a_row, "row 2000 of the base"),
                                          (_damage_a_key, "differ from the ids of the rows they name")])
def test_a_base_that_is_not_the_rows_is_given_up(tmp_path, caplog, damage, said):
    """The base is checked against the table a step at a time, its rows and its id keys: one that
    differs gives the base up, and the rows and keys in memory go on answering."""
    d = str(tmp_path / "d")
    s, ids = _filled(d)
    try:
        t = s.table
        plan = s.plan_snapshot()
        pos = _forked(s, plan, lambda: None)
        path = os.path.join(d, plan.rows_name)
        where = snapshot.rows_sections_at(s.io, path, *plan.rebase)
        assert where.own and where.keys == N
        with pytest.raises(snapshot.SnapshotInvalid, match="does not hold seqs"):   # not the planned seqs
            snapshot.rows_sections_at(s.io, path, plan.rebase[0] + 1, plan.rebase[1] + 1)
        with open(path, "r+b") as f:
            damage(f, where, plan.rebase[0])
        s.install_snapshot(None, pos, plan, background=True)
        assert t.rebasing
        with caplog.at_level(logging.WARNING, logger="convmem.storaged"):
            while s.rebase_step(500):
                pass
        assert said in caplog.text
        assert not t.rebasing and t.nbase == 0 and t._base_map is None and len(t.rows) >= N * ROW_DTYPE.itemsize
        assert t._keys_file is None and all(t.seq_of(mid) is not None for mid in ids)
        assert live_state(s) == _replayed(d, tmp_path)
    finally:
        s.close()


def test_a_base_with_a_gap_takes_the_place_of_the_rows(tmp_path):
    """A message deleted in the middle: the base lies as the rows do all the same (its seq a dead row of
    zeros), so it is tracked, mapped and put in place of the rows like any base; a message deleted
    after the fork is a row that differs and is dead, which the check passes over."""
    d = str(tmp_path / "d")
    s, ids = _filled(d, 500)
    try:
        delete(s, ids[100])
        plan = s.plan_snapshot()
        first, end = plan.rebase
        assert plan.rows_base and (first, end) == (0, 501) and plan.rows_after[0][1] == 501
        _installed(s, plan, lambda: (update(s, ids[3], content="changed"), delete(s, ids[200])))
        while s.rebase_step(97):
            pass
        t = s.table
        assert t.nbase == end and t._rows_file == plan.rows_name
        assert len(t.rows) == (len(t.etype) - end) * ROW_DTYPE.itemsize   # only the rows past the base
        assert t.seq_of(ids[100]) is None and t.seq_of(ids[200]) is None
        state = live_state(s)
        assert state == _replayed(d, tmp_path)
    finally:
        s.close()
    with opened(d) as s:
        assert s.table._base_map is not None and live_state(s) == state


def test_rows_mostly_deleted_are_written_numbered_as_before(tmp_path):
    """More dead seqs than live ones between the first and the last (columns.BASE_HOLES_MAX): the base
    lists the live rows only, in its own numbering, nothing is tracked, and it loads as ever."""
    d = str(tmp_path / "d")
    s, ids = _filled(d, 500)
    try:
        for mid in ids[1:300]:
            delete(s, mid)
        assert s.table.rebase_span() is None
        plan = s.plan_snapshot()
        assert plan.rows_base and plan.rebase is None and s.table._rebase_dirty is None
        assert plan.rows_after[0][1] == 201
        _installed(s, plan, lambda: update(s, ids[3 + 300], content="changed"))
        assert not s.table.rebasing and not s.rebase_step(500)
        state = live_state(s)
    finally:
        s.close()
    with opened(d) as s:
        assert live_state(s) == state


def test_an_abandoned_snapshot_stops_the_tracking(tmp_path):
    d = str(tmp_path / "d")
    s, ids = _filled(d, 200)
    try:
        plan = s.plan_snapshot()
        assert s.table._rebase_dirty is not None
        update(s, ids[5], content="changed")
        assert s.table._rebase_dirty == {s.table.seq_of(ids[5])}
        s.abandon_snapshot(plan)
        assert s.table._rebase_dirty is None
        update(s, ids[6], content="changed")
        assert s.table._rebase_dirty is None and not s.table.rebasing
    finally:
        s.close()


def test_own_numbering_keeps_the_tables_whole(tmp_path):
    """The base's tables are the table's (sessions, tag sets, tool call ids as they lie), its rows
    byte for byte the table's; a store that reads it maps it without renumbering."""
    d = str(tmp_path / "d")
    s, ids = _filled(d, 300)
    try:
        t = s.table
        seqs = t.live_seqs()
        own = t.segment_columns(seqs, own=True)
        assert own["sids"] == t.sids and own["tcid"] == bytes(t.tcid_bytes)
        assert own["rows"] == t._gather(seqs).tobytes()
        numbered = t.segment_columns(seqs)
        assert np.array_equal(np.frombuffer(own["keys"], "<u8"), np.frombuffer(numbered["keys"], "<u8"))
        assert own["etype"] == numbered["etype"] and own["summary"] == numbered["summary"]
    finally:
        s.close()


def _checked(s: Store) -> None:
    while s.rebase_step(500):
        pass


def test_a_daemon_started_from_a_mapped_base_maps_the_next(tmp_path):
    """Rows of the base mapped at the start, changed after the next base's fork, and rows past it."""
    d = str(tmp_path / "d")
    s, ids = _filled(d, 1000)
    assert s.write_snapshot()
    s.close()
    with opened(d) as s:
        t = s.table
        old_end = t.nbase
        assert old_end and t._base_map is not None
        for i in range(300):
            write(s, "s-more", f"past the first base {i}")
        s.rows_legacy = True   # a base is due
        plan = s.plan_snapshot()
        assert plan.rebase is not None and plan.rebase[1] > old_end
        _installed(s, plan, lambda: [update(s, ids[i], content=f"changed {i}") for i in (0, 500, 999)])
        _checked(s)
        assert t.nbase == plan.rebase[1] and t._rows_file == plan.rows_name
        assert live_state(s) == _replayed(d, tmp_path)


def test_the_pending_base_is_never_cut_under_its_mapping(tmp_path):
    """Another base installed while one is being checked names it no more: its file is unlinked, not
    cut a piece at a time (its pages would be gone from under the mapping: SIGBUS), and the check goes on."""
    from storaged.fileio import FileIO

    class Spy(FileIO):
        def __init__(self):
            super().__init__()
            self.released: list[str] = []

        def release(self, path):
            self.released.append(os.path.basename(path))
            super().release(path)

    d = str(tmp_path / "d")
    s, ids = _filled(d, 1000)
    s.close()
    io = Spy()
    s = Store.open(d, io)
    try:
        plan = s.plan_snapshot()
        _installed(s, plan)
        assert s.rebase_step(100)   # under way
        for mid in ids[100:700]:   # mostly deleted: the next base is numbered as ever, and tracks nothing
            delete(s, mid)
        s.rows_legacy = True
        second = s.plan_snapshot()
        assert second.rows_base and second.rebase is None and s.table.rebase_checking
        _installed(s, second)
        assert plan.rows_name not in os.listdir(d) and plan.rows_name not in io.released
        _checked(s)
        assert s.table._rows_file == plan.rows_name
        assert live_state(s) == _replayed(d, tmp_path)
    finally:
        s.close()


def test_a_new_base_planned_while_one_is_checked_starts_over(tmp_path):
    d = str(tmp_path / "d")
    s, ids = _filled(d, 1000)
    try:
        first = s.plan_snapshot()
        _installed(s, first)
        assert s.rebase_step(100) and s.table.rebase_checking
        write(s, "s-more", "one more")
        s.rows_legacy = True
        second = s.plan_snapshot()   # the first one's mapping is given up, the tracking starts over
        assert not s.table.rebase_checking and s.table._rebase_dirty == set()
        _installed(s, second, lambda: update(s, ids[3], content="changed after the second fork"))
        _checked(s)
        assert s.table._rows_file == second.rows_name and s.table.nbase == second.rebase[1]
        assert live_state(s) == _replayed(d, tmp_path)
    finally:
        s.close()


def test_relocated_rows_are_noted(tmp_path):
    """A compaction moving a text writes its row (its location, its generation): noted like a write."""
    d = str(tmp_path / "d")
    s, ids = _filled(d, 100)
    try:
        t = s.table
        s.plan_snapshot()
        seq = t.seq_of(ids[4])
        t.relocate(seq, t.row(seq)[6] << 40 | t.row(seq)[7], t.rec_size(seq), t.source_of(seq))
        assert t._rebase_dirty == {seq}
    finally:
        s.close()


def test_a_base_that_cannot_be_read_leaves_the_rows(tmp_path, caplog):
    d = str(tmp_path / "d")
    s, ids = _filled(d, 300)
    try:
        plan = s.plan_snapshot()
        pos = _forked(s, plan, lambda: None)
        with open(os.path.join(d, plan.rows_name), "r+b") as f:
            f.write(b"NOTAROWS")   # its magic number
        with caplog.at_level(logging.WARNING, logger="convmem.storaged"):
            s.install_snapshot(None, pos, plan, background=True)
        assert "cannot take the place" in caplog.text
        assert not s.table.rebasing and s.table._rebase_dirty is None
        assert live_state(s) == _replayed(d, tmp_path)
    finally:
        s.close()


def test_tables_mostly_unused_are_written_numbered_as_ever(tmp_path, monkeypatch):
    """Whole tables holding more no row uses than OWN_WASTE_MAX allows: a base numbered as ever (which
    leaves them behind), its head saying so, and the rows stay in memory."""
    from storaged import columns
    d = str(tmp_path / "d")
    s, ids = _filled(d, 200)
    try:
        monkeypatch.setattr(columns, "OWN_WASTE_MAX", 0)
        s.table.sids.append("a-session-with-no-rows")
        plan = s.plan_snapshot()
        pos = _forked(s, plan, lambda: None)
        own = snapshot.rows_sections_at(s.io, os.path.join(d, plan.rows_name), *plan.rebase).own
        assert not own
        s.install_snapshot(None, pos, plan, background=True)
        assert not s.table.rebasing and s.table.nbase == 0
    finally:
        s.close()


def test_a_base_with_more_or_fewer_id_keys_than_the_table_is_given_up(tmp_path, caplog):
    d = str(tmp_path / "d")
    s, ids = _filled(d)
    try:
        t = s.table
        plan = s.plan_snapshot()
        pos = _forked(s, plan, lambda: None)
        t._rebase_keys += 1   # (as if a live id had no key in it)
        with caplog.at_level(logging.WARNING, logger="convmem.storaged"):
            s.install_snapshot(None, pos, plan, background=True)
        assert f"holds {N} id keys where the table had {N + 1}" in caplog.text
        assert not t.rebasing and t.nbase == 0
        assert all(t.seq_of(mid) is not None for mid in ids)
    finally:
        s.close()


def test_merges_after_a_rebase_leave_the_base_keys_mapped(tmp_path, monkeypatch):
    """Ids put after the base merge into the in-memory level only: the base's keys stay mapped (a merge
    into them made all of them the heap's)."""
    from storaged import columns
    monkeypatch.setattr(columns, "RECENT_MAX", 64)
    d = str(tmp_path / "d")
    s, ids = _filled(d, 600)
    try:
        t = s.table
        plan = s.plan_snapshot()
        _installed(s, plan)
        while s.rebase_step(4096):
            pass
        base = t.base_keys
        assert not base.flags.writeable
        late = [write(s, "s-late", f"late {i}")["message"]["message_id"] for i in range(300)]
        delete(s, ids[3])
        delete(s, late[5])
        assert t.base_keys is base and len(t.keys) >= 256
        assert (t.key_seqs < plan.rebase[1]).sum() < 64   # (only ids still recent at the install)
        assert t.seq_of(ids[3]) is None and t.seq_of(late[5]) is None
        assert all(t.seq_of(mid) is not None for mid in ids[4:] + late[6:])
        state = live_state(s)
        assert state == _replayed(d, tmp_path)
    finally:
        s.close()


def test_a_start_keeps_the_base_id_keys_mapped_with_deleted_ids_in_them(tmp_path):
    """A start maps the base's id keys as they are, those of ids deleted after it included: a lookup of
    a deleted id finds nothing, and no copy of the keys is made to leave them out."""
    d = str(tmp_path / "d")
    s, ids = _filled(d, 12_000)   # (a row segment under 1 MB is read, not mapped)
    try:
        assert s.write_snapshot()   # (a base)
        delete(s, ids[9])
        write(s, "s-late", "after the base")
        assert s.write_snapshot()   # (a delta after it)
    finally:
        s.close()
    with opened(d) as s:
        t = s.table
        assert t._keys_file is not None and not t.base_keys.flags.writeable and len(t.base_keys) == 12_000
        assert t.seq_of(ids[9]) is None and all(t.seq_of(mid) is not None for mid in ids[10:])


def test_the_check_lets_go_of_the_current_base_s_pages_it_reads(tmp_path):
    """The check compares each window of the new base with the table's rows, read from the current base
    for the seqs below its end, and checks the id keys without reading rows at random (the keys' and the
    rows' sums of (key, seq) pairs): so the current base's pages are let go a window at a time, not left
    resident until the install unmaps it (under a bulk import, the whole old base: ~270 MB at 2.9M)."""
    from tests.unit.test_release_pages import _resident_kib

    d = str(tmp_path / "d")
    s, _ = _filled(d, N)
    assert s.write_snapshot()
    s.close()
    with opened(d) as s:
        t = s.table
        old_end, old_path = t.nbase, os.path.join(d, t._rows_file)
        assert old_end and t._base_map is not None
        for i in range(300):
            write(s, "s-more", f"past the first base {i}")
        s.rows_legacy = True   # a base is due
        plan = s.plan_snapshot()
        _installed(s, plan)
        assert t._rebase is not None
        t.release_pages()
        assert t.rebase_step(old_end)   # every row of the current base checked, the rows past it still to come
        assert t._rebase.next >= old_end and t._base_map is not None
        assert _resident_kib(old_path) <= 8, "the current base's rows the check read stayed resident"
        _checked(s)
        assert t.nbase == plan.rebase[1]
        assert live_state(s) == _replayed(d, tmp_path)


def test_a_message_deleted_during_the_check_does_not_make_the_keys_differ(tmp_path):
    """The keys' sum counts the ids that were live at the fork, whenever the rows pass and the keys pass
    meet a row deleted since (before, between or after the two): the base is put in place, and the
    deleted id is not found through it."""
    d = str(tmp_path / "d")
    s, ids = _filled(d)
    try:
        t = s.table
        plan = s.plan_snapshot()
        _installed(s, plan, lambda: delete(s, ids[10]))   # deleted after the fork, before the check
        assert t.rebase_step(1500)                           # the rows pass past seq 1500, the keys pass too
        delete(s, ids[100])                                  # behind both passes' first window
        delete(s, ids[2900])                                 # ahead of the rows pass
        _checked(s)
        assert t.nbase == plan.rebase[1] and t._rows_file == plan.rows_name
        for i in (10, 100, 2900):
            assert t.seq_of(ids[i]) is None
        assert live_state(s) == _replayed(d, tmp_path)
    finally:
        s.close()


def test_after_a_compaction_s_relocation_a_base_takes_the_place_of_the_rows_it_rewrote(tmp_path):
    """A rebuild's relocation rewrites every row (each a private copy, or on the heap, until a restart
    before): once it is over, generation 0 names the new log too (MessageTable.relocated) and a base is
    due, which is mapped in place of the rows; every text still reads right, through a second rebuild
    whose relocation moves the mapped rows (generation 0's) in their turn."""
    from storaged import compaction

    d = str(tmp_path / "d")
    s, ids = _filled(d, 1200)
    try:
        for mid in ids[5:400:7]:
            delete(s, mid)
        assert compaction.rebuild(s)["status"] == "OK"
        assert s.relocate_step(100) and s.table.rebase_span() is None   # (rows still to move read the old log)
        while s.relocate_step(500):
            pass
        assert s.table.generation and s.table.rebase_span() is not None and s.rebase_due()
        assert not s.base_due()   # (a stop's inline snapshot writes no base for it: it would map nothing)
        plan = s.plan_snapshot()
        assert plan.rows_base and plan.rebase is not None
        _installed(s, plan, lambda: update(s, ids[3], content="changed after the fork"))
        _checked(s)
        t = s.table
        assert t._rows_file == plan.rows_name and t.nbase == plan.rebase[1] and not s.rebase_due()
        state = live_state(s)
        assert state == _replayed(d, tmp_path)
        assert compaction.rebuild(s)["status"] == "OK"   # the mapped rows (generation 0) move in their turn
        while s.relocate_step(300):
            pass
        assert live_state(s) == state
        write(s, "s-late", "after the second rebuild")
        state = live_state(s)
        assert s.write_snapshot()
    finally:
        s.close()
    with opened(d) as s:
        assert live_state(s) == state


def test_a_stop_right_after_a_rebuild_writes_no_base(tmp_path):
    """The rows a relocation rewrote are left to the next background snapshot (``rebase_due``): a stop's
    inline snapshot would rewrite every row the rebuild's own base already holds, and map nothing."""
    from storaged import compaction

    d = str(tmp_path / "d")
    s, ids = _filled(d, 300)
    try:
        assert compaction.rebuild(s)["status"] == "OK"
        rows = [entry[0] for entry in s.row_segments]
        s.write_snapshot()   # (the relocation ends in it)
        assert s.rows_relocated and [entry[0] for entry in s.row_segments][:1] == rows[:1]
    finally:
        s.close()


def test_a_rebuild_of_a_store_with_nothing_live_still_lets_a_later_base_take_the_rows_place(tmp_path):
    """No live message to move: the relocation ends without the new log ever becoming a generation;
    ``relocated`` makes it one (it was left naming the old log, and no base was mapped in place again)."""
    from storaged import compaction

    d = str(tmp_path / "d")
    s, ids = _filled(d, 50)
    try:
        for mid in ids:
            delete(s, mid)
        assert compaction.rebuild(s)["status"] == "OK"
        while s.relocate_step(100):
            pass
        assert not s.rebase_due()   # (nothing was rewritten)
        new = [write(s, "s-after", f"after the empty rebuild {i}")["message"]["message_id"] for i in range(200)]
        assert s.table.rebase_span() is not None
        s.rows_legacy = True   # (a base due, whatever the reason)
        plan = s.plan_snapshot()
        assert plan.rows_base and plan.rebase is not None
        _installed(s, plan)
        _checked(s)
        assert s.table._rows_file == plan.rows_name
        assert all(s.table.seq_of(mid) is not None for mid in new)
        state = live_state(s)
        assert state == _replayed(d, tmp_path)
    finally:
        s.close()


def test_a_rebuild_of_a_store_mostly_deleted_makes_no_base_due(tmp_path):
    """Its rows cannot lie as the table's do (more dead than live): no base would be mapped in their place,
    so none is due for the relocation — and the request loop asks a flag at each turn, not the rows."""
    from storaged import compaction

    d = str(tmp_path / "d")
    s, ids = _filled(d, 300)
    try:
        for mid in ids[:200]:
            delete(s, mid)
        assert compaction.rebuild(s)["status"] == "OK"
        while s.relocate_step(100):
            pass
        assert s.table.rebase_span() is None and not s.rows_relocated and not s.rebase_due()
    finally:
        s.close()
