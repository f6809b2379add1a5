"""Issue 15's engine spike: which search engine should hold 5M events' postings off the Python heap?

Measures four engines on the same generated agent-history corpus, each fed the same text, so the next
session can choose by figures instead of by habit:

  ours    today's storaged.search.SearchIndex, in process (postings on the Python heap); its "file" is
          the msgpack of SearchIndex.dump() (what the snapshot holds), its open is SearchIndex.load().
  numpy   a prototype: our tokens (storaged.tokenize.index_terms) → one field, postings as CSR arrays
          (doc ids uint32, BM25 tf-part float32 precomputed at build with our K1/B) in .npy files
          opened with np.load(mmap_mode='r'); the vocabulary is a sorted uint64 array of term hashes
          (blake2b-8) found by np.searchsorted, so nothing per term lives on the heap.  A query adds
          idf × impact into a float32 accumulator and takes the top k by np.argpartition.
  tantivy tantivy's official Python bindings fed with our tokens joined by spaces into a text field
          with the "whitespace" tokenizer (index_option "freq"), one writer (1 thread, 256 MB budget),
          one commit; a query is a boolean SHOULD of term queries (BM25 k1=1.2, b=0.75 built in).
  fts5    SQLite FTS5 `porter unicode61` (what the README compares with), contentless, one transaction;
          the query is the question's words OR-ed (our stop words dropped), ORDER BY rank.

numpy and tantivy score BM25 over one field with no CJK phrase bonus and no prefix expansion (our
index does both); "ours" is today's full search() (still without rank.py's context stage).

Corpus: bench/history_bench.Corpus's text makers (LoCoMo prompts and chat, coding templates, tool
outputs log-normal in size with a tail to 64 KB, error lines), ~20% of sessions in Japanese, one
event = one document.  Queries (≥ 300): prompt words (2-4), error lines of tool outputs, Japanese
keywords, common single words, rare words (df ≤ 5).

Each phase runs in a fresh process (one core; nothing runs in parallel):
  gen     writes DIR/events.jsonl (text), DIR/tokens.txt (our terms, space-joined), DIR/queries.json
  build   one engine: build time (events/s, tokenising excluded for numpy/tantivy: gen measured it),
          size on disk, RSS after build
  open    one engine, fresh process: open time, RSS after open, first query, RSS; then the query mix
          warm (one warm-up pass) → p50/p95/p99, RSS after queries.  Repeated --repeat times.
  recall  LoCoMo dev recall@5/@10 of ours (search(), BM25 alone) vs numpy and tantivy fed the same
          tokens (no context stage for any of them)

    /tmp/spikevenv2/bin/python -m bench.engine_spike all --events 200000 --dir /tmp/spike200k \\
        [--engines ours,numpy,tantivy,fts5] [--repeat 3] [--json out.json]
    /tmp/spikevenv2/bin/python -m bench.engine_spike recall

tantivy is NOT a project dependency (numpy is, since the search kernel, and PyStemmer since the
Snowball stemmer): install it
into a private venv (python3 -m venv /tmp/spikevenv2 && /tmp/spikevenv2/bin/pip install -e . tantivy
PyStemmer numpy) and run from the repository root.  RSS is VmRSS (anonymous + file-backed pages:
mmapped index pages count once touched) read from /proc; the page cache is warm after build, so open
times are warm-cache times.
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import msgpack

try:
    import numpy as np
    import tantivy
except ImportError as exc:  # pragma: no cover - the message is the point
    sys.exit(f"bench/engine_spike.py needs tantivy (not a project dependency) and numpy ({exc}).\n"
             "Install them into a private venv: python3 -m venv /tmp/spikevenv2 && "
             "/tmp/spikevenv2/bin/pip install -e . tantivy PyStemmer numpy")

from bench.common import pct, proc_mem
from bench.history_bench import _PROJECTS, Corpus, fts_query
from storaged import search as S
from storaged.search import SearchIndex
from storaged.tokenize import index_terms, query_runs

ENGINES = ("ours", "numpy", "tantivy", "fts5")
JA_SHARE = 0.2
LIMIT = 10


def rss() -> dict[str, float]:
    """VmRSS, RssAnon, RssFile and VmHWM of this process, in MiB."""
    return proc_mem()


def du(path: str) -> float:
    """Bytes on disk under path, in MiB."""
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    return round(sum(f.stat().st_size for f in files) / 2**20, 1)


# ================================================================================ corpus


def _text(payload: dict[str, Any]) -> str | None:
    """The searchable text of one generated rollout record (None: not an event with text)."""
    t = payload.get("type")
    if t == "message":
        return payload["content"][0]["text"]
    if t == "reasoning":
        return payload["summary"][0]["text"] if payload.get("summary") else None
    if t == "function_call":
        return " ".join(json.loads(payload["arguments"])["command"][2:])
    if t == "custom_tool_call":
        return payload["input"]
    if t in ("function_call_output", "custom_tool_call_output"):
        return payload["output"]
    return None


def events(corpus: Corpus, n: int) -> Iterator[str]:
    """n event texts in session order: history_bench's prompts, reasoning, tool calls and outputs,
    answers; a session is Japanese with probability JA_SHARE (prompts and answers)."""
    rng = corpus.rng
    made = 0
    out: list[str] = []

    def rec(kind: str, payload: dict[str, Any], counted: int = 0, etype: str | None = None) -> None:
        """history_bench's record callback: keep the text of what it counts as an event."""
        text = _text(payload) if counted else None
        if text:
            out.append(text)

    while made < n:
        proj = rng.choice(_PROJECTS)
        ja = rng.random() < JA_SHARE
        cwd = f"/home/dev/{proj[0]}"
        target = rng.randint(40, 60)
        k = 0
        while k < target:
            out.append(corpus.prompt(proj, ja))
            chat = rng.random() < 0.2
            for _ in range(0 if chat else rng.choice([0, 1, 1, 2, 2, 3, 3, 4, 5, 6])):
                if rng.random() < 0.6:
                    corpus.reasoning(rec, proj)
                corpus.tool(rec, proj, cwd, 1_735_689_600_000 + made * 1000)
            out.append(corpus.answer(proj, ja, chat))
            k += len(out)
            for text in out:
                if made < n:
                    made += 1
                    yield text
            out.clear()


def gen(d: str, n: int, nq: int) -> dict[str, Any]:
    os.makedirs(d, exist_ok=True)
    corpus = Corpus(d, n)
    df: Counter = Counter()
    raw_words: list[str] = []
    tok_s = 0.0
    n_bytes = n_tokens = n_ja = 0
    rng = random.Random(11)
    with open(os.path.join(d, "events.jsonl"), "w") as ev, open(os.path.join(d, "tokens.txt"), "w") as tk:
        for text in events(corpus, n):
            t0 = time.perf_counter()
            terms = index_terms(text)
            tok_s += time.perf_counter() - t0
            ev.write(json.dumps(text, ensure_ascii=False) + "\n")
            tk.write(" ".join(terms) + "\n")
            n_bytes += len(text.encode())
            n_tokens += len(terms)
            n_ja += not text.isascii()
            df.update(set(terms))
            if rng.random() < 0.02:
                raw_words.extend(w for w in re.findall(r"\b[a-z]{5,12}\b", text.lower())[:20])
    # rare: a raw word whose term is in at most 5 docs; common: the most frequent plain words
    rare = [w for w in dict.fromkeys(raw_words) if (t := index_terms(w)) and len(t) == 1 and df[t[0]] <= 5]
    common = [t for t, _ in df.most_common(200) if t.isascii() and t.isalpha() and len(t) > 2][:60]
    qr = random.Random(5)
    kinds = {
        "prompt": [q for q, _, k in corpus.queries(10**6) if k == "prompt"],
        "error": list(corpus.q_error),
        "japanese": list(corpus.q_ja),
        "common": [" ".join(qr.sample(common, qr.randint(1, 3))) for _ in range(200)],
        "rare": [" ".join(qr.sample(rare, qr.randint(1, 2))) for _ in range(200)] if len(rare) > 2 else [],
    }
    share = {"prompt": 0.3, "error": 0.25, "japanese": 0.1, "common": 0.15, "rare": 0.2}
    queries = []
    for kind, pool in kinds.items():
        m = min(len(pool), max(1, round(nq * share[kind])))
        queries += [(kind, q) for q in qr.sample(pool, m)] if pool else []
    qr.shuffle(queries)
    with open(os.path.join(d, "queries.json"), "w") as f:
        json.dump(queries, f, ensure_ascii=False)
    meta = {"events": n, "text_mib": round(n_bytes / 2**20, 1), "tokens": n_tokens, "terms": len(df),
            "non_ascii_events": n_ja, "tokenize_s": round(tok_s, 2),
            "tokenize_mib_s": round(n_bytes / 2**20 / tok_s, 2), "queries": Counter(k for k, _ in queries)}
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f)
    return meta


def read_texts(d: str) -> Iterator[str]:
    with open(os.path.join(d, "events.jsonl")) as f:
        for line in f:
            yield json.loads(line)


def read_tokens(d: str) -> Iterator[str]:
    with open(os.path.join(d, "tokens.txt")) as f:
        for line in f:
            yield line.rstrip("\n")


def query_terms(q: str) -> Counter:
    """Our query terms with their repeats (CJK runs give their bigrams)."""
    c: Counter = Counter()
    for run in query_runs(q):
        c.update(list(dict.fromkeys(run.terms)) if run.cjk else run.terms)
    return c


# ================================================================================ engines


class Engine:
    """An engine: build(d, out) indexes the corpus of d into out (a file or directory) and returns what
    save() needs; save() writes what build left in memory (timed apart); Engine(out) opens it fresh."""

    @staticmethod
    def save(built: Any, out: str) -> None:
        """Nothing left to write: build() wrote out itself."""


class Ours(Engine):
    @staticmethod
    def build(d: str, out: str) -> SearchIndex:
        idx = SearchIndex()
        for i, text in enumerate(read_texts(d)):
            idx.add(i, text, None, ())
        return idx

    @staticmethod
    def save(built: SearchIndex, out: str) -> None:
        with open(out, "wb") as f:
            f.write(msgpack.packb(built.dump(), use_bin_type=True))

    def __init__(self, out: str) -> None:
        with open(out, "rb") as f:
            self.idx = SearchIndex.load(msgpack.unpackb(f.read(), raw=False))

    def search(self, q: str, k: int = LIMIT) -> list[int]:
        return [h.doc for h in self.idx.search(q, k)]


class NumpyEngine(Engine):
    """CSR postings in .npy files, mmapped.  Files: hashes.npy (uint64, sorted), offsets.npy (int64,
    len V+1), docs.npy (uint32), impacts.npy (float32: BM25's tf part at the corpus average length),
    meta.json (N)."""

    @staticmethod
    def hash(term: str) -> int:
        return int.from_bytes(hashlib.blake2b(term.encode(), digest_size=8).digest(), "little")

    @staticmethod
    def build_from(lines: Iterator[str], out: str, k1: float = S.K1, b: float = S.B) -> None:
        from array import array
        os.makedirs(out, exist_ok=True)
        vocab: dict[str, int] = {}
        tids, docs, tfs, lens = array("I"), array("I"), array("H"), array("I")
        for i, line in enumerate(lines):
            terms = line.split()
            lens.append(len(terms))
            c = Counter(terms)
            for t, tf in c.items():
                tid = vocab.get(t)
                if tid is None:
                    tid = vocab[t] = len(vocab)
                tids.append(tid)
                tfs.append(min(tf, 65535))
            docs.extend([i] * len(c))
        n = len(lens)
        hashes = np.fromiter((NumpyEngine.hash(t) for t in vocab), dtype=np.uint64, count=len(vocab))
        del vocab
        horder = np.argsort(hashes, kind="stable")  # new id = rank of the hash
        rank = np.empty_like(horder)
        rank[horder] = np.arange(len(horder))
        t_arr = rank[np.frombuffer(tids, dtype=np.uint32)].astype(np.uint32)
        del tids
        order = np.argsort(t_arr, kind="stable")  # by term, then doc (docs were appended in order)
        d_arr = np.frombuffer(docs, dtype=np.uint32)[order]
        tf = np.frombuffer(tfs, dtype=np.uint16)[order].astype(np.float32)
        dl = np.frombuffer(lens, dtype=np.uint32).astype(np.float32)
        avg = float(dl.mean()) if n else 1.0
        imp = (tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * dl[d_arr] / avg))).astype(np.float32)
        counts = np.bincount(t_arr, minlength=len(hashes))
        offsets = np.zeros(len(hashes) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        np.save(os.path.join(out, "hashes.npy"), hashes[horder])
        np.save(os.path.join(out, "offsets.npy"), offsets)
        np.save(os.path.join(out, "docs.npy"), d_arr)
        np.save(os.path.join(out, "impacts.npy"), imp)
        with open(os.path.join(out, "meta.json"), "w") as f:
            json.dump({"n": n}, f)

    @staticmethod
    def build(d: str, out: str) -> None:
        NumpyEngine.build_from(read_tokens(d), out)

    def __init__(self, out: str) -> None:
        load = lambda name: np.load(os.path.join(out, name), mmap_mode="r")  # noqa: E731
        self.hashes, self.offsets = load("hashes.npy"), load("offsets.npy")
        self.docs, self.impacts = load("docs.npy"), load("impacts.npy")
        with open(os.path.join(out, "meta.json")) as f:
            self.n = json.load(f)["n"]
        self.acc = np.zeros(self.n, dtype=np.float32)

    def search_terms(self, terms: Counter, k: int = LIMIT) -> list[int]:
        n, acc = self.n, self.acc
        lists = []
        for t, qtf in terms.items():
            h = np.uint64(self.hash(t))
            j = int(np.searchsorted(self.hashes, h))
            if j == len(self.hashes) or self.hashes[j] != h:
                continue
            o0, o1 = int(self.offsets[j]), int(self.offsets[j + 1])
            df = o1 - o0
            w = qtf * max(float(np.log(1.0 + (n - df + 0.5) / (df + 0.5))), 1e-3)
            docs = self.docs[o0:o1]
            acc[docs] += np.float32(w) * self.impacts[o0:o1]  # doc ids within a list are unique
            lists.append(docs)
        if not lists:
            return []
        total = sum(len(x) for x in lists)
        if total * 8 < n:
            cands = np.unique(np.concatenate(lists)) if len(lists) > 1 else np.asarray(lists[0])
            scores = acc[cands]
        else:
            cands, scores = None, acc
        kk = min(k, len(scores))
        top = np.argpartition(-scores, kk - 1)[:kk]
        ids = top if cands is None else cands[top]
        s = scores[top]
        res = [int(ids[j]) for j in np.lexsort((-ids.astype(np.int64), -s)) if s[j] > 0]  # score, then newest
        for docs in lists:
            acc[docs] = 0.0
        return res

    def search(self, q: str, k: int = LIMIT) -> list[int]:
        return self.search_terms(query_terms(q), k)


class TantivyEngine(Engine):
    HEAP = 256 * 2**20

    @staticmethod
    def schema():
        sb = tantivy.SchemaBuilder()
        sb.add_unsigned_field("id", stored=True)
        sb.add_text_field("body", stored=False, tokenizer_name="whitespace", index_option="freq")
        return sb.build()

    @staticmethod
    def build_from(lines: Iterator[str], out: str | None):
        schema = TantivyEngine.schema()
        if out:
            os.makedirs(out, exist_ok=True)
        index = tantivy.Index(schema, path=out) if out else tantivy.Index(schema)
        w = index.writer(TantivyEngine.HEAP, 1)
        for i, line in enumerate(lines):
            w.add_document(tantivy.Document(id=i, body=line))
        w.commit()
        w.wait_merging_threads()
        return index

    @staticmethod
    def build(d: str, out: str) -> None:
        TantivyEngine.build_from(read_tokens(d), out)

    def __init__(self, out: str | None, index=None) -> None:
        self.index = index if index is not None else tantivy.Index.open(out)
        self.index.reload()
        self.schema = self.index.schema
        self.searcher = self.index.searcher()

    def search_terms(self, terms: Counter, k: int = LIMIT) -> list[int]:
        Q, Occur = tantivy.Query, tantivy.Occur
        subs = []
        for t, qtf in terms.items():
            q = Q.term_query(self.schema, "body", t)
            subs.append((Occur.Should, Q.boost_query(q, float(qtf)) if qtf > 1 else q))
        if not subs:
            return []
        hits = self.searcher.search(Q.boolean_query(subs), k, count=False).hits
        return [self.searcher.doc(addr)["id"][0] for _, addr in hits]

    def search(self, q: str, k: int = LIMIT) -> list[int]:
        return self.search_terms(query_terms(q), k)


class Fts5Engine(Engine):
    @staticmethod
    def build(d: str, out: str) -> None:
        con = sqlite3.connect(out)
        con.execute("PRAGMA journal_mode=OFF")
        con.execute("CREATE VIRTUAL TABLE t USING fts5(content, content='', tokenize='porter unicode61')")
        with con:
            con.executemany("INSERT INTO t(rowid, content) VALUES (?, ?)",
                            ((i + 1, text) for i, text in enumerate(read_texts(d))))
        con.close()

    def __init__(self, out: str) -> None:
        self.con = sqlite3.connect(out)

    def search(self, q: str, k: int = LIMIT) -> list[int]:
        m = fts_query(q)
        if not m:
            return []
        rows = self.con.execute("SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank LIMIT ?", (m, k)).fetchall()
        return [r[0] - 1 for r in rows]


CLASSES = {"ours": Ours, "numpy": NumpyEngine, "tantivy": TantivyEngine, "fts5": Fts5Engine}


def target(d: str, engine: str) -> str:
    return os.path.join(d, {"ours": "ours.msgpack", "numpy": "numpy", "tantivy": "tantivy", "fts5": "fts5.db"}[engine])


# ================================================================================ phases (one process each)


def phase_build(d: str, engine: str) -> dict[str, Any]:
    out = target(d, engine)
    if os.path.isdir(out):
        shutil.rmtree(out)
    elif os.path.exists(out):
        os.remove(out)
    base = rss()
    cls = CLASSES[engine]
    t0 = time.perf_counter()
    built = cls.build(d, out)
    build_s = time.perf_counter() - t0
    after = rss()
    t0 = time.perf_counter()
    cls.save(built, out)
    save_s = time.perf_counter() - t0
    with open(os.path.join(d, "meta.json")) as f:
        n = json.load(f)["events"]
    return {"engine": engine, "build_s": round(build_s, 2), "save_s": round(save_s, 2),
            "events_per_s": round(n / build_s), "disk_mib": du(out), "rss_base": base, "rss_after_build": after}


def phase_open(d: str, engine: str) -> dict[str, Any]:
    with open(os.path.join(d, "queries.json")) as f:
        queries = [tuple(x) for x in json.load(f)]
    gc.collect()
    base = rss()
    t0 = time.perf_counter()
    eng = CLASSES[engine](target(d, engine))
    open_s = time.perf_counter() - t0
    after_open = rss()
    t0 = time.perf_counter()
    eng.search(queries[0][1])
    first_ms = (time.perf_counter() - t0) * 1e3
    after_first = rss()
    for _, q in queries:  # warm-up pass
        eng.search(q)
    lat: dict[str, list[float]] = {"all": []}
    for kind, q in queries:
        t0 = time.perf_counter()
        eng.search(q)
        dt = (time.perf_counter() - t0) * 1e3
        lat["all"].append(dt)
        lat.setdefault(kind, []).append(dt)

    def stats(xs: list[float]) -> dict[str, float]:
        return {"p50": round(statistics.median(xs), 3), "p95": round(pct(xs, 95), 3), "p99": round(pct(xs, 99), 3),
                "n": len(xs)}

    return {"engine": engine, "open_s": round(open_s, 3), "first_query_ms": round(first_ms, 2),
            "rss_base": base, "rss_after_open": after_open, "rss_after_first_query": after_first,
            "rss_after_queries": rss(), "latency_ms": {k: stats(v) for k, v in lat.items()}}


def child(args: list[str]) -> dict[str, Any]:
    """Run one phase in a fresh interpreter (one core: no other phase runs meanwhile)."""
    cmd = [sys.executable, "-m", "bench.engine_spike", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_all(a: argparse.Namespace) -> dict[str, Any]:
    d = a.dir
    res: dict[str, Any] = {"dir": d}
    if a.regen or not os.path.exists(os.path.join(d, "meta.json")):
        res["gen"] = child(["gen", "--events", str(a.events), "--dir", d, "--queries", str(a.queries)])
    else:
        with open(os.path.join(d, "meta.json")) as f:
            res["gen"] = json.load(f)
    print(json.dumps(res["gen"]), file=sys.stderr)
    for engine in a.engines.split(","):
        r = res[engine] = {"build": child(["build", "--dir", d, "--engine", engine]), "open": []}
        print(json.dumps(r["build"]), file=sys.stderr)
        for _ in range(a.repeat):
            r["open"].append(child(["open", "--dir", d, "--engine", engine]))
            print(json.dumps(r["open"][-1]), file=sys.stderr)
        r["summary"] = summarize(r)
        print(json.dumps(r["summary"]), file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1, ensure_ascii=False)
    return res


def summarize(r: dict[str, Any]) -> dict[str, Any]:
    """Medians over the repeated open phases."""
    opens = r["open"]
    med = lambda f: round(statistics.median(f(o) for o in opens), 3)  # noqa: E731
    b = r["build"]
    return {
        "events_per_s": b["events_per_s"], "build_s": b["build_s"], "disk_mib": b["disk_mib"],
        "rss_build_mib": b["rss_after_build"]["VmRSS"], "rss_build_peak_mib": b["rss_after_build"]["VmHWM"],
        "rss_build_delta_mib": round(
            b["rss_after_build"]["VmRSS"] - b["rss_base"]["VmRSS"], 1),
        "open_s": med(lambda o: o["open_s"]),
        "rss_open_mib": med(lambda o: o["rss_after_open"]["VmRSS"]),
        "rss_first_query_mib": med(lambda o: o["rss_after_first_query"]["VmRSS"]),
        "rss_after_queries_mib": med(lambda o: o["rss_after_queries"]["VmRSS"]),
        "rss_after_queries_anon_mib": med(lambda o: o["rss_after_queries"]["RssAnon"]),
        "rss_base_mib": med(lambda o: o["rss_base"]["VmRSS"]),
        "first_query_ms": med(lambda o: o["first_query_ms"]),
        **{f"{k}_{p}": med(lambda o, k=k, p=p: o["latency_ms"][k][p])
           for k in opens[0]["latency_ms"] for p in ("p50", "p95", "p99")},
    }


# ================================================================================ LoCoMo recall


def run_recall() -> dict[str, Any]:
    """BM25 alone (no context stage) on LoCoMo dev: ours (search()) vs numpy and tantivy fed our
    tokens of the same turn texts and our query terms; numpy_k1.2_b.75 is the numpy engine with
    tantivy's fixed BM25 parameters, to tell the engine from the parameters."""
    import tempfile
    from bench.search_quality import Recall, load_locomo, turn_text
    rec = {"ours": Recall(), "numpy": Recall(), "tantivy": Recall(), "numpy_k1.2_b.75": Recall()}
    with tempfile.TemporaryDirectory(prefix="spike-recall-") as tmp:
        for ci, (_, turns, qs, _) in enumerate(load_locomo()):
            texts = [turn_text(t) for t in turns]
            idx = SearchIndex()
            for i, t in enumerate(texts):
                idx.add(i, t, None, ())
            lines = [" ".join(index_terms(t)) for t in texts]
            npdir = os.path.join(tmp, f"np{ci}")
            NumpyEngine.build_from(iter(lines), npdir)
            npe = NumpyEngine(npdir)
            NumpyEngine.build_from(iter(lines), npdir + "t", k1=1.2, b=0.75)
            npt = NumpyEngine(npdir + "t")
            tv = TantivyEngine(None, TantivyEngine.build_from(iter(lines), None))
            for q, ev, cat in qs:
                ids = lambda docs: [turns[i]["dia_id"] for i in docs]  # noqa: E731
                rec["ours"].add(ids(h.doc for h in idx.search(q, 10)), ev, cat)
                terms = query_terms(q)
                rec["numpy"].add(ids(npe.search_terms(terms, 10)), ev, cat)
                rec["tantivy"].add(ids(tv.search_terms(terms, 10)), ev, cat)
                rec["numpy_k1.2_b.75"].add(ids(npt.search_terms(terms, 10)), ev, cat)
    return {k: r.report() for k, r in rec.items()}


# ================================================================================ tables

ROWS = (("build events/s (tokenising incl.)", "eps_total"), ("build s (engine only)", "build_s"),
        ("index on disk MiB", "disk_mib"), ("RSS after build MiB", "rss_build_mib"),
        ("peak RSS during build MiB", "rss_build_peak_mib"), ("open s", "open_s"),
        ("RSS after open MiB", "rss_open_mib"), ("first query ms", "first_query_ms"),
        ("RSS after first query MiB", "rss_first_query_mib"),
        ("RSS after the query mix MiB (anon)", "rss_q"),
        *((f"{k} p50 / p95 / p99 ms", f"lat:{k}") for k in ("all", "common", "rare", "prompt", "error", "japanese")))


def table(paths: list[str]) -> str:
    """Markdown table(s) from `all --json` files; results of one directory are merged."""
    by_dir: dict[str, dict[str, Any]] = {}
    for p in paths:
        with open(p) as f:
            r = json.load(f)
        by_dir.setdefault(r["dir"], {}).update(r)
    out = []
    for d, r in by_dir.items():
        g = r["gen"]
        engines = [e for e in ENGINES if e in r]
        out.append(f"{g['events']:,} events, {g['text_mib']} MiB of text, {g['tokens']:,} tokens, {g['terms']:,} "
                   f"terms; tokenising {g['tokenize_s']} s ({g['tokenize_mib_s']} MiB/s); "
                   f"opens: median of {len(r[engines[0]]['open'])}\n")
        out.append("| figure | " + " | ".join(engines) + " |")
        out.append("|---" * (len(engines) + 1) + "|")
        for label, key in ROWS:
            cells = []
            for e in engines:
                s = r[e]["summary"] | {"rss_build_peak_mib": r[e]["build"]["rss_after_build"]["VmHWM"]}
                if key == "eps_total":
                    extra = g["tokenize_s"] if e in ("numpy", "tantivy") else 0.0
                    cells.append(f"{g['events'] / (s['build_s'] + extra):,.0f}")
                elif key == "rss_q":
                    cells.append(f"{s['rss_after_queries_mib']} ({s['rss_after_queries_anon_mib']})")
                elif key.startswith("lat:"):
                    k = key[4:]
                    cells.append(" / ".join(f"{s[f'{k}_{p}']:.3g}" for p in ("p50", "p95", "p99")))
                else:
                    cells.append(f"{s[key]}")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


# ================================================================================ CLI


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("phase", choices=("all", "gen", "build", "open", "recall", "table"))
    ap.add_argument("files", nargs="*", help="table: the --json files of `all` runs")
    ap.add_argument("--dir", default="/tmp/spike")
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--queries", type=int, default=400)
    ap.add_argument("--engine", choices=ENGINES)
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--regen", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.phase == "gen":
        res = gen(a.dir, a.events, a.queries)
    elif a.phase == "build":
        res = phase_build(a.dir, a.engine)
    elif a.phase == "open":
        res = phase_open(a.dir, a.engine)
    elif a.phase == "recall":
        res = run_recall()
    elif a.phase == "table":
        print(table(a.files))
        return
    else:
        res = run_all(a)
        print(json.dumps({e: res[e]["summary"] for e in ENGINES if e in res}, indent=1))
        return
    print(json.dumps(res, ensure_ascii=False))


if __name__ == "__main__":
    main()
