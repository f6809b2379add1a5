"""The search index's Python posting path through a real daemon: with CONVMEM_NO_NATIVE_POSTINGS=1 (or
where the C extension was not built) the daemon says so at start, indexes through SearchIndex._post_python,
and a restart with the native builder reads what it wrote and answers the same."""
from __future__ import annotations

import pytest

from storaged.search import NATIVE_POSTINGS_ENV
from tests.support.daemon_proc import Daemon

pytestmark = pytest.mark.timeout(120)

TEXTS = ["the tokyo launch moved to friday", "python3 build of iphone15 failed at step 7th",
         "本番データベースの移行を決定した", "don't retry the 1,000 requests", "naïve café order"]
QUERIES = ["tokyo launch", "python", "データベース移行", "1000 requests", "café", "iphone15"]


def _answers(c) -> dict[str, list[str]]:
    return {q: [h["message_id"] for h in c.call("search_messages", {"query": q, "limit": 100})["results"]]
            for q in QUERIES}


def test_the_python_path_indexes_and_the_native_one_reads_it(tmp_path, monkeypatch):
    data = tmp_path / "data"
    monkeypatch.setenv(NATIVE_POSTINGS_ENV, "1")
    with Daemon(data, extra_args=["--snapshot-every", "10"]) as d:
        d.start()
        with d.client() as c:
            for i in range(30):
                c.write(f"s{i % 3}", f"{TEXTS[i % len(TEXTS)]} (note {i})")
            python_answers = _answers(c)
        assert d.terminate() == 0
        assert "native posting builder (convmem_postings, storaged/postings.c) is off" in d.stderr()
        assert all(python_answers.values()), python_answers
        monkeypatch.delenv(NATIVE_POSTINGS_ENV)
        d.start()
        with d.client() as c:
            assert _answers(c) == python_answers
            c.write("s9", "python3 written by the native path")
            assert len(_answers(c)["python"]) == len(python_answers["python"]) + 1
        assert "native posting builder" not in d.stderr()
