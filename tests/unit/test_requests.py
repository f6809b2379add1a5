"""The validated requests (protocol/requests.py): one frozen, slotted dataclass per op.

Every op of the wire's op table has a request class and a validator that builds it; a request
cannot be changed once built; and the mapping of contract names to field names holds both ways:
the arguments ``to_args`` writes for a request validate to that same request, for every op.
Pure: no processes, no files.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from protocol import limits as L
from protocol import requests as R
from protocol import wire
from storaged.model import Message

pytestmark = pytest.mark.timeout(60)

ULID_A = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
ULID_B = "01ARZ3NDEKTSV4RRFFQ69G5FAW"
FULL_METADATA = {"tool_call_id": "call-1", "tags": ["a", "b"], "memory_tier": "long", "memory_kind": "semantic",
                 "importance": 77, "summary": "a summary",
                 "relations": [{"type": "derived_from", "message_id": ULID_B}], "source_message_ids": [ULID_B]}
EVENT = {"type": "tool_call", "tool_name": "Edit", "is_error": False, "exit_code": 0, "model": "m1",
         "files": [{"path": "/r/a.py", "root": "/r", "tail": "a.py", "project": "/r/.git", "op": "edit"},
                   {"path": "/x/b.py", "root": None, "tail": None, "project": None, "op": "read"}]}
HEARTBEAT_SOURCE = {"source": "claude", "harness": "claude-code", "discovery_complete": True, "files_total": 3,
                    "files_completed": 1, "bytes_total": 100, "bytes_completed": 9, "files_watched": 2,
                    "files_active": 1, "errors": 0, "queue_depth": 4}

# Raw arguments for every op (and every read view), each giving as many fields as the op takes.
SAMPLES: list[tuple[str, dict]] = [
    ("write_message", {"session_id": "s", "role": "user", "content": "hello",
                       "metadata_json": json.dumps(FULL_METADATA)}),
    ("write_message", {"session_id": "s", "role": "assistant", "content": "defaults"}),
    ("update_message", {"message_id": ULID_A.lower(), "content": "new", "expected_revision": 3,
                        "metadata_json": '{"memory_tier": "mid", "source_message_ids": [], "summary": ""}'}),
    ("update_message", {"message_id": ULID_A, "metadata_json": "{}"}),
    ("delete_message", {"message_id": ULID_A, "session_id": "s"}),
    ("read_messages", {"session_id": "s", "limit": 5, "cursor": "abc"}),
    ("read_messages", {"view": "sessions", "since": 1000, "until": "1970-01-01T00:00:02Z", "order": "desc"}),
    ("read_messages", {"view": "content", "message_id": ULID_A, "content_offset": 3, "content_limit": 10,
                       "expected_revision": 2}),
    ("read_messages", {"view": "context", "message_id": ULID_A, "before": 0, "after": 4, "relation_depth": 2,
                       "relation_types_json": '["supersedes", "derived_from"]'}),
    ("read_messages", {"view": "context", "message_id": ULID_A, "relation_types_json": "[]"}),
    ("search_messages", {"query": "q", "session_id": "s", "min_importance": 10, "context_size": 2, "limit": 7,
                         "filters_json": json.dumps({"kinds": ["semantic", "preference"], "tiers": [],
                                                     "tags": ["x"]})}),
    ("search_messages", {"query": "q"}),
    ("rebuild_index", {}),
    ("get_system_health", {}),
    ("ping", {}),
    ("rebuild_status", {"rebuild_id": ULID_A.lower()}),
    ("import_messages", {
        "messages": [{"message_id": ULID_A, "session_id": "s", "timestamp": 5, "role": "assistant", "content": "c",
                      "revision": 2, "updated_at": 9, "metadata": FULL_METADATA, "event": EVENT},
                     {"message_id": ULID_B, "session_id": "s", "timestamp": 6, "role": "user", "content": "d"}],
        "sessions": [{"session_id": "s", "harness": "codex", "title": "t", "mode": "chat"}],
        "checkpoints": [{"source": "codex", "key": "/f.jsonl", "value": {"offset": 9}},
                        {"source": "codex", "key": "/g.jsonl", "value": None}]}),
    ("export_messages", {"after_seq": 10, "limit": 5, "session_id": "s"}),
    ("ingest_heartbeat", {"instance": "i1", "started_at": 5, "interval_ms": 1000, "sources": [HEARTBEAT_SOURCE],
                          "final": True}),
    ("ingest_checkpoints", {"source": "claude"}),
    ("search_sessions", {"query": " nginx ", "within_id": "session:abcd1234", "event_types": ["reasoning", "system"],
                         "harness": "codex", "source": "codex", "n_hits": 3}),
    ("open", {"id": "turn:abcd1234", "limit": 4}),
    ("open", {"cursor": "c0ffee"}),
    ("list_sessions", {"start_datetime": "2026-01-01T00:00:00Z", "end_datetime": "2026-02-01T00:00:00+09:00",
                       "limit": 3, "cursor": "abc", "mode": "chat", "harness": "codex", "source": "codex",
                       "sort": "asc"}),
    ("file_attention", {"path": "src/app.py", "scope": "all", "granularity": "events",
                        "start_datetime": "2026-01-01T00:00:00.123Z", "end_datetime": "2026-01-02T00:00:00Z",
                        "tool": "Edit", "harness": "codex", "source": "codex", "mutations_only": True, "limit": 9}),
    ("get_ingest_status", {}),
]


def _ids(samples):
    return [f"{op}-{i}" for i, (op, _) in enumerate(samples)]


def test_every_op_has_a_request_class_and_a_validator():
    assert set(R.REQUEST_TYPES) == set(wire.OPS) == set(wire._ALL_VALIDATORS)
    assert {op for op, _ in SAMPLES} == set(wire.OPS)   # and every op is exercised below
    for op, raw in SAMPLES:
        assert isinstance(wire.validate_args(op, raw), R.REQUEST_TYPES[op]), op


def test_every_read_view_has_its_class():
    assert set(R.READ_VIEWS) == set(L.VIEWS)
    for view, cls in R.READ_VIEWS.items():
        assert issubclass(cls, R.ReadMessages) and cls.VIEW == view


def _request_classes() -> list[type]:
    return [c for c in vars(R).values()
            if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__module__ == R.__name__]


@pytest.mark.parametrize("cls", _request_classes(), ids=lambda c: c.__name__)
def test_request_classes_are_frozen_and_slotted(cls):
    params = cls.__dataclass_params__
    assert params.frozen, cls
    assert "__slots__" in vars(cls), cls


@pytest.mark.parametrize("op,raw", SAMPLES, ids=_ids(SAMPLES))
def test_requests_cannot_be_changed(op, raw):
    req = wire.validate_args(op, raw)
    assert not hasattr(req, "__dict__")
    for f in dataclasses.fields(req):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(req, f.name, None)
    with pytest.raises((dataclasses.FrozenInstanceError, AttributeError, TypeError)):
        req.extra = 1


@pytest.mark.parametrize("op,raw", SAMPLES, ids=_ids(SAMPLES))
def test_contract_names_round_trip(op, raw):
    """Arguments → request → the arguments a client would send → the same request."""
    req = wire.validate_args(op, raw)
    args = req.to_args()
    assert wire.validate_args(op, args) == req
    assert wire.validate_args(op, wire.decode(wire.encode(args))) == req   # as they travel, too


def test_metadata_names_are_the_message_fields():
    names = [f.name for f in dataclasses.fields(R.Metadata)]
    assert names == list(R.METADATA_NAMES.values()) == [f.name for f in dataclasses.fields(R.MetadataPatch)]
    assert set(names) <= set(Message.__slots__)
    assert {"etype", "tool"} <= set(Message.__slots__)


def test_contract_names_map_to_fields():
    w = wire.validate_args("write_message", SAMPLES[0][1])
    md = w.metadata
    assert (md.tier, md.kind, md.source_ids, md.relations) == ("long", "semantic", (ULID_B,), (("derived_from", ULID_B),))
    assert json.loads(w.to_args()["metadata_json"]) == FULL_METADATA
    imp = wire.validate_args("import_messages", SAMPLES[16][1])
    ev = imp.messages[0].event
    assert (ev.etype, ev.tool, ev.files[1]) == ("tool_call", "Edit", ("/x/b.py", None, None, None, "read"))
    assert imp.messages[1].event is None and imp.messages[1].metadata == R.Metadata()
    assert imp.sessions[0] == R.SessionMeta("s", {"harness": "codex", "title": "t", "mode": "chat"})
    assert imp.checkpoints[1] == R.Checkpoint("codex", "/g.jsonl", None)


def test_metadata_patch_applies_only_what_it_gives():
    base = R.Metadata(tool_call_id="t", tags=("a",), importance=10)
    patch = wire.validate_args("update_message", SAMPLES[2][1]).metadata
    assert patch == R.MetadataPatch(tier="mid", source_ids=(), summary=None)
    assert patch.apply(base) == R.Metadata(tool_call_id="t", tags=("a",), tier="mid", importance=10)
    assert R.MetadataPatch().apply(base) is base


def test_launch_context_is_set_from_the_request_context():
    raw = {"path": "src/app.py"}
    assert wire.validate_args("file_attention", raw).launch == R.Launch()
    ctx = {"cwd": "/w", "project": "/w/.git", "tail": "src/app.py", "tail_is_absolute": False,
           "stripped_root": "/w", "path_project": "/w/.git"}
    assert wire.validate_args("file_attention", raw, ctx).launch == R.Launch(**ctx)


def test_paused_at_names_the_innermost_step_and_line():
    # the daemon's slow-step note and bench.loop_probe tell a long step by the line that ends it
    from protocol.requests import paused_at

    def inner():
        yield
        yield

    def outer():
        yield
        got = yield from inner()
        return got

    steps = outer()
    next(steps)
    assert paused_at(steps).startswith("outer:")
    next(steps)
    where = paused_at(steps)
    assert where.startswith("inner:") and int(where.split(":")[1]) == inner.__code__.co_firstlineno + 1
    for _ in steps:
        pass
    assert paused_at(steps) == "its end"
