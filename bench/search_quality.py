"""Retrieval quality of storaged.search vs SQLite FTS5, measured in the same run.

1. LoCoMo (shared/data/locomo-dev.json): every turn is one message (speaker name, text and image
   caption, the same text for both engines); every question with evidence is a search restricted
   to its conversation (one index / one FTS5 table per conversation); recall@k = share of the
   evidence turns in the top k, averaged over questions.  Malformed evidence ids ("D8:6; D9:17")
   are split, ids that do not exist are skipped.
   Baselines: FTS5 `porter unicode61` + bm25 with every question word OR-ed (the baseline in
   NOTES.md), and FTS5 given exactly our query words (our stop words removed) to show what comes
   from the query side and what from the ranking.
   A secondary run uses LoCoMo's per-turn "observations" as each message's summary field (FTS5:
   a second column, bm25 column weights equal to ours).
2. Japanese: a built-in corpus of messages written without spaces and queries with known relevant
   messages; ours vs FTS5 `trigram` (as a substring phrase, and as OR of the query's trigrams).
   Trigram cannot match a query shorter than three characters; those count as misses.

    python -m bench.search_quality [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import time
from collections import defaultdict
from pathlib import Path

from storaged import search as S
from storaged import rank as R
from storaged.rank import ranked_search
from storaged.search import SearchIndex
from storaged.tokenize import STOP_WORDS

DATA = Path(os.environ.get("CONVMEM_LOCOMO", Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev.json"))
KS = (1, 5, 10)


# --- LoCoMo ---------------------------------------------------------------------------------------


def load_locomo():
    data = json.loads(DATA.read_text())
    convs = []
    for sample in data:
        conv = sample["conversation"]
        turns = [t | {"_session": k} for k, v in conv.items() if k.startswith("session_") and isinstance(v, list)
                 for t in v]
        valid = {t["dia_id"] for t in turns}
        qs = []
        for q in sample["qa"]:
            ev = {p for e in q.get("evidence", []) for p in re.split(r"[;,\s]+", str(e)) if p in valid}
            if ev:
                qs.append((q["question"], ev, q.get("category")))
        summaries = defaultdict(list)
        for sess in sample.get("observation", {}).values():
            for items in sess.values():
                for item in items:
                    text, ev = item[0], item[1]
                    for e in ev if isinstance(ev, list) else [ev]:
                        for p in re.split(r"[;,\s]+", str(e)):
                            if p in valid:
                                summaries[p].append(text)
        convs.append((sample.get("sample_id"), turns, qs, {k: " ".join(v) for k, v in summaries.items()}))
    return convs


def turn_text(t: dict) -> str:
    text = f"{t['speaker']}: {t['text']}"
    if t.get("blip_caption"):
        text += f" [image: {t['blip_caption']}]"
    return text


def fts_or(words) -> str | None:
    words = [f'"{w}"' for w in dict.fromkeys(words) if w]
    return " OR ".join(words) or None


def fts_all_words(q: str) -> str | None:
    return fts_or(re.findall(r"\w+", q.lower()))


def fts_our_words(q: str) -> str | None:
    words = []
    for w in re.findall(r"[^\W_]+(?:['’][^\W_]+)*", q.casefold()):
        w = re.sub(r"['’].*$", "", w)
        if w not in STOP_WORDS:
            words.append(w)
    return fts_or(words)


class Recall:
    def __init__(self) -> None:
        self.sums = defaultdict(float)
        self.by_cat = defaultdict(lambda: defaultdict(float))
        self.n = 0
        self.n_cat = defaultdict(int)

    def add(self, ranked: list, ev: set, cat) -> None:
        self.n += 1
        self.n_cat[cat] += 1
        for k in KS:
            r = len(ev & set(ranked[:k])) / len(ev)
            self.sums[k] += r
            self.by_cat[cat][k] += r

    def at(self, k: int) -> float:
        return self.sums[k] / self.n if self.n else 0.0

    def report(self) -> dict:
        return {
            "questions": self.n,
            **{f"recall@{k}": round(self.at(k), 4) for k in KS},
            "by_category": {
                str(c): {f"recall@{k}": round(v[k] / self.n_cat[c], 4) for k in KS} | {"questions": self.n_cat[c]}
                for c, v in sorted(self.by_cat.items(), key=lambda x: str(x[0]))
            },
        }


def session_neighbours(turns):
    """neighbours(doc, r) over LoCoMo's sessions (docs are 1-based turn positions), as the store
    gives them from Session.seqs."""
    sess = [t["_session"] for t in turns]

    def neighbours(doc: int, r: int):
        i = doc - 1
        before, after = [], []
        for k in range(1, r + 1):
            if i - k >= 0 and sess[i - k] == sess[i]:
                before.append(doc - k)
            if i + k < len(sess) and sess[i + k] == sess[i]:
                after.append(doc + k)
        return before, after

    return neighbours


def run_locomo(convs, with_summaries: bool) -> dict:
    engines = {"ours": Recall(), "ours_no_context": Recall(), "fts5_all_words": Recall(),
               "fts5_our_words": Recall()}
    times = defaultdict(float)
    for _, turns, qs, summaries in convs:
        idx = SearchIndex()
        con = sqlite3.connect(":memory:")
        if with_summaries:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(content, summary, tokenize='porter unicode61')")
        else:
            con.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize='porter unicode61')")
        for i, t in enumerate(turns, 1):
            summary = summaries.get(t["dia_id"]) if with_summaries else None
            idx.add(i, turn_text(t), summary, ())
            if with_summaries:
                con.execute("INSERT INTO t(rowid, content, summary) VALUES (?, ?, ?)", (i, turn_text(t), summary or ""))
            else:
                con.execute("INSERT INTO t(rowid, content) VALUES (?, ?)", (i, turn_text(t)))
        rank = f"bm25(t, 1.0, {S.FIELD_WEIGHTS[1]})" if with_summaries else "bm25(t)"
        sql = f"SELECT rowid FROM t WHERE t MATCH ? ORDER BY {rank} LIMIT 10"
        nb = session_neighbours(turns)
        for q, ev, cat in qs:
            t0 = time.perf_counter()
            ranked = [turns[h.doc - 1]["dia_id"] for h in ranked_search(idx, q, 10, neighbours=nb)]
            times["ours"] += time.perf_counter() - t0
            engines["ours"].add(ranked, ev, cat)
            t0 = time.perf_counter()
            ranked = [turns[h.doc - 1]["dia_id"] for h in idx.search(q, 10)]
            times["ours_no_context"] += time.perf_counter() - t0
            engines["ours_no_context"].add(ranked, ev, cat)
            for name, build in (("fts5_all_words", fts_all_words), ("fts5_our_words", fts_our_words)):
                m = build(q)
                t0 = time.perf_counter()
                rows = con.execute(sql, (m,)).fetchall() if m else []
                times[name] += time.perf_counter() - t0
                engines[name].add([turns[r[0] - 1]["dia_id"] for r in rows], ev, cat)
        con.close()
    out = {name: r.report() for name, r in engines.items()}
    for name, r in engines.items():
        out[name]["mean_query_ms"] = round(times[name] / r.n * 1e3, 3)
    return out


# --- Japanese -------------------------------------------------------------------------------------

JA_DOCS = {
    1: "本番データベースの移行を来月に決定した",
    2: "データベースのバックアップは毎晩三時に取っている",
    3: "DB移行はv2リリースの後にやる予定です",
    4: "移行作業の手順書をチームで共有した",
    5: "来週京都へ旅行に行くので新幹線を予約した",
    6: "京都の清水寺で見た紅葉がきれいだった",
    7: "東京から大阪までは新幹線で二時間半くらい",
    8: "うちの猫の名前はミケで三歳になる",
    9: "猫が夜中に走り回ってよく眠れなかった",
    10: "犬の散歩は朝と夕方の二回",
    11: "駅前の新しいラーメン屋は豚骨スープが濃厚だった",
    12: "週末にカレーを作りすぎて三日間食べ続けた",
    13: "健康診断で血圧が少し高いと言われた",
    14: "歯医者の予約を木曜日の午後に入れた",
    15: "会議の議事録をまとめて部長に送った",
    16: "明日の定例会議は十時から第二会議室で行う",
    17: "Python3でスクリプトを書き直したら処理が速くなった",
    18: "ログの解析にはPythonのpandasが便利だ",
    19: "母の誕生日プレゼントにスカーフを買った",
    20: "息子の誕生日ケーキを予約した",
    21: "今日は一日中雨で洗濯物が乾かない",
    22: "台風が近づいているので明日の予定は中止",
    23: "新しいカメラを買ったので週末に写真を撮りに行く",
    24: "カメラのレンズが曇ってしまった",
    25: "映画館で話題のアニメ映画を観た",
    26: "図書館で借りた推理小説が面白かった",
    27: "毎朝五キロ走るのを習慣にしている",
    28: "マラソン大会に向けて練習を増やした",
    29: "今月の予算を超えてしまったので外食を控える",
    30: "家計簿アプリで支出を管理している",
    31: "来年の春に引っ越しを考えていて新居を探している",
    32: "引っ越し業者の見積もりが高すぎた",
    33: "英会話のレッスンを週二回受けている",
    34: "TOEICのスコアが八百点を超えた",
    35: "車のエンジンから異音がするので修理に出した",
    36: "タイヤ交換は冬になる前に済ませたい",
    37: "庭のトマトが赤くなってきた",
    38: "ベランダでバジルを育てている",
    39: "好きなバンドのコンサートチケットが当たった",
    40: "ピアノの発表会で娘がショパンを弾いた",
    41: "iPhoneの画面が割れたので修理を予約した",
    42: "夏祭りの花火大会は八月十日に開催される",
    43: "花粉症がひどくて薬を飲んでいる",
    44: "年末年始は実家に帰省する予定だ",
    45: "サーバーのメモリ不足でアプリが落ちた",
    46: "新しいプロジェクトのキックオフは来週月曜日",
    47: "データ分析の結果をグラフにまとめた",
    48: "ベースの練習を始めたが指が痛い",
    # phrase cases: a query must rank its contiguous run above messages sharing one bigram (あり)
    49: "手伝ってくれて本当にありがとう、助かった",
    50: "明日の午前中に全体会議があります",
    51: "何か質問はありますか",
    52: "お土産をありがとうございました",
    53: "ありがたいことに雨はやんだ",
    54: "会議室予約システムが朝から落ちている",
    55: "予約した会議室のシステム設定を直した",
}

# query → relevant docs.  Several phrase the idea differently from the text (データベース移行 vs
# データベースの移行), five are two characters long, one is half-width katakana.
JA_QUERIES = [
    ("データベース移行", {1, 3}),
    ("移行", {1, 3, 4}),
    ("京都旅行", {5, 6}),
    ("京都", {5, 6}),
    ("猫の名前", {8}),
    ("ラーメン", {11}),
    ("歯医者の予約", {14}),
    ("定例会議", {16}),
    ("Python", {17, 18}),
    ("誕生日プレゼント", {19}),
    ("誕生日", {19, 20}),
    ("カメラ", {23, 24}),
    ("ｶﾒﾗ", {23, 24}),
    ("マラソン", {28}),
    ("予算", {29}),
    ("引っ越し", {31, 32}),
    ("英会話", {33}),
    ("車の修理", {35}),
    ("花火大会", {42}),
    ("帰省", {44}),
    ("DB移行", {3}),
    ("iPhone修理", {41}),
    ("健康診断", {13}),
    ("台風", {22}),
    ("メモリ不足", {45}),
    ("トマト", {37}),
    ("コンサート", {39}),
    ("新幹線", {5, 7}),
    ("ありがとう", {49, 52}),
    ("あります", {50, 51}),
    ("会議室予約", {54}),
]
JA_ONE_CHAR = [("猫", {8, 9}), ("車", {35})]


def trigram_phrase(q: str) -> str | None:
    pieces = [p for p in q.split() if len(p) >= 3]
    return " AND ".join('"' + p.replace('"', '""') + '"' for p in pieces) or None


def trigram_or(q: str) -> str | None:
    grams = {p[i : i + 3] for p in q.split() for i in range(len(p) - 2)}
    return " OR ".join('"' + g.replace('"', '""') + '"' for g in sorted(grams)) or None


def run_japanese() -> dict:
    idx = SearchIndex()
    con = sqlite3.connect(":memory:")
    con.execute("CREATE VIRTUAL TABLE t USING fts5(content, tokenize='trigram')")
    for d, text in JA_DOCS.items():
        idx.add(d, text, None, ())
        con.execute("INSERT INTO t(rowid, content) VALUES (?, ?)", (d, text))
    sql = "SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank LIMIT 10"

    def evaluate(queries):
        res = {}
        per_query = []
        for name in ("ours", "fts5_trigram_phrase", "fts5_trigram_or"):
            sums = defaultdict(float)
            for q, rel in queries:
                if name == "ours":
                    ranked = [h.doc for h in ranked_search(idx, q, 10, text_of=JA_DOCS.__getitem__)]
                else:
                    m = (trigram_phrase if name == "fts5_trigram_phrase" else trigram_or)(q)
                    ranked = [r[0] for r in con.execute(sql, (m,))] if m else []
                for k in KS:
                    sums[k] += len(rel & set(ranked[:k])) / len(rel)
                sums["hit1"] += bool(ranked) and ranked[0] in rel
                if name == "ours":
                    per_query.append({"query": q, "relevant": sorted(rel), "top5": ranked[:5]})
            res[name] = {f"recall@{k}": round(sums[k] / len(queries), 4) for k in KS}
            res[name]["top1_relevant"] = round(sums["hit1"] / len(queries), 4)
        return res, per_query

    main, per_query = evaluate(JA_QUERIES)
    short = [(q, r) for q, r in JA_QUERIES if len(q) < 3]
    short_res, _ = evaluate(short)
    one, _ = evaluate(JA_ONE_CHAR)
    con.close()
    return {
        "docs": len(JA_DOCS),
        "queries": len(JA_QUERIES),
        "results": main,
        "two_char_queries": {"queries": len(short), "results": short_res},
        "one_char_queries": {"queries": len(JA_ONE_CHAR), "results": one},
        "ours_per_query": per_query,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write results to this path")
    args = ap.parse_args()
    convs = load_locomo()
    out = {
        "params": {"k1": S.K1, "b": S.B, "field_weights": list(S.FIELD_WEIGHTS)},
        "locomo": run_locomo(convs, with_summaries=False),
        "locomo_with_observation_summaries": run_locomo(convs, with_summaries=True),
        "japanese": run_japanese(),
    }

    names = {
        "ours": "ours (BM25 + session context %s)" % (list(R.CONTEXT_WEIGHTS),),
        "ours_no_context": "ours, core only (BM25 k1=%.2g b=%.2g, stemming, stop words)" % (S.K1, S.B),
        "fts5_all_words": "FTS5 porter unicode61, all question words OR-ed",
        "fts5_our_words": "FTS5 porter unicode61, our query words OR-ed",
    }
    for key, title in (
        ("locomo", "LoCoMo dev (5 conversations), turn-level evidence recall"),
        ("locomo_with_observation_summaries", "LoCoMo dev with observations as the summary field"),
    ):
        res = out[key]
        print(f"\n{title}: {res['ours']['questions']} questions")
        print(f"  {'engine':52} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'ms/q':>6}")
        for name, label in names.items():
            r = res[name]
            print(
                f"  {label:52} {r['recall@1']:6.3f} {r['recall@5']:6.3f} {r['recall@10']:6.3f} "
                f"{r['mean_query_ms']:6.2f}"
            )
        if key == "locomo":
            cats = sorted(res["ours"]["by_category"])
            for at in ("recall@5", "recall@10"):
                print(f"  {at} by category: " + "  ".join(
                    f"{c}: ours {res['ours']['by_category'][c][at]:.3f} / "
                    f"core {res['ours_no_context']['by_category'][c][at]:.3f} / "
                    f"FTS5 {res['fts5_all_words']['by_category'][c][at]:.3f}"
                    for c in cats
                ))
    ja = out["japanese"]
    print(f"\nJapanese (no spaces): {ja['docs']} messages, {ja['queries']} queries")
    print(f"  {'engine':52} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'top1 ok':>8}")
    labels = {
        "ours": "ours (CJK bigrams)",
        "fts5_trigram_phrase": "FTS5 trigram, query as substring",
        "fts5_trigram_or": "FTS5 trigram, OR of query trigrams",
    }
    for part, title in (("results", "all"), ("two_char_queries", "2-char"), ("one_char_queries", "1-char")):
        block = ja[part] if part == "results" else ja[part]["results"]
        n = ja["queries"] if part == "results" else ja[part]["queries"]
        print(f"  -- {title} queries ({n})")
        for name, label in labels.items():
            r = block[name]
            print(
                f"  {label:52} {r['recall@1']:6.3f} {r['recall@5']:6.3f} {r['recall@10']:6.3f} "
                f"{r['top1_relevant']:8.3f}"
            )
    print("  (R@1 is capped below 1 by queries with several relevant messages; 'top1 ok' = share of")
    print("   queries whose first result is relevant.  Trigram cannot match queries under three")
    print("   characters; FTS5 gets the raw text, no NFKC.)")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, ensure_ascii=False))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
