"""A rebuild writes a compacted log, an index and rows beside the files they replace (at 5M events the
data directory went 11.1 → 21.3 GB at its peak): without room for them it is refused at once with the
contract's IO_ERROR, and nothing changes — not a worker that fills the disk, fails, and takes the space
every other write needs with it while it runs."""
from __future__ import annotations

import errno
import os

import pytest
from ulid import ULID

from protocol import errors as E
from protocol import wire
from storaged import compaction
from storaged.fileio import FileIO
from storaged.server import Server
from storaged.store import Store
from tests.support.faultio import delete, live_state, write


class _Room(FileIO):
    """A file system with ``free`` bytes left."""
    free = 0

    def free_bytes(self, path: str) -> int | None:
        return self.free


def _files(d: str) -> dict[str, int]:
    return {n: os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if os.path.isfile(os.path.join(d, n))}


def test_a_rebuild_without_room_for_its_files_is_refused_and_changes_nothing(tmp_path):
    d = str(tmp_path / "data")
    io = _Room()
    store = Store.open(d, io)
    ids = [write(store, f"s{i % 3}", f"room to rebuild {i} " * 40)["message"]["message_id"] for i in range(80)]
    for mid in ids[::9]:
        delete(store, mid)
    assert store.write_snapshot()
    need = compaction.space_needed(store)
    assert need > store.live_bytes + store.snapshot_bytes()  # its files and a margin
    files, state = _files(d), live_state(store)
    server = Server(store, "inproc://convmem-rebuild-space")
    try:
        io.free = need - 1
        rep = server.handle([wire.encode_request("rebuild_index", {}, str(ULID()))], [b"peer", b""])
        assert rep["status"] == "ERROR" and rep["error"]["code"] == E.IO_ERROR, rep
        assert "GiB free" in rep["error"]["message"] and "unchanged" in rep["error"]["message"]
        assert not store.rebuilding and server.rebuild_child is None and server.rebuild_id is None
        assert _files(d) == files and live_state(store) == state
        with pytest.raises(OSError) as exc:  # the in-process rebuild (salvage's) says the same
            compaction.rebuild(store)
        assert exc.value.errno == errno.ENOSPC and _files(d) == files
        io.free = need  # just enough
        assert compaction.rebuild(store)["status"] == "OK" and live_state(store) == state
    finally:
        server.close()
        store.close()


def test_a_file_system_that_cannot_say_its_free_space_does_not_stop_a_rebuild(tmp_path):
    class Unknown(FileIO):
        def free_bytes(self, path: str) -> int | None:
            return None

    store = Store.open(str(tmp_path / "data"), Unknown())
    write(store, "s", "a message")
    assert compaction.space_shortfall(store) is None and compaction.rebuild(store)["status"] == "OK"
    store.close()
    assert FileIO().free_bytes(str(tmp_path)) > 0  # statvfs on this machine


def test_a_slow_install_tells_its_phases_in_the_log(tmp_path, monkeypatch, caplog):
    # an install that holds the request loop past SLOW_INSTALL_S says which of its phases took the time
    store = Store.open(str(tmp_path / "data"))
    for i in range(20):
        write(store, "s", f"a message {i}")
    monkeypatch.setattr(compaction, "SLOW_INSTALL_S", -1.0)
    with caplog.at_level("INFO", logger="convmem.storaged"):
        assert compaction.rebuild(store)["status"] == "OK"
    line = next(r.getMessage() for r in caplog.records if "install took" in r.getMessage())
    for phase in ("the log swapped", "the metadata kept", "the index swapped",
                  "the snapshot swapped and the directory synced", "the old segments let go"):
        assert phase in line
    store.close()
