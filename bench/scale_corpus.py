"""The scale benchmark's corpus: agent history as the real ingester turns it into import batches.

Generation has two steps, both reused rather than re-implemented:

1. ``ScaleCorpus`` (a ``bench.history_bench.Corpus``) writes seeded Codex rollout files: sessions of
   40-60 events in turns of a prompt, reasoning, tool calls with outputs (log-normal sizes with a tail
   to 64 KB) and an answer. Its mix is heavier than history_bench's: tool outputs have a median of
   ``OUTPUT_MEDIAN`` bytes (≈1 KB of text per event on average, issue 15's corpus) and 20% of the
   sessions are Japanese (their prompts and answers).
2. The real ``ingest.service.Ingester`` reads those files and builds its ``import_messages`` batches
   (message ids derived from the transcript, event facts, session metadata, checkpoints, secrets
   redacted, batch size by its own rule). Its daemon here is ``_Recorder``, which appends every batch
   to a msgpack stream instead of sending it. The benchmark later sends the same batches to a real
   daemon (the ingest phase) and the same events to SQLite, so both sides get identical events.

The rollout files are deleted once read. The recorder also counts term document frequencies
(``storaged.tokenize.index_terms``) on a sample of the events, which is where the query mix's
"common" (most frequent terms) and "rare" (sampled df 1, i.e. df ≲ the sampling stride) queries
come from; prompt-word, error-line and Japanese queries are the ones ``Corpus`` keeps as it writes.

Layout under ``DIR/corpus``: ``batches.msgpack`` (the corpus), ``extra.msgpack`` (more events of another
seed, for the write tail before a SIGKILL and the burst that triggers a background snapshot; sent
with fresh message ids each time), ``queries.json`` ([kind, query] pairs) and ``meta.json`` (what was
generated, with which parameters: a later run reuses the corpus only if they match).
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import shutil
import time
from collections import Counter
from typing import Any, Iterator

import msgpack

from bench.history_bench import T0_MS, Corpus
from ingest.service import Ingester, Totals
from storaged.tokenize import index_terms

VERSION = 1                     # of this generator: a corpus made by another version is made again
SESSION_SLOT_MS = 600_000       # Corpus.session spaces sessions this far apart per ordinal
DF_SAMPLE = 50_000              # events tokenised for the document frequencies
QUERY_SHARE = {"prompt": 0.3, "error": 0.25, "japanese": 0.1, "common": 0.15, "rare": 0.2}


class ScaleCorpus(Corpus):
    """history_bench's corpus with issue 15's mix: ~1 KB/event, a fifth of the sessions Japanese."""

    JA_SHARE = 0.2
    OUTPUT_MEDIAN = 1500

    def generate(self) -> None:
        """Sessions until n_target events; several sessions share a 10-minute slot when there are more
        sessions than slots between 2025 and two days ago (the ingester drops events from the future)."""
        slots = max(1, (time.time_ns() // 1_000_000 - T0_MS - 2 * 86_400_000) // SESSION_SLOT_MS)
        per_slot = -(-(self.n_target // 40 + 1) // slots)
        i = 0
        while self.events < self.n_target:
            self.session(i // per_slot)
            i += 1


class _Recorder:
    """The daemon the ingester talks to while the corpus is made: import batches go to a file."""

    def __init__(self, out: Any, sample_every: int) -> None:
        self.out = out
        self.sample_every = sample_every
        self.messages = 0
        self.batches = 0
        self.text_bytes = 0
        self.non_ascii = 0
        self.types: Counter = Counter()
        self.df: Counter = Counter()
        self.words: list[str] = []
        self.rng = random.Random(11)

    async def __call__(self, op: str, args: dict[str, Any], retry: Any = None) -> dict[str, Any]:
        if op == "ingest_checkpoints":
            return {"status": "OK", "checkpoints": {}}
        if op != "import_messages":
            return {"status": "OK"}
        self.out.write(msgpack.packb(args, use_bin_type=True))
        self.batches += 1
        for m in args["messages"]:
            text = m["content"]
            self.text_bytes += len(text.encode())
            self.non_ascii += not text.isascii()
            self.types[m["event"]["type"]] += 1
            if self.messages % self.sample_every == 0:
                self.df.update(set(index_terms(text)))
                if self.rng.random() < 0.1:
                    self.words.extend(re.findall(r"\b[a-z]{5,12}\b", text.lower())[:20])
            self.messages += 1
        return {"status": "OK", "imported": len(args["messages"]), "existing": 0}


def _make(root: str, out_path: str, n: int, seed: int, sample_every: int) -> tuple[ScaleCorpus, _Recorder]:
    """Rollouts of n events under root, read by the real ingester into out_path; root is removed."""
    corpus = ScaleCorpus(root, n, seed)
    corpus.generate()
    with open(out_path + ".tmp", "wb") as out:
        rec = _Recorder(out, sample_every)
        ing = Ingester(rec, ("codex",), env={"CODEX_HOME": root}, home=root,
                       paths=[os.path.join(root, "sessions")])
        totals = Totals()
        asyncio.run(ing.run(watch=False, totals=totals))
    os.replace(out_path + ".tmp", out_path)
    shutil.rmtree(root, ignore_errors=True)
    if totals.malformed or totals.unreadable:
        raise RuntimeError(f"the ingester could not read the generated rollouts: {totals.report()}")
    return corpus, rec


def _queries(corpus: ScaleCorpus, rec: _Recorder, nq: int, rare_df: int) -> list[tuple[str, str]]:
    """[kind, query] pairs: QUERY_SHARE of nq from each pool (fewer if a pool is smaller), shuffled."""
    common = [t for t, _ in rec.df.most_common(200) if t.isascii() and t.isalpha() and len(t) > 2][:60]
    rare = [w for w in dict.fromkeys(rec.words)
            if len(t := index_terms(w)) == 1 and rec.df[t[0]] <= rare_df]
    qr = random.Random(5)
    pools = {
        "prompt": corpus.q_prompt, "error": corpus.q_error, "japanese": corpus.q_ja,
        "common": [" ".join(qr.sample(common, qr.randint(1, 3))) for _ in range(200)] if len(common) >= 3 else [],
        "rare": [" ".join(qr.sample(rare, qr.randint(1, 2))) for _ in range(200)] if len(rare) >= 2 else [],
    }
    out = []
    for kind, pool in pools.items():
        out += [(kind, q) for q in qr.sample(pool, min(len(pool), max(1, round(nq * QUERY_SHARE[kind]))))]
    qr.shuffle(out)
    return out


def corpus_dir(d: str) -> str:
    return os.path.join(d, "corpus")


def generate(d: str, n: int, n_extra: int, nq: int, seed: int = 42) -> dict[str, Any]:
    """Make (or reuse, if made with the same parameters) the corpus under d; returns its meta."""
    cd = corpus_dir(d)
    want = {"version": VERSION, "events": n, "extra_events": n_extra, "queries_asked": nq, "seed": seed,
            "output_median": ScaleCorpus.OUTPUT_MEDIAN, "ja_share": ScaleCorpus.JA_SHARE}
    meta_path = os.path.join(cd, "meta.json")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
        if all(meta.get(k) == v for k, v in want.items()):
            return {**meta, "reused": True}
    except (OSError, ValueError):
        pass
    shutil.rmtree(cd, ignore_errors=True)
    os.makedirs(cd)
    t0 = time.perf_counter()
    every = max(1, n // DF_SAMPLE)
    corpus, rec = _make(os.path.join(cd, "rollouts"), os.path.join(cd, "batches.msgpack"), n, seed, every)
    rare_df = 5 if every == 1 else 1
    queries = _queries(corpus, rec, nq, rare_df)
    with open(os.path.join(cd, "queries.json"), "w") as f:
        json.dump(queries, f, ensure_ascii=False)
    _make(os.path.join(cd, "rollouts-extra"), os.path.join(cd, "extra.msgpack"), n_extra, seed + 1, n_extra + 1)
    meta = {**want, "messages": rec.messages, "batches": rec.batches, "sessions": corpus.sessions,
            "text_mib": round(rec.text_bytes / 2**20, 1), "text_bytes_per_event": round(rec.text_bytes / max(1, rec.messages)),
            "non_ascii_events": rec.non_ascii, "event_types": dict(rec.types), "max_tool_output": corpus.max_output,
            "df_sample_every": every, "rare_df_max": rare_df * every,
            "queries": dict(Counter(k for k, _ in queries)), "gen_s": round(time.perf_counter() - t0, 1)}
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return {**meta, "reused": False}


def batches(d: str, name: str = "batches") -> Iterator[dict[str, Any]]:
    """The import_messages args of a corpus file, in order."""
    with open(os.path.join(corpus_dir(d), f"{name}.msgpack"), "rb") as f:
        yield from msgpack.Unpacker(f, raw=False, max_buffer_size=1 << 30)


def queries(d: str) -> list[tuple[str, str]]:
    with open(os.path.join(corpus_dir(d), "queries.json")) as f:
        return [(k, q) for k, q in json.load(f)]
