"""The data directory's layout: the name of every file the daemon keeps there, and of every temp.

One module names them all (docs/format.md §1), so that the code that writes a file, the code that
sweeps its leftovers at start and the documentation cannot drift apart. Storaged code reads every
name from here. The names front-ends need too (``run/``, the socket, the pid file, ``store-id``,
``http-token``) are owned by ``protocol/config.py``, which front-ends import without importing
storaged; they are re-exported here unchanged.

A temp is always its target's name plus a suffix below, written, fsynced and renamed over the
target (``FileIO.write_file_atomic``, the snapshot, log creation, compaction). A crash can leave a
temp behind; ``leftovers`` lists the ones the store removes at open before reading anything.
"""
from __future__ import annotations

import glob
import os
import time

from protocol.config import CURVE_CLIENTS_DIR, DAEMON_LOG_NAME, HTTP_TOKEN_NAME, PID_NAME, RUN_DIR_NAME, SOCKET_NAME, STORE_ID_NAME

__all__ = [
    "LOG", "SNAPSHOT", "LOCK", "CURSOR_KEY", "STORE_ID", "HTTP_TOKEN", "DAEMON_LOG", "RUN_DIR", "SOCKET", "PID", "CURVE_CLIENTS",
    "SEGMENT_PREFIX", "SEGMENT_SUFFIX", "ROWS_PREFIX", "REBUILD_RESULT",
    "TMP_SUFFIX", "NEW_SUFFIX", "COMPACT_SUFFIX", "BACKGROUND_SUFFIX", "LOCK_SUFFIX", "DAMAGED_PREFIX",
    "damaged_copy_name", "leftovers",
]

LOG = "log"                 # the append-only log, the source of truth
SNAPSHOT = "snapshot"       # the state at one log position (an accelerator only)
LOCK = "LOCK"               # flock'ed while a daemon owns the directory
CURSOR_KEY = "cursor.key"   # the HMAC key of cursors and typed ids
STORE_ID = STORE_ID_NAME
HTTP_TOKEN = HTTP_TOKEN_NAME
DAEMON_LOG = DAEMON_LOG_NAME    # the text log of a daemon a front-end started
RUN_DIR = RUN_DIR_NAME      # run/: the ipc socket and the pid file
SOCKET = SOCKET_NAME
PID = PID_NAME
CURVE_CLIENTS = CURVE_CLIENTS_DIR  # curve/clients/*.key: the CURVE allow-list
# index.<16 hex digits>.seg: an immutable search-index segment (storaged/segment.py). Written under a
# fresh random name and fsynced before a snapshot names it; the snapshot's manifest says which ones
# are in use, and the others (a merge's inputs, a crash's orphans) are removed once a snapshot that
# does not name them is in place (Store.collect_segments).
SEGMENT_PREFIX = "index."
SEGMENT_SUFFIX = ".seg"
# rows.<16 hex digits>.seg: an immutable row segment (storaged/snapshot.py: a base or a delta of the
# snapshot's message rows), kept and removed by the same rules as the index's segments
ROWS_PREFIX = "rows."
# rebuild.tmp: what a rebuild's forked worker hands the daemon (the new log's figures, the text
# locations, the new index's dump), read once the worker has exited; never part of the store
REBUILD_RESULT = "rebuild.tmp"

TMP_SUFFIX = ".tmp"             # any atomic replacement's temp (snapshot.tmp, cursor.key.tmp, storaged.pid.tmp)
NEW_SUFFIX = ".new"             # log.new: a first start's log header before it becomes the log
COMPACT_SUFFIX = ".compact"     # log.compact: a rebuild's compacted log before it is renamed to log
BACKGROUND_SUFFIX = ".bg.tmp"   # snapshot.bg.tmp: a snapshot being written by a forked child
LOCK_SUFFIX = ".lock"           # the flock beside an ipc:// socket path (identity.EndpointClaim)
DAMAGED_PREFIX = LOG + ".damaged-"  # salvage's byte copy of a damaged log, kept


def damaged_copy_name(when: float) -> str:
    """The name of salvage's copy of the damaged log, by the local time ``when`` (epoch seconds)."""
    return DAMAGED_PREFIX + time.strftime("%Y%m%dT%H%M%S", time.localtime(when))


def leftovers(data_dir: str) -> list[str]:
    """The temps an interrupted write may have left in ``data_dir`` (those that exist, symlinks
    too): the store removes them at open. A temp is never read back, so removing one loses nothing.
    ``run/storaged.pid.tmp`` is not among them: it is replaced at the next pid write."""
    names = [LOG + COMPACT_SUFFIX, LOG + NEW_SUFFIX, SNAPSHOT + TMP_SUFFIX, SNAPSHOT + BACKGROUND_SUFFIX,
             CURSOR_KEY + TMP_SUFFIX, REBUILD_RESULT]
    paths = [os.path.join(data_dir, name) for name in names]
    paths += sorted(glob.glob(os.path.join(glob.escape(data_dir), DAMAGED_PREFIX + "*" + TMP_SUFFIX)))
    return [p for p in paths if os.path.lexists(p)]
