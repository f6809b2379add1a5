"""The store written by the release before issue 15's format change, opened in-process.

The same fixture and expectations as ``tests/process/test_release_store.py`` (``fixtures/make_store.py``
says how they were made), read through ``Store.open`` and ``Store.by_id`` instead of a daemon, so that a
migration that loses or alters something fails here in a second, with the message that differs.
"""
from __future__ import annotations

import pytest

from storaged.store import Store
from tests.support.release_store import EXPECTED, STORE, copy_store, without_event

pytestmark = pytest.mark.unit


@pytest.fixture
def opened(tmp_path):
    s = Store.open(str(copy_store(STORE, tmp_path / "d")))
    yield s
    s.close()


def test_every_message_as_the_old_daemon_returned_it(opened):
    for m in EXPECTED["messages"]:
        assert opened.by_id[m["message_id"]].to_dict() == without_event(m)
    assert len(opened.by_id) == len(EXPECTED["messages"])
    assert not set(EXPECTED["deleted"]) & set(opened.by_id)


def test_counters_and_checkpoints_survive(opened):
    health = opened.health()
    assert (health["status"], health["last_error"]) == ("OK", "")
    assert {k: health[k] for k in EXPECTED["health"]} == EXPECTED["health"]
    for source, reply in EXPECTED["ingest_checkpoints"].items():
        assert opened.ingest.of_source(source) == reply["checkpoints"]
