"""What the daemon knows about transcript ingestion, and the conditions it derives from it.

Two kinds of knowledge, kept apart on purpose:

* Durable: each ingester's read position per file (a *checkpoint*), written to the log in the same
  append as the events it covers, so a checkpoint never runs ahead of (or behind) what is stored.
  Per-source totals (files, bytes read, events, secrets redacted, malformed lines) are kept as running
  sums over the checkpoints, so a status call costs O(sources), not O(files).
* Volatile: the latest heartbeat of each ingester instance (what it has discovered, how far it has
  got, its backlog) and a short history of them for a rate estimate. A restarted daemon knows no
  heartbeat until the next one arrives, and says so ("unknown") instead of guessing.

From both it derives the four conditions ``get_ingest_status`` reports — health, coverage, freshness,
readiness — each true/false/unknown with a stable reason code, and the coverage that the other
history tools attach to their answers. No file path and no raw error ever leaves this module.
"""
from __future__ import annotations

import time
from collections import deque
from typing import Any

from protocol.requests import IngestHeartbeat

from .packedmap import PackedMap, is_packed_map, unpack

# A heartbeat older than this many of its own intervals (and at least STALE_MIN_MS) is stale.
STALE_INTERVALS = 3
STALE_MIN_MS = 15_000
HISTORY_POINTS = 61          # heartbeats remembered per instance, for the rate estimate
RATE_MIN_POINTS = 3
RATE_MIN_SPAN_MS = 20_000
_TOTAL_KEYS = ("events", "redacted", "malformed", "bytes")
_SUM_KEYS = (*_TOTAL_KEYS, "files", "last_at")   # a source's running sums (totals), as kept and stored


def _num(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _checked_totals(totals: Any, sources: set[str]) -> dict[str, dict[str, Any]]:
    """A snapshot's per-source sums, as ``apply`` keeps them: a map of every source with checkpoints
    to its sums (non-negative integers) and, where one was seen, its harness."""
    if not isinstance(totals, dict) or not sources <= totals.keys():
        raise ValueError("the snapshot's ingest totals do not cover its checkpoints")
    out = {}
    for src, sums in totals.items():
        if not isinstance(src, str) or not isinstance(sums, dict) or any(
                _num(sums.get(k)) != sums.get(k) for k in _SUM_KEYS):
            raise ValueError("the snapshot's ingest totals are not sums")
        out[src] = {k: sums[k] for k in _SUM_KEYS}
        if isinstance(sums.get("harness"), str):
            out[src]["harness"] = sums["harness"]
    return out


class IngestState:
    def __init__(self, wall_ms=lambda: time.time_ns() // 1_000_000) -> None:
        self._wall_ms = wall_ms
        self.checkpoints = PackedMap()                     # (source, key) -> value, packed
        self.rec_sizes: dict[tuple[str, str], int] = {}   # log bytes of each checkpoint's newest record
        self.live_bytes = 0                                # their sum
        self.totals: dict[str, dict[str, int]] = {}       # source -> running sums over its checkpoints
        self.heartbeats: dict[str, dict[str, Any]] = {}   # instance -> newest heartbeat (+ received_at)
        self.history: dict[str, deque[tuple[int, int, int]]] = {}  # instance -> (ms, bytes_done, bytes_total)

    # ---------------------------------------------------------------- durable: checkpoints
    def apply(self, source: str, key: str, value: dict[str, Any] | bytes | None, size: int) -> None:
        """Set (source, key)'s checkpoint (None: forget it); ``value`` may be its msgpack bytes (a
        version 3 row segment's tail), kept as they are."""
        ck = (source, key)
        raw = None
        if value.__class__ is bytes:
            raw, value = value, unpack(value)
            if not isinstance(value, dict):
                raise ValueError(f"the checkpoint of {source}:{key} is not a map")
        old = self.checkpoints.pop(ck, None)
        totals = self.totals.setdefault(source, {k: 0 for k in _SUM_KEYS})
        if old is not None:
            for k in _TOTAL_KEYS:
                totals[k] -= _num(old.get(k))
            totals["files"] -= 1
        self.live_bytes -= self.rec_sizes.pop(ck, 0)
        if value is not None:
            if raw is None:
                self.checkpoints[ck] = value
            else:
                self.checkpoints.set_packed(ck, raw, value)
            self.rec_sizes[ck] = size
            self.live_bytes += size
            for k in _TOTAL_KEYS:
                totals[k] += _num(value.get(k))
            totals["files"] += 1
            totals["last_at"] = max(totals["last_at"], _num(value.get("at")))
            if isinstance(value.get("harness"), str):
                totals["harness"] = value["harness"]   # a source's harness, known without a heartbeat

    def stored_totals(self) -> dict[str, dict[str, Any]] | None:
        """The per-source sums as a snapshot's manifest keeps them (``load``'s ``totals``), or None when
        one does not fit msgpack's integers (a client may checkpoint any count: two of 2**64 - 1 sum past
        them); a start then sums the checkpoints itself, as before the manifest kept them."""
        for sums in self.totals.values():
            for k in _SUM_KEYS:
                if not 0 <= sums[k] < 1 << 63:
                    return None
        return self.totals

    def of_source(self, source: str) -> dict[str, dict[str, Any]]:
        return {key: self.checkpoints[(src, key)] for src, key in self.checkpoints if src == source}

    def dump(self, keys=None, packed: bool = False) -> list[list[Any]]:
        """[source, key, value, rec_size] of every checkpoint, or of the (source, key) pairs ``keys``
        (a forgotten one with value None, as ``load`` applies it): what a snapshot stores; ``packed``:
        each value as the msgpack bytes kept (a row segment's tail)."""
        cps = self.checkpoints
        get = cps.packed if packed else cps.get
        return [[src, key, get((src, key)), self.rec_sizes.get((src, key), 0)]
                for src, key in (cps if keys is None else sorted(keys))]

    def load(self, rows: list[list[Any]], totals: Any = None) -> None:
        """Apply a snapshot's checkpoints ([source, key, value, rec_size], in order) to an empty state.
        With ``totals`` (the snapshot's per-source sums over the same checkpoints) and every value as
        its msgpack bytes (a version 3 row segment's tail), the bytes are kept as they are, none
        unpacked: at five million events that was 91k unpackings, ~0.5 s of the start. ValueError on
        totals that are not per-source sums of integers."""
        if totals is None or any(value is not None and value.__class__ is not bytes for _, _, value, _ in rows):
            for src, key, value, size in rows:
                self.apply(src, key, value, size)
            return
        checkpoints, rec_sizes = self.checkpoints, self.rec_sizes
        for src, key, value, size in rows:
            ck = (src, key)
            if value is None:   # forgotten since an earlier segment's
                checkpoints.pop_packed(ck)
                rec_sizes.pop(ck, None)
            elif is_packed_map(value):
                checkpoints.set_packed(ck, value)
                rec_sizes[ck] = size
            else:
                raise ValueError(f"the checkpoint of {src}:{key} is not a map")
        self.live_bytes = sum(rec_sizes.values())
        self.totals = _checked_totals(totals, {src for src, _ in checkpoints})

    # ---------------------------------------------------------------- volatile: heartbeats
    def heartbeat(self, req: IngestHeartbeat) -> None:
        now = self._wall_ms()
        hb = {"instance": req.instance, "started_at": req.started_at, "interval_ms": req.interval_ms,
              "sources": list(req.sources), "final": req.final, "received_at": now}
        self.heartbeats[hb["instance"]] = hb
        done = sum(s["bytes_completed"] for s in hb["sources"])
        total = sum(s["bytes_total"] for s in hb["sources"])
        hist = self.history.setdefault(hb["instance"], deque(maxlen=HISTORY_POINTS))
        hist.append((now, done, total))
        # one ingester at a time is the normal case; forget instances that went quiet long ago
        for inst in [i for i, h in self.heartbeats.items() if now - h["received_at"] > 24 * 3600 * 1000]:
            self.heartbeats.pop(inst, None)
            self.history.pop(inst, None)

    def _latest(self) -> dict[str, Any] | None:
        if not self.heartbeats:
            return None
        return max(self.heartbeats.values(), key=lambda h: h["received_at"])

    @staticmethod
    def _stale(hb: dict[str, Any], now: int) -> bool:
        return now - hb["received_at"] > max(STALE_MIN_MS, STALE_INTERVALS * hb["interval_ms"])

    # ---------------------------------------------------------------- derived
    def coverage(self) -> tuple[str, str, int]:
        """(state true|false|unknown, reason, observed_at ms) of historical coverage: what the newest
        heartbeat said of the files it had discovered, however old it is — a finished one-off import
        stays complete; how current that is, is freshness's business, not coverage's."""
        now = self._wall_ms()
        hb = self._latest()
        if hb is None:
            if not self.checkpoints:
                # nothing was ever ingested: the store holds exactly what was written to it
                return "true", "no_ingest_sources", now
            return "unknown", "no_heartbeat_since_daemon_start", now
        srcs = hb["sources"]
        if not all(s["discovery_complete"] for s in srcs):
            return "false", "discovery_in_progress", now
        if any(s["bytes_completed"] < s["bytes_total"] or s["files_completed"] < s["files_total"] for s in srcs):
            return "false", "backfill_in_progress" if not hb["final"] else "backfill_stopped", now
        if any(s["errors"] for s in srcs):
            return "false", "files_unreadable", now
        return "true", "caught_up", now

    def conditions(self, store_error: str, rebuilding: bool, loading: bool = False) -> list[dict[str, Any]]:
        now = self._wall_ms()
        hb = self._latest()
        # an ingester that said it stopped is not a dead one; one that went quiet without saying so is
        stopped = hb is not None and hb["final"]
        stale = hb is not None and not stopped and self._stale(hb, now)
        out = []

        def cond(kind: str, state: str, reason: str) -> None:
            out.append({"condition_type": kind, "state": state, "reason": reason, "observed_at_unix_ms": now})

        if store_error:
            cond("health", "false", "store_degraded")
        elif hb is None:
            cond("health", "true" if not self.checkpoints else "unknown",
                 "no_ingest_sources" if not self.checkpoints else "no_heartbeat_since_daemon_start")
        elif stale:
            cond("health", "false", "ingester_heartbeat_stale")
        elif any(s["errors"] for s in hb["sources"]):
            cond("health", "false", "ingester_reported_errors")
        else:
            cond("health", "true", "ingester_stopped" if stopped else "ok")
        state, reason, _ = self.coverage()
        cond("coverage", state, reason)
        if hb is None:
            if self.checkpoints:
                cond("freshness", "unknown", "no_heartbeat_since_daemon_start")
            else:
                cond("freshness", "true", "no_ingest_sources")
        elif stopped:
            cond("freshness", "unknown", "no_ingester_running")
        elif stale:
            cond("freshness", "false", "ingester_heartbeat_stale")
        elif any(s["bytes_completed"] < s["bytes_total"] for s in hb["sources"]):
            cond("freshness", "false", "ingest_backlog")
        else:
            cond("freshness", "true", "live")
        if loading:
            cond("readiness", "false", "read_model_refresh")
        elif store_error:
            cond("readiness", "false", "store_degraded")
        elif rebuilding:
            cond("readiness", "true", "rebuild_running_reads_served")
        else:
            cond("readiness", "true", "ready")
        return out

    def status(self, store_error: str, rebuilding: bool) -> dict[str, Any]:
        """The data of get_ingest_status: conditions, the newest heartbeat, per-source progress, rate/ETA."""
        now = self._wall_ms()
        hb = self._latest()
        current = None
        if hb is not None:
            srcs = hb["sources"]
            current = {
                "heartbeat_observed_at_unix_ms": hb["received_at"],
                "instance_started_at_unix_ms": hb["started_at"],
                "interval_ms": hb["interval_ms"],
                "queue_depth": sum(s["queue_depth"] for s in srcs),
                "files_active": sum(s["files_active"] for s in srcs),
                "files_watched": sum(s["files_watched"] for s in srcs),
                "progress": {
                    "discovery_complete": all(s["discovery_complete"] for s in srcs),
                    "files_total": sum(s["files_total"] for s in srcs),
                    "files_completed": sum(s["files_completed"] for s in srcs),
                    "bytes_total": sum(s["bytes_total"] for s in srcs),
                    "bytes_completed": sum(s["bytes_completed"] for s in srcs),
                    "backlog_bytes": sum(max(0, s["bytes_total"] - s["bytes_completed"]) for s in srcs),
                },
            }
        live = {s["source"]: s for s in hb["sources"]} if hb is not None else {}
        sources = []
        for name in sorted(set(self.totals) | set(live)):
            t = self.totals.get(name, {})
            s = live.get(name)
            sources.append({
                "source": name,
                "harness": s["harness"] if s else t.get("harness"),
                "files_checkpointed": t.get("files", 0),
                "bytes_ingested": t.get("bytes", 0),
                "events_ingested": t.get("events", 0),
                "secrets_redacted": t.get("redacted", 0),
                "malformed_records": t.get("malformed", 0),
                "last_durable_progress_unix_ms": t.get("last_at") or None,
                "files_total": s["files_total"] if s else None,
                "files_completed": s["files_completed"] if s else None,
                "bytes_total": s["bytes_total"] if s else None,
                "backlog_bytes": max(0, s["bytes_total"] - s["bytes_completed"]) if s else None,
                "discovery_complete": s["discovery_complete"] if s else None,
                "errors": s["errors"] if s else None,
            })
        conditions = self.conditions(store_error, rebuilding)
        alerts = [{"code": c["reason"], "observed_at_unix_ms": now} for c in conditions
                  if c["state"] == "false" and c["condition_type"] in ("health", "readiness")]
        if any(t.get("malformed") for t in self.totals.values()):
            alerts.append({"code": "malformed_records_skipped", "observed_at_unix_ms": now})
        data: dict[str, Any] = {
            "observed_at_unix_ms": now,
            "conditions": conditions,
            "alerts": alerts,
            "current": current,
            "sources": sources,
            "secrets_redacted": sum(t.get("redacted", 0) for t in self.totals.values()),
        }
        rate = self._rate(hb)
        if rate is not None:
            bps, span_s = rate
            data["rate"] = {"bytes_per_second": round(bps, 1), "sample_seconds": span_s}
            backlog = current["progress"]["backlog_bytes"] if current else 0
            if backlog > 0 and bps > 0:
                data["eta"] = {"scope": "backlog", "low_seconds": int(backlog / (bps * 1.5)),
                               "high_seconds": int(backlog / (bps * 0.5)) + 1}
        return data

    def _rate(self, hb: dict[str, Any] | None) -> tuple[float, int] | None:
        """Bytes/s over this instance's recent heartbeats, once there are enough of them to mean
        something (same instance, a long enough span, progress made); else None."""
        if hb is None or self._stale(hb, self._wall_ms()):
            return None
        hist = self.history.get(hb["instance"])
        if not hist or len(hist) < RATE_MIN_POINTS:
            return None
        (t0, d0, _), (t1, d1, _) = hist[0], hist[-1]
        if t1 - t0 < RATE_MIN_SPAN_MS or d1 <= d0:
            return None
        return (d1 - d0) * 1000.0 / (t1 - t0), int((t1 - t0) / 1000)
