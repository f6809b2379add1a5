"""The record module: every builder round-trips through the log's framing, and every wrong shape of
every kind is refused by ``records.check`` (which ``log.scan`` runs on each record).

The wrong shapes are generated, not listed: for each valid record of each kind (every form ever
written) the test tries every other arity, and every position — of the record, of its message, of
the lists and maps inside — with a value of each type from a palette; a substitute is expected to
pass only where docs/format.md §3 allows its type (and, for the enum-like strings, its value).
"""
from __future__ import annotations

import copy

import msgpack
import pytest

from protocol import limits as L
from protocol.history import EVENT_TYPES
from storaged import log as logfile
from storaged import records

N = type(None)
SALT = b"r" * 16
RID = "01JCZ3Q7W0000000000000000A"
MID = "01JCZ3Q7W0000000000000000B"

# docs/format.md §3.1: the allowed types of each message field
MESSAGE_TYPES = [(str,), (str,), (int,), (int,), (str,), (str,), (int,), (int,), (str, N), (list,), (str,), (str,),
                 (int,), (str, N), (list,), (list,), (str,), (str, N), (list, N)]
ENUMS = {records.ROLE: L.ROLES, records.TIER: L.MEMORY_TIERS, records.KIND: L.MEMORY_KINDS,
         records.ETYPE: EVENT_TYPES}
PALETTE = [None, 7, True, "no-such-value", b"bytes", 1.5, [], {}]


def message(n: int = records.RECORD_FIELDS, ext: bool = True) -> list:
    f = [MID, "session", 3, 1_700_000_000_000, "assistant", "text 日本語", 2, 1_700_000_000_001, "call-1",
         ["a", "b"], "short", "episode", 4, "a summary", [["related_to", MID]], [MID], "tool_call", "Bash",
         [False, 2, "model-x", [["/p/a.py", "/p", "a.py", "p", "read"], ["/q", None, None, None, "write"]]]
         if ext else None]
    return f[:n]


VALID = {
    "w19": records.write(RID, message()),
    "w19-no-ext": records.write(None, message(ext=False)),
    "w16": records.write(RID, message(records.RECORD_FIELDS_0_1)),
    "u19": records.update(RID, 9, message()),
    "u16": records.update(None, 9, message(records.RECORD_FIELDS_0_1)),
    "d5": records.delete(RID, 10, MID, 1_700_000_000_002),
    "d4": records.delete(RID, 10, MID, 0)[:4],  # before 0.3
    "c": records.checkpoint(11, MID, 1_700_000_000_003, [[RID, "w", MID, 1, 5], [RID, "d", MID, 0]]),
    "c-empty": records.checkpoint(0, None, 0, []),
    "s": records.session("session", {"title": "a title", "cwd": "/p"}),
    "k": records.ingest("claude", "/p/t.jsonl", {"events": 3, "bytes": 100, "at": "x", "nested": {"a": [1]}}),
    "k-nil": records.ingest("claude", "/p/t.jsonl", None),
}

# the allowed types of each element of a record, by tag (the message and the lists inside it apart)
MSG = "message"
RECORD_TYPES = {
    "w": [(str, N), MSG],
    "u": [(str, N), (int,), MSG],
    "d": [(str, N), (int,), (str,), (int,)],
    "c": [(int,), (str, N), (int,), (list,)],
    "s": [(N,), (str,), (dict,)],
    "k": [(N,), (str,), (str,), (dict, N)],
}
ARITIES = {"w": {3}, "u": {4}, "d": {4, 5}, "c": {5}, "s": {4}, "k": {5}}
RID_ENTRY_TYPES = [(str,), (str,), (str,), (int,), (int,)]
FILE_TYPES = [(str,), (str, N), (str, N), (str, N), (str,)]
EXT_TYPES = [(bool, N), (int, N), (str, N), (list,)]


def allowed(types: tuple, value, enum=None, nonempty=False) -> bool:
    """Whether ``value`` may stand where ``types`` are allowed (bool is not an int here)."""
    if type(value) not in types:
        return False
    if enum is not None and value not in enum:
        return False
    return not (nonempty and value == [])


def substitutions(rec: list):
    """(description, mutated record, expected to pass) for every position and palette value."""
    tag = rec[0]
    spec = RECORD_TYPES[tag]
    for i, types in enumerate(spec, 1):
        if i >= len(rec):
            break
        if types == MSG:
            yield from _message_substitutions(rec, i)
            continue
        for v in PALETTE:
            yield f"{tag}[{i}]={v!r}", _with(rec, (i,), v), allowed(types, v)
    if tag == "c":
        for j, entry in enumerate(rec[4]):
            for k, types in enumerate(RID_ENTRY_TYPES[:len(entry)]):
                for v in PALETTE:
                    yield f"c rid[{j}][{k}]={v!r}", _with(rec, (4, j, k), v), allowed(types, v)
            yield f"c rid[{j}] too long", _with(rec, (4, j), entry + [1, 2]), False
            yield f"c rid[{j}] too short", _with(rec, (4, j), entry[:3]), False
            yield f"c rid[{j}] not a list", _with(rec, (4, j), "x"), False
    if tag in "sk" and isinstance(rec[-1], dict):
        at = 3 if tag == "s" else 4
        # a session's fields are validated names; a checkpoint value is any map the wire carried
        yield f"{tag} map key not str", _with(rec, (at,), {1: "x"}), tag == "k"
        if tag == "s":
            for v in PALETTE:
                yield f"s map value {v!r}", _with(rec, (at,), {"title": v}), allowed((str, N), v)


def _message_substitutions(rec: list, at: int):
    fields = rec[at]
    for i, types in enumerate(MESSAGE_TYPES[:len(fields)]):
        for v in PALETTE:
            ok = allowed(types, v, ENUMS.get(i), nonempty=(i == records.EXT))
            yield f"{rec[0]} message[{i}]={v!r}", _with(rec, (at, i), v), ok
    for n in range(len(fields) + 3):
        if n not in (records.RECORD_FIELDS, records.RECORD_FIELDS_0_1):
            yield f"{rec[0]} message of {n} fields", _with(rec, (at,), (fields + [None] * 3)[:n]), False
    yield f"{rec[0]} message not a list", _with(rec, (at,), "x"), False
    for i in (records.TAGS_FIELD, records.SOURCE_IDS):
        for v in PALETTE:
            yield f"{rec[0]} message[{i}][0]={v!r}", _with(rec, (at, i), [v]), allowed((str,), v)
    for j, types in enumerate([(str,), (str,)]):
        for v in PALETTE:
            yield f"relation[{j}]={v!r}", _with(rec, (at, records.RELATIONS, 0, j), v), allowed(types, v)
    yield "relation too long", _with(rec, (at, records.RELATIONS, 0), ["a", "b", "c"]), False
    yield "relation not a list", _with(rec, (at, records.RELATIONS, 0), "a"), False
    if len(fields) == records.RECORD_FIELDS and fields[records.EXT] is not None:
        for j, types in enumerate(EXT_TYPES):
            for v in PALETTE:
                yield f"ext[{j}]={v!r}", _with(rec, (at, records.EXT, j), v), allowed(types, v)
        yield "ext too long", _with(rec, (at, records.EXT), fields[records.EXT] + [None]), False
        for k, types in enumerate(FILE_TYPES):
            for v in PALETTE:
                yield f"file[{k}]={v!r}", _with(rec, (at, records.EXT, 3, 0, k), v), allowed(types, v)
        yield "file too short", _with(rec, (at, records.EXT, 3, 0), ["/p"]), False
        yield "file not a list", _with(rec, (at, records.EXT, 3, 0), "/p"), False


def _with(rec: list, path: tuple, value) -> list:
    out = copy.deepcopy(rec)
    target = out
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = value
    return out


def roundtrip(rec: list) -> list:
    buf = logfile.make_header(SALT) + logfile.encode_record(SALT, rec)
    result = logfile.ScanResult()
    out = list(logfile.scan(buf, SALT, logfile.HEADER_SIZE, result))
    assert not result.torn_tail and not result.damage_ranges
    [(offset, size, decoded)] = out
    assert offset == logfile.HEADER_SIZE and size == len(buf) - logfile.HEADER_SIZE
    return decoded


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_builder_round_trips_and_checks(name):
    rec = VALID[name]
    assert records.check(rec) is None
    assert roundtrip(rec) == rec


def test_builders_write_todays_bytes():
    """Not a format change: the builders make exactly the lists the store has always packed."""
    f = message()
    assert records.write(RID, f) == ["w", RID, f]
    assert records.update(RID, 4, f) == ["u", RID, 4, f]
    assert records.delete(RID, 4, MID, 5) == ["d", RID, 4, MID, 5]
    assert records.checkpoint(1, MID, 2, []) == ["c", 1, MID, 2, []]
    assert records.session("s", {"title": "t"}) == ["s", None, "s", {"title": "t"}]
    assert records.ingest("src", "key", None) == ["k", None, "src", "key", None]
    assert records.MESSAGE_FIELDS[records.CONTENT] == "content" and records.CONTENT == 5
    assert records.SEQ == 2 and records.MESSAGE_ID == 0
    assert len(records.MESSAGE_FIELDS) == records.RECORD_FIELDS == 19
    assert records.MESSAGE_FIELDS_0_1 == records.MESSAGE_FIELDS[:16] and records.RECORD_FIELDS_0_1 == 16


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_wrong_type_in_every_position_is_refused(name):
    tried = refused = 0
    for what, rec, ok in substitutions(VALID[name]):
        reason = records.check(rec)
        assert (reason is None) == ok, (what, reason)
        if not ok:
            assert isinstance(reason, str) and reason, what
            refused += 1
        tried += 1
    assert refused > 10 and tried > refused


@pytest.mark.parametrize("name", sorted(VALID))
def test_every_wrong_arity_is_refused(name):
    rec = VALID[name]
    padded = rec + [None] * 4
    for n in range(0, len(padded) + 1):
        if n not in ARITIES[rec[0]]:
            assert records.check(padded[:n]) is not None, n
    assert records.check(padded[:len(rec)]) is None


@pytest.mark.parametrize("bad", [None, "w", 3, {}, [], [None], [3, None, []], [b"w", None, message()],
                                 ["x"], ["W", None, message()], ["wu", None, message()], ["", 1]])
def test_non_records_and_unknown_tags_are_refused(bad):
    reason = records.check(bad)
    assert isinstance(reason, str) and reason


def test_an_unknown_tag_names_itself():
    assert "'z'" in records.check(["z", None, "something a newer daemon wrote"])


def test_a_refused_record_is_not_yielded_by_the_scan():
    """Checksum fine, shape wrong: the scan treats it like a bad checksum (torn tail here, at the end)."""
    good = records.write(None, message())
    for bad in (["w", None, message()[:-1]], ["z"], ["d", None, "1", MID]):
        buf = logfile.make_header(SALT) + logfile.encode_record(SALT, good) + logfile.encode_record(SALT, bad)
        result = logfile.ScanResult()
        out = list(logfile.scan(buf, SALT, logfile.HEADER_SIZE, result))
        assert [r for _, _, r in out] == [good] and result.torn_tail and not result.damage_ranges
        # before a valid record it is damage, and the resync finds the record after it
        buf += logfile.encode_record(SALT, good)
        result = logfile.ScanResult()
        out = list(logfile.scan(buf, SALT, logfile.HEADER_SIZE, result, resync=True))
        assert [r for _, _, r in out] == [good, good] and not result.torn_tail
        [(a, b)] = result.damage_ranges
        assert logfile.next_valid(buf, SALT, a, len(buf)) == b


def test_payloads_that_are_not_msgpack_arrays_are_refused_by_the_scan():
    for payload in (msgpack.packb({"w": 1}), msgpack.packb("w"), b"\xc1", msgpack.packb([])):
        buf = logfile.make_header(SALT) + logfile.frame(SALT, payload)
        result = logfile.ScanResult()
        assert list(logfile.scan(buf, SALT, logfile.HEADER_SIZE, result)) == [] and result.torn_tail


def test_what_the_wire_accepts_in_a_checkpoint_is_never_damage_later(tmp_path):
    """A checkpoint value may have keys of any msgpack type (the validator takes any object): the
    record a daemon acknowledged must read back at the next start, last in the log or not."""
    from protocol.validation import validate
    from storaged.store import Store

    assert records.check(records.ingest("src", "k", {b"pos": 1, 7: "x"})) is None
    d = str(tmp_path)
    store = Store.open(d)
    req = validate("import_messages", {"messages": [], "checkpoints": [
        {"source": "claude", "key": "/a.jsonl", "value": {b"pos": 1, "events": 2}}]})
    assert store.import_messages(req)["status"] == "OK"
    size = store.log_size()
    store.close()
    store = Store.open(d)
    assert (store.log_size(), store.recovered_tail, store.corrupt) == (size, False, None)
    assert store.ingest.checkpoints[("claude", "/a.jsonl")] == {b"pos": 1, "events": 2}
    store.close()


@pytest.mark.parametrize("field", ["seq", "timestamp", "updated_at", "revision", "importance"])
def test_a_number_beyond_64_bits_is_refused(field):
    """The message table holds these fields as 64-bit ints (storaged/columns.py): a record beyond that is
    damage the scan reports, never a replay that dies packing it."""
    at = records.MESSAGE_FIELDS.index(field)
    for value, ok in (((1 << 63) - 1, True), (1 << 63, False), ((1 << 64) - 1, False), (-(1 << 63), field != "seq"),
                      (-1, field != "seq")):
        f = message()
        f[at] = value
        reason = records.check(records.write(None, f))
        assert (reason is None) == ok, (value, reason)
        if not ok:
            assert "64 bits" in reason
