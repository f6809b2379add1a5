"""bench.index_speed times the tokenizer and SearchIndex.add on a bench.scale corpus (a smoke test on a
corpus of a few hundred events)."""
from __future__ import annotations

import pytest

from bench import index_speed, scale_corpus

pytestmark = pytest.mark.unit


def test_it_times_tokenizing_and_indexing_the_corpus_s_first_events(tmp_path):
    d = str(tmp_path)
    scale_corpus.generate(d, 300, 10, 5)
    res = index_speed.main(["--dir", d, "--events", "200", "--repeat", "2"])
    assert res["events"] == 200 and res["text_mib"] > 0
    for step in ("index_terms", "add"):
        assert 0 < res[step]["min_us"] <= res[step]["median_us"]
    assert res["add"]["min_us"] > res["index_terms"]["min_us"]   # add tokenizes every field, then posts
