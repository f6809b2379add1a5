"""Files others can read or plant: the daemon creates everything private (files 0600, dirs 0700),
never writes through a symlink planted where it puts a temporary file, and refuses a data
directory that is not this user's alone; ``convmem export`` writes a new 0600 file."""
from __future__ import annotations

import os
import stat

import pytest

from tests.support.admin_cli import convmem, out_json
from tests.support.daemon_proc import Daemon, run_storaged

pytestmark = pytest.mark.timeout(120)

LEFTOVERS = ("log.compact", "snapshot.tmp", "snapshot.bg.tmp", "cursor.key.tmp")


def _modes(root) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_mode
    out["."] = os.lstat(root).st_mode
    return out


def test_everything_the_daemon_creates_is_private(tmp_path):
    data = tmp_path / "data"
    old = os.umask(0o022)  # a usual umask: the daemon must not depend on it
    try:
        with Daemon(data, extra_args=["--snapshot-every", "20"]) as d:
            d.start()
            with d.client() as c:
                for i in range(40):
                    c.write("s", f"m{i}")
                assert c.rebuild()["status"] == "OK"
                c.write("s", "after the rebuild")
            modes = _modes(data)  # while it runs: the pid file and the ipc socket are there
            assert d.terminate() == 0
        modes.update(_modes(data))
    finally:
        os.umask(old)
    assert {"LOCK", "log", "snapshot", "cursor.key", "run", os.path.join("run", "storaged.pid")} <= set(modes)
    # the ipc socket gets 0777 & ~umask from libzmq; its x bit means nothing, what counts is that
    # no one else may connect (write)
    wrong = {name: oct(stat.S_IMODE(m)) for name, m in modes.items()
             if (stat.S_IMODE(m) & 0o077 if stat.S_ISSOCK(m) else
                 stat.S_IMODE(m) != (0o700 if stat.S_ISDIR(m) else 0o600))}
    assert wrong == {}


def test_planted_symlinks_are_never_followed(tmp_path):
    """A symlink where the daemon puts a temporary file: dangling ones (which the daemon would have
    created the target of) planted before the start, and ones to an existing file planted while it
    runs — the target is never created, truncated or written."""
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    outside.mkdir()
    with Daemon(data) as d:
        d.start()
        d.terminate()
        for name in LEFTOVERS:  # dangling: to files that do not exist yet
            os.symlink(outside / f"created-{name}", data / name)
        d.start()
        with d.client() as c:
            c.write("s", "one")
            victims = {}
            for name in ("log.compact", "snapshot.tmp"):  # what a rebuild writes
                victim = outside / f"victim-{name}"
                victim.write_text("keep me")
                victims[victim] = "keep me"
                os.symlink(victim, data / name)
            assert c.rebuild()["status"] == "OK"
            c.write("s", "two")
            assert len(c.history("s")) == 2
        assert d.terminate() == 0
    assert sorted(p.name for p in outside.iterdir()) == sorted(v.name for v in victims)
    for victim, text in victims.items():
        assert victim.read_text() == text
    assert not any(os.path.islink(data / name) for name in LEFTOVERS)


@pytest.mark.parametrize("where", ["data", "run"])
def test_a_directory_others_can_write_is_refused(tmp_path, where):
    data = tmp_path / "data"
    (data / "run").mkdir(parents=True, mode=0o700)
    os.chmod(data, 0o700)
    target = data if where == "data" else data / "run"
    os.chmod(target, 0o770)
    p = run_storaged(["--data-dir", str(data)])
    assert p.returncode == 2, p.stderr
    assert "writable by group or others" in p.stderr and "chmod 700" in p.stderr
    assert os.listdir(data) == ["run"] and os.listdir(data / "run") == []  # nothing touched, not even LOCK


def test_a_symlinked_data_dir_is_fine_if_its_target_is_private(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    os.symlink(real, link)
    with Daemon(link) as d:
        d.start()
        with d.client() as c:
            c.write("s", "through a link")
        assert d.terminate() == 0
    assert (real / "log").exists()


def test_export_file_is_new_and_private(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    data = tmp_path / "data"
    out = tmp_path / "export.jsonl"
    old = os.umask(0o022)
    try:
        with Daemon(data) as d:
            d.start()
            with d.client() as c:
                c.write("s", "secret")
            assert out_json(convmem(data, home, "export", "-o", str(out))) == {"exported": 1}
            assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
            before = out.read_bytes()
            again = convmem(data, home, "export", "-o", str(out))    # never overwrites
            assert again.returncode == 2 and b"already exists" in again.stderr
            assert out.read_bytes() == before
            victim = tmp_path / "victim"
            victim.write_text("keep me")
            os.symlink(victim, tmp_path / "link.jsonl")
            assert convmem(data, home, "export", "-o", str(tmp_path / "link.jsonl")).returncode == 2
            assert victim.read_text() == "keep me"
    finally:
        os.umask(old)
