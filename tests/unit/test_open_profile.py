"""bench.open_profile times the steps of a start from a snapshot (a smoke test on a small store)."""
from __future__ import annotations

from bench import open_profile
from storaged.store import Store
from tests.support.faultio import write


def test_it_times_the_steps_of_a_start_from_a_snapshot(tmp_path, capsys):
    d = str(tmp_path / "d")
    store = Store.open(d)
    for i in range(30):
        write(store, f"s{i % 3}", f"profiled message {i}")
    store.search
    assert store.write_snapshot()
    store.close()
    before = [owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
              for owner, name, _ in open_profile.STEPS]
    open_profile.main([d, "--repeat", "2"])
    out = capsys.readouterr().out
    assert out.count("Store.open") == 2 and "30 messages, 3 sessions, snapshot_valid=True" in out
    for label in ("snapshot reader", "message table", "      sessions\n", "per-slot docs"):
        assert out.count(label) == 2, label
    after = [owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
             for owner, name, _ in open_profile.STEPS]
    assert all(a is b for a, b in zip(after, before))   # the steps are put back as they were
