"""Validation of every tool's arguments at the edges of every limit of the contract.

Every refusal must be a VALIDATION_ERROR whose message names the field and never contains the value
that was sent (a secret pasted into the wrong field must not come back in an error or a log).
"""
from __future__ import annotations

import json

import pytest

from protocol import limits as L
from protocol.errors import VALIDATION_ERROR, ProtocolError
from protocol.requests import (REQUEST_TYPES, DeleteMessage, Metadata, MetadataPatch, ReadContent, ReadContext,
                               ReadHistory, SearchMessages, UpdateMessage)
from protocol.validation import validate

pytestmark = pytest.mark.timeout(60)

ULID_A = "01ARZ3NDEKTSV4RRFFQ69G5FAV"
ULID_B = "01ARZ3NDEKTSV4RRFFQ69G5FAW"
SECRET = "SeCrEt-7f3a9c"  # a distinctive marker: it must never appear in an error message


def ok(op, args):
    return validate(op, args)


def bad(op, args, field, secret: str | None = SECRET):
    """Assert VALIDATION_ERROR naming ``field`` and not echoing ``secret`` (or any long string arg)."""
    with pytest.raises(ProtocolError) as info:
        validate(op, args)
    err = info.value
    assert err.code == VALIDATION_ERROR
    assert field in err.message, f"{field!r} not named in {err.message!r}"
    if secret:
        assert secret not in err.message, err.message
    for value in _strings(args):
        if len(value) >= 16:
            assert value not in err.message, f"input echoed in {err.message!r}"
    assert err.reply() == {"status": "ERROR", "error": {"code": VALIDATION_ERROR, "message": err.message}}
    return err.message


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _strings(v)


def W(**kw):
    args = {"session_id": "s", "role": "user", "content": "c"}
    args.update(kw)
    return args


def MD(**fields):
    return W(metadata_json=json.dumps(fields))


def mb(n: int, ch: str = "é") -> str:
    """Exactly ``n`` UTF-8 bytes, mostly multibyte characters (so bytes != characters)."""
    w = len(ch.encode())
    return ch * (n // w) + "a" * (n % w)


# ---------------------------------------------------------------------------------------- write
class TestWriteMessage:
    def test_minimal_defaults(self):
        out = ok("write_message", W())
        assert out.metadata == Metadata(
            tool_call_id=None, tags=(), tier="short", kind="conversation", importance=50, summary=None,
            relations=(), source_ids=(),
        )

    @pytest.mark.parametrize("ch", ["é", "日", "😀"])
    def test_session_id_bytes_not_chars(self, ch):
        sid = mb(256, ch)
        assert len(sid) < 256  # multibyte: fewer characters than bytes
        assert ok("write_message", W(session_id=sid)).session_id == sid
        bad("write_message", W(session_id=sid + "x"), "session_id")
        # as many characters as the limit allows bytes, but too many bytes
        bad("write_message", W(session_id=ch * 256), "session_id")

    def test_session_id_257_and_empty(self):
        bad("write_message", W(session_id=mb(257)), "session_id")
        bad("write_message", W(session_id=""), "session_id")
        bad("write_message", W(session_id=SECRET + "x" * 300), "session_id")

    def test_content_one_mib(self):
        assert len(ok("write_message", W(content="a" * L.MiB)).content) == L.MiB
        emoji = "😀" * (L.MiB // 4)
        assert ok("write_message", W(content=emoji)).content == emoji
        bad("write_message", W(content=SECRET + "a" * (L.MiB + 1 - len(SECRET))), "content")
        bad("write_message", W(content=emoji + "a"), "content")
        bad("write_message", W(content=""), "content")

    def test_content_lone_surrogate(self):
        bad("write_message", W(content=SECRET + "\ud800"), "content")
        bad("write_message", MD(summary=SECRET + "\udfff"), "summary")

    @pytest.mark.parametrize("role", ["user", "assistant", "system"])
    def test_roles(self, role):
        assert ok("write_message", W(role=role)).role == role

    def test_bad_role(self):
        bad("write_message", W(role=SECRET), "role")
        bad("write_message", W(role="User"), "role")

    @pytest.mark.parametrize("missing", ["session_id", "role", "content"])
    def test_required(self, missing):
        args = W()
        del args[missing]
        bad("write_message", args, missing)
        args[missing] = None  # JSON null counts as absent
        bad("write_message", args, missing)

    @pytest.mark.parametrize("field,value", [
        ("session_id", 12345), ("session_id", [SECRET]), ("role", 1), ("content", {"x": SECRET}),
        ("content", 3.5), ("content", True), ("metadata_json", {"tags": [SECRET]}), ("metadata_json", 7),
    ])
    def test_wrong_json_types(self, field, value):
        bad("write_message", W(**{field: value}), field)

    def test_unknown_parameter(self):
        bad("write_message", W(sesion_id=SECRET), "sesion_id")
        msg = bad("write_message", W(**{SECRET + " !": "x"}), "unknown parameter")
        assert "unprintable" in msg

    @pytest.mark.parametrize("args", [[], "x", 5, [["session_id", "s"]]])
    def test_arguments_not_an_object(self, args):
        bad("write_message", args, "arguments")


class TestMetadata:
    def test_tool_call_id(self):
        t = mb(256, "日")
        assert ok("write_message", MD(tool_call_id=t)).metadata.tool_call_id == t
        bad("write_message", MD(tool_call_id=t + "a"), "metadata_json.tool_call_id")
        bad("write_message", MD(tool_call_id=5), "metadata_json.tool_call_id")

    def test_tags(self):
        tags = [f"t{i}" for i in range(32)]
        assert ok("write_message", MD(tags=tags)).metadata.tags == tuple(tags)
        bad("write_message", MD(tags=tags + [SECRET]), "metadata_json.tags")
        assert ok("write_message", MD(tags=[mb(128)])).metadata.tags == (mb(128),)
        bad("write_message", MD(tags=[SECRET + mb(129 - len(SECRET))]), "metadata_json.tags")
        bad("write_message", MD(tags=[""]), "metadata_json.tags")
        bad("write_message", MD(tags=SECRET), "metadata_json.tags")
        bad("write_message", MD(tags=[1]), "metadata_json.tags")
        assert ok("write_message", MD(tags=[])).metadata.tags == ()

    def test_summary(self):
        s = mb(4096, "😀")
        assert ok("write_message", MD(summary=s)).metadata.summary == s
        bad("write_message", MD(summary=SECRET + mb(4097 - len(SECRET))), "metadata_json.summary")
        assert ok("write_message", MD(summary="")).metadata.summary is None  # empty = unset
        patch = ok("update_message", {"message_id": ULID_A, "metadata_json": '{"summary": ""}'}).metadata
        assert patch == MetadataPatch(summary=None)
        bad("write_message", MD(summary=[SECRET]), "metadata_json.summary")

    def test_relations(self):
        rel = [{"type": "derived_from", "message_id": ULID_A}] * 32
        out = ok("write_message", MD(relations=rel)).metadata.relations
        assert out == (("derived_from", ULID_A),) * 32
        bad("write_message", MD(relations=rel + rel[:1]), "metadata_json.relations")
        bad("write_message", MD(relations=[{"type": SECRET, "message_id": ULID_A}]), "metadata_json.relations")
        bad("write_message", MD(relations=[{"type": "depends_on", "message_id": SECRET}]), "metadata_json.relations")
        bad("write_message", MD(relations=[{"type": "depends_on"}]), "metadata_json.relations")
        bad("write_message", MD(relations=[{"type": "depends_on", "message_id": ULID_A, "x": SECRET}]),
            "metadata_json.relations")
        bad("write_message", MD(relations=[[SECRET, ULID_A]]), "metadata_json.relations")
        bad("write_message", MD(relations={"type": SECRET}), "metadata_json.relations")
        for t in L.RELATION_TYPES:
            out = ok("write_message", MD(relations=[{"type": t, "message_id": ULID_B.lower()}]))
            assert out.metadata.relations == ((t, ULID_B),)

    def test_source_message_ids(self):
        ids = [ULID_A] * 64
        assert ok("write_message", MD(source_message_ids=ids)).metadata.source_ids == tuple(ids)
        bad("write_message", MD(source_message_ids=ids + [ULID_B]), "metadata_json.source_message_ids")
        for non_ulid in [SECRET, ULID_A[:-1], ULID_A + "0", "8" + ULID_A[1:], ULID_A[:-1] + "U", 12]:
            bad("write_message", MD(source_message_ids=[non_ulid]), "metadata_json.source_message_ids")
        assert ok("write_message", MD(source_message_ids=[ULID_A.lower()])).metadata.source_ids == (ULID_A,)

    @pytest.mark.parametrize("value,expected", [(0, 0), (100, 100), (50.0, 50), (7, 7)])
    def test_importance_ok(self, value, expected):
        out = ok("write_message", W(metadata_json=json.dumps({"importance": value}))).metadata.importance
        assert out == expected and type(out) is int

    @pytest.mark.parametrize("text", ['-1', '101', 'true', 'false', '50.5', '"50"', 'null', '1e400', 'NaN', '[50]'])
    def test_importance_bad(self, text):
        bad("write_message", W(metadata_json='{"importance": ' + text + '}'), "metadata_json.importance")

    def test_enums(self):
        for tier in L.MEMORY_TIERS:
            assert ok("write_message", MD(memory_tier=tier)).metadata.tier == tier
        for kind in L.MEMORY_KINDS:
            assert ok("write_message", MD(memory_kind=kind)).metadata.kind == kind
        bad("write_message", MD(memory_tier=SECRET), "metadata_json.memory_tier")
        bad("write_message", MD(memory_kind=SECRET), "metadata_json.memory_kind")
        bad("write_message", MD(memory_kind="Semantic"), "metadata_json.memory_kind")

    @pytest.mark.parametrize("text", [SECRET, "{", '{"tags": [}', "", "{'tags': []}", '{"a":1} x'])
    def test_not_json(self, text):
        bad("write_message", W(metadata_json=text), "metadata_json")

    @pytest.mark.parametrize("text", ['["' + SECRET + '"]', '"' + SECRET + '"', "42", "null", "true"])
    def test_not_an_object(self, text):
        bad("write_message", W(metadata_json=text), "metadata_json")

    def test_unknown_field(self):
        msg = bad("write_message", MD(colour=SECRET), "metadata_json")
        assert "colour" in msg  # the field is named, its value is not
        msg = bad("write_message", MD(**{SECRET + "-x": 1}), "metadata_json")
        assert "unprintable" in msg

    def test_deep_nesting_is_refused_not_crashing(self):
        bad("write_message", W(metadata_json="[" * 100000 + "]" * 100000), "metadata_json")

    def test_oversized_metadata_json(self):
        text = '{"summary": "x"' + " " * L.METADATA_JSON_MAX_BYTES + "}"
        bad("write_message", W(metadata_json=text), "metadata_json")


# ---------------------------------------------------------------------------------------- update
class TestUpdateMessage:
    def test_partial_metadata(self):
        out = ok("update_message", {"message_id": ULID_A.lower(), "metadata_json": '{"importance": 9}'})
        assert out == UpdateMessage(message_id=ULID_A, content=None, metadata=MetadataPatch(importance=9),
                                    expected_revision=None)

    def test_needs_content_or_metadata(self):
        bad("update_message", {"message_id": ULID_A}, "content")
        bad("update_message", {"message_id": ULID_A, "expected_revision": 1}, "metadata_json")

    def test_content_limits(self):
        assert ok("update_message", {"message_id": ULID_A, "content": "a" * L.MiB}).content
        bad("update_message", {"message_id": ULID_A, "content": mb(L.MiB + 1, "日")}, "content")
        bad("update_message", {"message_id": ULID_A, "content": ""}, "content")

    @pytest.mark.parametrize("mid", [SECRET, ULID_A[:25], ULID_A + "A", "8" + ULID_A[1:], ULID_A[:-1] + "I",
                                     ULID_A[:-1] + "L", ULID_A[:-1] + "O", ULID_A[:-1] + "U", 5, [ULID_A]])
    def test_bad_message_id(self, mid):
        bad("update_message", {"message_id": mid, "content": "x"}, "message_id")

    def test_missing_message_id(self):
        bad("update_message", {"content": "x"}, "message_id")

    @pytest.mark.parametrize("rev", [0, -1, True, "1", 1.5, 2**63])
    def test_bad_expected_revision(self, rev):
        bad("update_message", {"message_id": ULID_A, "content": "x", "expected_revision": rev}, "expected_revision")

    @pytest.mark.parametrize("rev,expected", [(1, 1), (2.0, 2), (2**63 - 1, 2**63 - 1)])
    def test_expected_revision_ok(self, rev, expected):
        out = ok("update_message", {"message_id": ULID_A, "content": "x", "expected_revision": rev})
        assert out.expected_revision == expected

    def test_metadata_rules_apply(self):
        bad("update_message", {"message_id": ULID_A, "metadata_json": '{"importance": 101}'},
            "metadata_json.importance")
        bad("update_message", {"message_id": ULID_A, "metadata_json": '{"bogus": 1}'}, "metadata_json")
        bad("update_message", {"message_id": ULID_A, "metadata_json": "[]"}, "metadata_json")

    def test_unknown_parameter(self):
        bad("update_message", {"message_id": ULID_A, "content": "x", "session_id": SECRET}, "session_id")


# ---------------------------------------------------------------------------------------- read
HIST = {"view": "history", "session_id": "s"}
CONTENT = {"view": "content", "message_id": ULID_A}
CONTEXT = {"view": "context", "message_id": ULID_A}
SESSIONS = {"view": "sessions"}


class TestReadMessages:
    def test_default_view_is_history(self):
        out = ok("read_messages", {"session_id": "s"})
        assert out == ReadHistory(limit=100, cursor=None, session_id="s")

    def test_bad_view(self):
        bad("read_messages", {"view": SECRET}, "view")
        bad("read_messages", {"view": 1}, "view")

    @pytest.mark.parametrize("base", [HIST, CONTENT, CONTEXT, SESSIONS])
    def test_limit_edges(self, base):
        for good in (1, 1000):
            assert ok("read_messages", dict(base, limit=good)).limit == good
        for wrong in (0, 1001, -1, "10", True, 10.5):
            bad("read_messages", dict(base, limit=wrong), "limit")

    @pytest.mark.parametrize("base", [HIST, SESSIONS])
    def test_cursor_edges(self, base):
        assert ok("read_messages", dict(base, cursor="x" * 1024)).cursor == "x" * 1024
        bad("read_messages", dict(base, cursor=SECRET + "x" * 1024), "cursor")
        bad("read_messages", dict(base, cursor=""), "cursor")
        bad("read_messages", dict(base, cursor=5), "cursor")

    def test_history_session_id(self):
        bad("read_messages", {"view": "history"}, "session_id")
        assert ok("read_messages", dict(HIST, session_id=mb(256, "日")))
        bad("read_messages", dict(HIST, session_id=mb(257, "日")), "session_id")
        bad("read_messages", dict(HIST, session_id=""), "session_id")

    def test_sessions_checks_but_ignores_session_id(self):
        # the contract: the sessions view "does not use" session_id — accepted, still checked
        assert not hasattr(validate("read_messages", dict(SESSIONS, session_id="s1")), "session_id")
        bad("read_messages", dict(SESSIONS, session_id=mb(257, "日")), "session_id")

    @pytest.mark.parametrize("base", [CONTENT, CONTEXT])
    def test_common_cursor_is_accepted_by_every_view(self, base):
        assert validate("read_messages", dict(base, cursor="abc")).cursor == "abc"
        bad("read_messages", dict(base, cursor=""), "cursor")

    @pytest.mark.parametrize("base,param,value", [
        (HIST, "message_id", ULID_A), (HIST, "content_offset", 0), (SESSIONS, "before", 1),
        (CONTENT, "session_id", "s"), (CONTEXT, "content_limit", 5), (CONTENT, "relation_depth", 1),
    ])
    def test_parameters_of_other_views(self, base, param, value):
        bad("read_messages", dict(base, **{param: value}), param)

    def test_unknown_parameter(self):
        bad("read_messages", dict(HIST, colour=SECRET), "colour")

    @pytest.mark.parametrize("base", [CONTENT, CONTEXT])
    def test_message_id_required_and_checked(self, base):
        bad("read_messages", {"view": base["view"]}, "message_id")
        bad("read_messages", dict(base, message_id=SECRET), "message_id")
        assert ok("read_messages", dict(base, message_id=ULID_A.lower())).message_id == ULID_A

    def test_content_defaults(self):
        assert ok("read_messages", CONTENT) == ReadContent(
            limit=100, cursor=None, message_id=ULID_A, content_offset=0, content_limit=4096, expected_revision=None)

    def test_content_offset_and_limit(self):
        for off in (0, L.MiB):
            assert ok("read_messages", dict(CONTENT, content_offset=off)).content_offset == off
        for off in (-1, L.MiB + 1, "0", True):
            bad("read_messages", dict(CONTENT, content_offset=off), "content_offset")
        for lim in (1, 65536):
            assert ok("read_messages", dict(CONTENT, content_limit=lim)).content_limit == lim
        for lim in (0, 65537, -5, "1", False):
            bad("read_messages", dict(CONTENT, content_limit=lim), "content_limit")
        bad("read_messages", dict(CONTENT, expected_revision=0), "expected_revision")
        assert ok("read_messages", dict(CONTENT, expected_revision=3)).expected_revision == 3

    def test_context_defaults(self):
        assert ok("read_messages", CONTEXT) == ReadContext(
            limit=100, cursor=None, message_id=ULID_A, before=1, after=1, relation_depth=1,
            relation_types=L.RELATION_TYPES)

    @pytest.mark.parametrize("param,lo,hi", [("before", 0, 10), ("after", 0, 10), ("relation_depth", 0, 2)])
    def test_context_ranges(self, param, lo, hi):
        for good in (lo, hi):
            assert getattr(ok("read_messages", dict(CONTEXT, **{param: good})), param) == good
        for wrong in (lo - 1, hi + 1, "1", [1], True):
            bad("read_messages", dict(CONTEXT, **{param: wrong}), param)

    def test_relation_types_json(self):
        out = ok("read_messages", dict(CONTEXT, relation_types_json='["derived_from","supersedes"]'))
        assert out.relation_types == ("derived_from", "supersedes")
        assert ok("read_messages", dict(CONTEXT, relation_types_json="[]")).relation_types == ()
        for text in [SECRET, '["' + SECRET + '"]', '{"a": 1}', "[1]", '"derived_from"', "["]:
            bad("read_messages", dict(CONTEXT, relation_types_json=text), "relation_types_json")
        bad("read_messages", dict(CONTEXT, relation_types_json=["derived_from"]), "relation_types_json")


# ---------------------------------------------------------------------------------------- search
class TestSearchMessages:
    def test_defaults(self):
        assert ok("search_messages", {"query": "q"}) == SearchMessages(
            query="q", session_id=None, kinds=None, tiers=None, tags=(), min_importance=0, context_size=0, limit=20)

    def test_query(self):
        assert ok("search_messages", {"query": mb(4096, "日")}).query == mb(4096, "日")
        bad("search_messages", {"query": SECRET + mb(4097 - len(SECRET), "日")}, "query")
        bad("search_messages", {"query": ""}, "query")
        bad("search_messages", {}, "query")
        bad("search_messages", {"query": 5}, "query")

    @pytest.mark.parametrize("param,lo,hi", [("min_importance", 0, 100), ("context_size", 0, 3), ("limit", 1, 100)])
    def test_ranges(self, param, lo, hi):
        for good in (lo, hi):
            assert getattr(ok("search_messages", {"query": "q", param: good}), param) == good
        for wrong in (lo - 1, hi + 1, "5", True, 1.5):
            bad("search_messages", {"query": "q", param: wrong}, param)

    def test_session_id(self):
        assert ok("search_messages", {"query": "q", "session_id": mb(256)}).session_id == mb(256)
        bad("search_messages", {"query": "q", "session_id": mb(257)}, "session_id")
        bad("search_messages", {"query": "q", "session_id": ""}, "session_id")

    def test_filters_json(self):
        out = ok("search_messages", {"query": "q", "filters_json": json.dumps(
            {"kinds": ["semantic", "preference"], "tiers": ["mid"], "tags": ["a", "b"]})})
        assert (out.kinds, out.tiers, out.tags) == (frozenset({"semantic", "preference"}), frozenset({"mid"}),
                                                    ("a", "b"))
        for text, field in [
            (SECRET, "filters_json"), ('["' + SECRET + '"]', "filters_json"), ("null", "filters_json"),
            (json.dumps({"colour": SECRET}), "filters_json"), (json.dumps({"kinds": SECRET}), "filters_json.kinds"),
            (json.dumps({"kinds": [SECRET]}), "filters_json.kinds"), (json.dumps({"tiers": [SECRET]}), "filters_json.tiers"),
            (json.dumps({"tags": [""]}), "filters_json.tags"), (json.dumps({"tags": ["t"] * 33}), "filters_json.tags"),
            (json.dumps({"tags": [SECRET + "x" * 130]}), "filters_json.tags"),
        ]:
            bad("search_messages", {"query": "q", "filters_json": text}, field)
        bad("search_messages", {"query": "q", "filters_json": {"kinds": []}}, "filters_json")

    def test_unknown_parameter(self):
        bad("search_messages", {"query": "q", "view": SECRET}, "view")


# ---------------------------------------------------------------------------------------- delete / no-arg tools
class TestDeleteAndNoArgTools:
    def test_delete(self):
        assert ok("delete_message", {"message_id": ULID_A.lower()}) == DeleteMessage(ULID_A, session_id=None)
        assert ok("delete_message", {"message_id": ULID_A, "session_id": mb(256)}).session_id == mb(256)
        bad("delete_message", {"message_id": ULID_A, "session_id": mb(257)}, "session_id")
        bad("delete_message", {"message_id": ULID_A, "session_id": ""}, "session_id")
        bad("delete_message", {"message_id": SECRET}, "message_id")
        bad("delete_message", {}, "message_id")
        bad("delete_message", {"message_id": ULID_A, "content": SECRET}, "content")

    @pytest.mark.parametrize("tool", ["rebuild_index", "get_system_health"])
    def test_no_arguments(self, tool):
        assert ok(tool, {}) == REQUEST_TYPES[tool]() and ok(tool, None) == REQUEST_TYPES[tool]()
        bad(tool, {"force": SECRET}, "force")
        bad(tool, [SECRET], "arguments")


def test_a_ulid_is_ascii_before_it_is_upper_cased():
    """str.upper() turns "ß" into "SS" and "ſ" into "S": a 25-character id ending in "ß", or one with "ſ",
    would become a valid ULID that the caller never sent."""
    assert ok("delete_message", {"message_id": ULID_A.lower()}).message_id == ULID_A
    bad("delete_message", {"message_id": ULID_A[:24] + "ß"}, "message_id", secret=None)
    bad("delete_message", {"message_id": ULID_A[:10] + "ſ" + ULID_A[11:]}, "message_id", secret=None)
