"""Every limit and vocabulary of the memory tools' contract, and the daemon's own bounds (the wire, the
clock, request-id retention, retry hints), in one place. Sizes are UTF-8 bytes unless named otherwise.
The history tools' limits live in ``protocol.history``."""

KiB = 1024
MiB = 1024 * 1024

SESSION_ID_MAX_BYTES = 256
CONTENT_MAX_BYTES = 1 * MiB
METADATA_JSON_MAX_BYTES = 512 * KiB  # not in the contract; bounds parsing work before any field check
TOOL_CALL_ID_MAX_BYTES = 256
TAGS_MAX = 32
TAG_MAX_BYTES = 128
SUMMARY_MAX_BYTES = 4096
RELATIONS_MAX = 32
SOURCE_IDS_MAX = 64
IMPORTANCE_MIN, IMPORTANCE_MAX, IMPORTANCE_DEFAULT = 0, 100, 50
ULID_LEN = 26

ROLES = ("user", "assistant", "system")
MEMORY_TIERS = ("short", "mid", "long", "discard")
MEMORY_TIER_DEFAULT = "short"
MEMORY_KINDS = ("conversation", "episode", "semantic", "procedure", "preference", "summary")
MEMORY_KIND_DEFAULT = "conversation"
RELATION_TYPES = ("depends_on", "derived_from", "supersedes", "related_to")

VIEWS = ("history", "content", "context", "sessions")
SESSION_ORDERS = ("asc", "desc")           # sessions view: by started_at, then session_id
SESSION_ORDER_DEFAULT = "asc"
TIME_MS_MAX = (1 << 48) - 1                # the millisecond range of a ULID
TIME_TEXT_MAX_BYTES = 64
VIEW_DEFAULT = "history"
READ_LIMIT_MIN, READ_LIMIT_MAX, READ_LIMIT_DEFAULT = 1, 1000, 100
CURSOR_MAX_BYTES = 1024
CONTENT_LIMIT_MIN, CONTENT_LIMIT_MAX, CONTENT_LIMIT_DEFAULT = 1, 65536, 4096
CONTEXT_BEFORE_MAX, CONTEXT_AFTER_MAX, CONTEXT_NEIGHBOURS_DEFAULT = 10, 10, 1
RELATION_DEPTH_MAX, RELATION_DEPTH_DEFAULT = 2, 1
RELATION_TYPES_JSON_MAX_BYTES = 4 * KiB
CONTEXT_MESSAGE_CAP = 50

QUERY_MIN_BYTES, QUERY_MAX_BYTES = 1, 4096
FILTERS_JSON_MAX_BYTES = 16 * KiB
CONTEXT_SIZE_MAX = 3
SEARCH_LIMIT_MIN, SEARCH_LIMIT_MAX, SEARCH_LIMIT_DEFAULT = 1, 100, 20

EXPECTED_REVISION_MIN = 1

# import_messages (the admin tool's and the ingester's batch write; the daemon stores it in slices)
IMPORT_BATCH_MAX = 1000
# What our own clients (the ingester, `convmem import`) put in one import_messages: the daemon
# decodes a request's frame in one step of its loop, every other client waiting (1,000 agent-history
# events: 1.3 MiB, 8 ms at p50 and up to 70 ms with a collection inside; 250: 0.33 MiB, 2 ms), while
# the work stored per batch is sliced anyway, so smaller batches cost one more round trip per 250
# events and nothing else (exactly-once is per message id, whatever the batching).
IMPORT_BATCH_PREFERRED = 250
IMPORT_BATCH_PREFERRED_BYTES = 1 * MiB
REVISION_MAX = 2**63 - 1

# "Responses are cut within a budget of about 8 MiB."
RESPONSE_BUDGET_BYTES = 8 * MiB

# The wire: a request frame can carry a 1 MiB content plus its metadata and JSON escaping.
MAX_REQUEST_BYTES = 4 * MiB
MAX_NESTING_DEPTH = 8
# Bounds msgpack enforces WHILE it unpacks a request (protocol/wire.py), so that a small frame cannot
# make the daemon build millions of objects: a frame of 4M one-byte empty maps was 615 MB and a 12-s
# stall. Containers (maps and arrays) are what a byte of frame inflates most (~100 B of Python each);
# strings and numbers cost about their size. The largest legitimate request is an import batch:
# IMPORT_BATCH_MAX messages, each at most ~105 containers (message, metadata, tags, relations and
# its RELATIONS_MAX objects, source ids, event, files and its 64 file objects), plus the sessions
# and checkpoints beside them; real batches hold 3-6 a message.
MAX_REQUEST_CONTAINERS = 128 * KiB
# One array: the longest legitimate one is a batch (IMPORT_BATCH_MAX messages or sessions); a
# checkpoint value is free-form within 16 KiB, so allow as many items as that many bytes could hold.
MAX_REQUEST_ARRAY_LEN = 16 * KiB
MAX_REQUEST_MAP_LEN = 8 * KiB            # a free-form 16-KiB checkpoint value: 2 bytes an entry at least
MAX_REQUEST_BIN_LEN = 16 * KiB           # no field takes bytes; only a checkpoint value could carry some

# How long a caller should wait before retrying a BUSY answer.
BUSY_RETRY_AFTER_MS = 250

# How far beyond the daemon's wall clock a stored time may lie and still move the id clock. Imported
# messages keep whatever times they carry, but one dated 9999 (or with an id of 7ZZZ...) must not
# stamp every later write with that year or run the ULID clock out of its 48 bits.
CLOCK_SKEW_MAX_MS = 24 * 3600 * 1000

# A retry with the same request_id within this many seconds is applied at most once (besides the
# count cap of the daemon's window). Older request ids are forgotten, at the latest by rebuild_index.
REQUEST_ID_RETENTION_S = 24 * 3600

# search_messages: the parts of a result's score (score_breakdown) and what matched_fields may name. The
# contract's three fields score the message itself; "context" is the share its session neighbours gave it
# (a message found only through them has matched_fields == ["context"]).
SEARCH_SCORE_PARTS = ("content", "summary", "tags", "context")
