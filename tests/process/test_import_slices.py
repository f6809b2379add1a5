"""An import of a thousand messages is validated and stored in slices between other clients' requests
(``Server._import_slice``, ``Store.import_steps``): a real daemon, real ZeroMQ clients, one importing
while another reads, writes, asks for a rebuild or stops the daemon.

Whether requests were served *between* the slices is seen without a clock: the second client reads
``active_messages`` while the import runs and must see a count strictly between the store's size
before it and after it — a state only a sliced import can show."""
from __future__ import annotations

import threading
from typing import Any

import pytest
from ulid import ULID

from tests.support.daemon_proc import Daemon

pytestmark = pytest.mark.timeout(120)

BATCH = 1000
TEXT = "slice test body with enough words to be a realistic transcript line " * 12  # ~800 bytes


def _batch(tag: str, n: int = BATCH, text: str = TEXT) -> list[dict[str, Any]]:
    return [{"message_id": str(ULID()), "session_id": f"imp-{tag}", "timestamp": 1_700_000_000_000 + i,
             "role": "user" if i % 2 else "assistant", "content": f"{tag} {i} {text}"} for i in range(n)]


class Importer(threading.Thread):
    """Sends ``batches`` one after another as import_messages on its own socket; keeps the replies."""

    def __init__(self, d: Daemon, batches: list[list[dict[str, Any]]]) -> None:
        super().__init__(daemon=True)
        self.d, self.batches, self.replies = d, batches, []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.d.client(timeout_ms=60_000) as c:
                for b in self.batches:
                    self.replies.append(c.call("import_messages", {"messages": b}, retries=0))
        except BaseException as exc:  # reported by the test
            self.error = exc


def _watch_partial(c, before: int, total: int, imp: Importer, *, below: int | None = None) -> int | None:
    """Read active_messages until the importer is done; the first count seen strictly between ``before``
    and ``before + total`` (and under ``below`` if given), or None if none was."""
    while imp.is_alive():
        n = c.health()["active_messages"]
        if before < n < before + total and (below is None or n < below):
            return n
    return None


def _in_first_half(d: Daemon, c, tag: str, text: str = TEXT) -> Importer:
    """An importer of one batch, returned once the daemon has stored some but less than half of it:
    slices remain for what the test does next (on a fast machine a slice stores hundreds of ~800-byte
    messages: a test that must act before the last slice gives them a longer ``text``)."""
    imp = Importer(d, [_batch(tag, text=text)])
    imp.start()
    assert _watch_partial(c, 0, BATCH, imp, below=BATCH // 2) is not None
    return imp


def test_requests_are_served_between_the_slices_of_an_import(tmp_path):
    with Daemon(tmp_path / "data") as d:
        d.start()
        with d.client() as c:
            c.write("other", "written before the import")
            imp = Importer(d, [_batch(f"b{k}") for k in range(3)])
            imp.start()
            partial = _watch_partial(c, 1, 3 * BATCH, imp)
            # writes are served between slices too, and each is acknowledged durable
            written = [c.write("other", f"written while importing {k}")["message_id"] for k in range(5)]
            imp.join(60)
            assert imp.error is None and not imp.is_alive(), imp.error
            assert partial is not None, "no request was served while the imports were stored"
            assert [r.get("imported") for r in imp.replies] == [BATCH] * 3, imp.replies
            assert c.health()["active_messages"] == 1 + 3 * BATCH + 5
            hist = c.history("imp-b1")
            assert len(hist) == BATCH and {m["content"].split()[1] for m in hist} == {str(i) for i in range(BATCH)}
        d.kill()  # nothing acknowledged is lost, nothing is stored twice
        d.start()
        with d.client() as c:
            assert c.health()["active_messages"] == 1 + 3 * BATCH + 5
            assert {m["message_id"] for m in c.history("other")} >= set(written)


def test_an_invalid_message_at_the_end_of_a_batch_stores_nothing(tmp_path):
    with Daemon(tmp_path / "data") as d:
        d.start()
        with d.client() as c:
            batch = _batch("bad")
            batch[-1] = {**batch[-1], "role": "robot"}
            rep = c.call("import_messages", {"messages": batch})
            assert rep["status"] == "ERROR" and rep["error"]["code"] == "VALIDATION_ERROR", rep
            assert f"messages[{BATCH - 1}].role" in rep["error"]["message"]
            assert c.health()["active_messages"] == 0
            # the same batch made valid is stored whole
            batch[-1]["role"] = "user"
            assert c.call("import_messages", {"messages": batch})["imported"] == BATCH


def test_a_rebuild_asked_during_an_import_starts_once_the_import_is_stored(tmp_path):
    with Daemon(tmp_path / "data") as d:
        d.start()
        with d.client() as c:
            imp = _in_first_half(d, c, "r", text=TEXT * 4)   # (~3 KB each: more slices)
            done = c.rebuild()  # answered REBUILDING at once, then followed with rebuild_status
            imp.join(60)
            assert imp.replies == [{"status": "OK", "imported": BATCH, "existing": 0}]
            assert done["status"] == "OK" and done["messages_indexed"] == BATCH, done
            assert c.health()["active_messages"] == BATCH
            assert "waits for 1 import(s) in progress" in d.stderr()


def test_a_clean_stop_finishes_the_import_in_progress_and_answers_it(tmp_path):
    with Daemon(tmp_path / "data") as d:
        d.start()
        with d.client() as c:
            imp = _in_first_half(d, c, "stop")
        assert d.terminate() == 0
        imp.join(60)
        assert imp.replies == [{"status": "OK", "imported": BATCH, "existing": 0}], (imp.replies, imp.error)
        d.start()
        with d.client() as c:
            assert c.health()["active_messages"] == BATCH


def test_a_retried_import_gets_the_first_ones_reply(tmp_path):
    """A client that timed out sends its import again with the same request id (Lazy Pirate): while
    the first is being stored the retry joins it, and after it is stored the retry is answered with
    its reply — the counts of what that import stored, not "imported 0, existing N" of a second one.
    Another request id with the same messages is a second import (nothing stored twice)."""
    batch, rid = _batch("retry"), str(ULID())
    with Daemon(tmp_path / "data") as d:
        d.start()
        with d.client(timeout_ms=60_000) as c:
            before = c.health()["active_messages"]
            first: list[dict[str, Any]] = []
            sender = threading.Thread(target=lambda: first.append(
                c.call("import_messages", {"messages": batch}, rid=rid, retries=0)), daemon=True)
            with d.client(timeout_ms=60_000) as watcher, d.client(timeout_ms=60_000) as retry:
                sender.start()
                while True:  # until the first is partly stored
                    n = watcher.health()["active_messages"]
                    assert n < before + BATCH, "the import ended before the retry could join it"
                    if n > before:
                        break
                joined = retry.call("import_messages", {"messages": batch}, rid=rid, retries=0)
                sender.join(60)
                again = retry.call("import_messages", {"messages": batch}, rid=rid, retries=0)
                other = retry.call("import_messages", {"messages": batch}, retries=0)
                after = watcher.health()["active_messages"]
    expected = {"status": "OK", "imported": BATCH, "existing": 0}
    assert first == [expected] and joined == expected and again == expected
    assert other == {"status": "OK", "imported": 0, "existing": BATCH}
    assert after == before + BATCH

