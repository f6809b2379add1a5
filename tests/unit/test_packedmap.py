"""PackedMap: values kept as msgpack bytes, hot fields beside them."""
import pytest

from storaged.packedmap import PackedMap


def test_values_round_trip_with_the_logs_types_and_come_back_as_fresh_copies():
    m = PackedMap()
    value = {"title": "日本語のタイトル", b"pos": 1, 7: [1.5, None, True], "calls": {"a": "Bash"}, "raw": b"\x00\xff"}
    m[("codex", "/a.jsonl")] = value
    got = m[("codex", "/a.jsonl")]
    assert got == value and got is not value
    got["title"] = "changed"
    got["calls"]["b"] = "Read"
    assert m[("codex", "/a.jsonl")] == value   # a changed copy changes nothing stored


def test_mapping_behaviour_matches_a_dict():
    m, d = PackedMap(), {}
    for i in range(50):
        m[f"k{i}"] = d[f"k{i}"] = {"n": i}
    del m["k3"], d["k3"]
    assert m.pop("k4") == d.pop("k4") == {"n": 4}
    assert m.pop("missing", None) is None
    assert m.get("k3") is None and m.get("k5") == {"n": 5}
    assert len(m) == len(d) == 48 and list(m) == list(d) and dict(m.items()) == d
    assert m == d and "k5" in m and "k3" not in m
    with pytest.raises(KeyError):
        m["k3"]


def test_hot_fields_are_answered_without_unpacking_and_follow_every_change():
    m = PackedMap(("harness", "source", "mode"))
    m["s1"] = {"harness": "codex", "source": "codex", "title": "x"}
    m["s2"] = {"harness": "codex", "source": "codex", "title": "y"}
    assert m.hot("s1") == ("codex", "codex", None) and m.hot("s1") is m.hot("s2")   # shared
    assert m.field("s1", "harness") == "codex" and m.field("s1", "mode") is None
    assert m.field("nobody", "harness") is None and m.hot("nobody") == (None, None, None)
    m["s1"] = {**m["s1"], "mode": "chat"}
    assert m.field("s1", "mode") == "chat"
    m["s3"] = ["not", "a", "map"]                 # whatever a record held: no hot fields, no error
    assert m.hot("s3") == (None, None, None)
    del m["s1"]
    assert m.field("s1", "harness") is None


def test_only_keeps_the_named_entries_and_their_hot_fields():
    m = PackedMap(("harness",))
    for i in range(5):
        m[i] = {"harness": f"h{i % 2}", "i": i}
    sub = m.only([1, 3, 99])
    assert dict(sub.items()) == {1: {"harness": "h1", "i": 1}, 3: {"harness": "h1", "i": 3}}
    assert sub.field(3, "harness") == "h1" and sub.field(0, "harness") is None
    sub[0] = {"harness": "h0"}
    assert m[0] == {"harness": "h0", "i": 0}      # the copy is its own map
    by_dict = m.only({4: 10, 2: 20})              # a rebuild names them by a dict (sid -> record size)
    assert list(by_dict.items()) == [(2, {"harness": "h0", "i": 2}), (4, {"harness": "h0", "i": 4})]
    assert by_dict.field(4, "harness") == "h0" and by_dict.field(1, "harness") is None and len(by_dict) == 2


def test_set_packed_takes_bytes_as_they_are():
    m = PackedMap(("harness",))
    raw = PackedMap()
    raw["k"] = {"harness": "gemini"}
    m.set_packed("k", raw.packed("k"))
    assert m["k"] == {"harness": "gemini"} and m.field("k", "harness") == "gemini"
    assert m.packed("k") == raw.packed("k")
