"""TouchIndex: a start's bulk load gives the index the events' one-by-one adds give."""
import random

from storaged.indexes import TouchIndex


def test_a_bulk_load_is_the_same_index_as_adding_each_event():
    rng = random.Random(7)
    names = ["a.py", "b.md", "dir/c.py", "/abs/path/a.py", "noslash", "trailing/", "x/y/z/b.md", "日本語/ファイル.txt"]
    entries = []
    for seq in sorted(rng.sample(range(1, 5000), 600)):
        files = tuple((rng.choice(names), None, None, None, "read") for _ in range(rng.choice((1, 1, 1, 2, 3))))
        entries.append((seq, files))
    one, bulk = TouchIndex(), TouchIndex()
    for seq, files in entries:
        one.add_files(seq, files)
    bulk.load(entries)
    assert bulk.by_name == one.by_name
    assert set(bulk.by_name) == {"a.py", "b.md", "c.py", "noslash", "", "ファイル.txt"}
    assert all(seqs == sorted(set(seqs)) for seqs in bulk.by_name.values())
