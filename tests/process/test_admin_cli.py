"""The admin CLI's manners, at process level: the real ``convmem`` against real daemons (tests/support/daemon_proc.py,
ended by PID).

- Common options are accepted before or after the command.
- ``status`` says whether this data dir's daemon runs (pid, uptime, endpoint, messages) and never starts
  one; ``stop`` stops it cleanly and waits; "not running" is exit 3 for both; a pid file naming some
  other process is never trusted (nor signalled).
- No Python traceback reaches a user: Ctrl-C is one line and exit 130, an unwritable ``export -o`` one
  line and exit 4, a closed output pipe exit 141.
- ``health`` shows sizes in the unit that fits; progress keeps its line intact under warnings and shows
  an ETA from the file size; the CLI does not import the MCP SDK for what does not need it.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.admin_cli import CONVMEM, ROOT, FakeTty, cli_cmd, cli_env, convmem, out_json
from tests.support.daemon_proc import DaemonPool, pid_alive, pids_mentioning
from protocol.config import pid_path
from ulid import ULID

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("cli")
    home = base / "home"
    home.mkdir()
    pool = DaemonPool(base)
    d = pool.new("d").start()
    try:
        with d.client() as c:
            for i in range(21):
                c.write(f"s{i % 3}", f"message {i} about alpha beta")
            c.call("search_messages", {"query": "alpha"})
        yield {"base": base, "home": home, "d": d, "pool": pool}
    finally:
        pool.close_all()


def run(home: Path, *argv: str, timeout: float = 60.0, **kw) -> subprocess.CompletedProcess:
    """``convmem ARGV`` exactly as given (no options added), stdout/stderr captured."""
    return subprocess.run([*CONVMEM, *argv], cwd=str(home), env=cli_env(home), capture_output=True,
                          timeout=timeout, **kw)


def one_line(stderr: bytes) -> str:
    text = stderr.decode()
    assert "Traceback" not in text and text.count("\n") == 1 and text.startswith("convmem: "), text
    return text


def msg_line(i: int, sid: str, size: int = 40) -> bytes:
    ts = 1_700_000_000_000 + i * 1000
    m = {"message_id": str(ULID.from_bytes(((ts << 80) | (0xCD << 60) | i).to_bytes(16, "big"))),
         "session_id": sid, "timestamp": ts, "role": "user", "content": f"line {i} " + "x" * size}
    return (json.dumps(m) + "\n").encode()


# ------------------------------------------------------------------------------ option placement
def test_common_options_before_or_after_the_command(world):
    home, d = world["home"], world["d"]
    with d.client() as c:
        n = c.health()["active_messages"]
    before = run(home, "--data-dir", d.data_dir, "--no-spawn", "health", "--json")
    after = run(home, "health", "--json", "--data-dir", d.data_dir, "--no-spawn", "--timeout", "10")
    for p in (before, after):
        assert p.returncode == 0 and p.stderr == b"", p.stderr
        assert json.loads(p.stdout)["active_messages"] == n
    # given in both places, the one after the command wins
    p = run(home, "--data-dir", str(world["base"] / "elsewhere"), "status", "--json", "--data-dir", d.data_dir)
    assert p.returncode == 0 and json.loads(p.stdout)["pid"] == d.pid


# ------------------------------------------------------------------------------ status and stop
def test_status_of_a_running_daemon(world):
    home, d = world["home"], world["d"]
    with d.client() as c:
        h = c.health()
    p = run(home, "status", "--json", "--data-dir", d.data_dir)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["running"] is True and s["pid"] == d.pid and s["endpoint"] == d.endpoint
    assert s["data_dir"] == os.path.abspath(d.data_dir)
    assert (s["active_messages"], s["session_count"]) == (h["active_messages"], h["session_count"])
    assert 0 <= s["uptime_s"] < 3600
    text = run(home, "status", "--data-dir", d.data_dir).stdout.decode()
    assert re.search(rf"^running\s+pid {d.pid}, up \d+", text, re.M), text
    assert f"{h['active_messages']:,} live in {h['session_count']:,} sessions" in text


def test_status_when_nothing_runs_spawns_nothing(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    data = tmp_path / "never-started"
    p = run(home, "status", "--data-dir", str(data))  # no --no-spawn: status must not start one anyway
    assert p.returncode == 3 and p.stderr == b"", p.stderr
    assert p.stdout.decode().startswith("not running")
    assert not os.path.exists(pid_path(str(data))) and not os.path.exists(data)
    assert pids_mentioning(str(data)) == []
    p = run(home, "status", "--json", "--data-dir", str(data))
    assert p.returncode == 3 and json.loads(p.stdout)["running"] is False


def test_stop_stops_the_daemon_cleanly_and_says_when_none_runs(tmp_path):
    home = tmp_path / "h"
    home.mkdir()
    pool = DaemonPool(tmp_path)
    d = pool.new("stopme").start()
    try:
        with d.client() as c:
            c.write("s", "kept across the stop")
        pid = d.pid
        p = run(home, "stop", "--data-dir", d.data_dir)
        assert p.returncode == 0 and p.stderr == b"", p.stderr
        assert json.loads(p.stdout)["stopped"] == pid
        assert d.proc.wait(10) == 0  # a clean exit, already over when stop returned
        assert not os.path.exists(pid_path(d.data_dir))
        assert not pid_alive(pid)
        # not running any more: exit 3 for stop and status alike, one line
        p = run(home, "stop", "--data-dir", d.data_dir)
        assert p.returncode == 3 and p.stdout == b"" and "no daemon is running" in one_line(p.stderr)
        assert run(home, "status", "--data-dir", d.data_dir).returncode == 3
        d.start()  # the store is intact
        with d.client() as c:
            assert [m["content"] for m in c.history("s")] == ["kept across the stop"]
    finally:
        pool.close_all()


def test_a_pid_file_naming_another_process_is_not_trusted(tmp_path):
    """A stale pid file whose pid now belongs to some other program: not running, never signalled."""
    home = tmp_path / "h"
    home.mkdir()
    data = tmp_path / "stale"
    os.makedirs(os.path.dirname(pid_path(str(data))), mode=0o700)
    other = subprocess.Popen(["sleep", "60"])
    try:
        Path(pid_path(str(data))).write_text(f"{other.pid}\n")
        p = run(home, "status", "--json", "--data-dir", str(data))
        assert p.returncode == 3 and "not a convmem storaged" in json.loads(p.stdout)["reason"]
        p = run(home, "stop", "--data-dir", str(data))
        assert p.returncode == 3 and "stale pid file" in one_line(p.stderr)
        assert other.poll() is None  # untouched
    finally:
        os.kill(other.pid, signal.SIGKILL)
        other.wait()


# ------------------------------------------------------------------------------ no tracebacks
def test_ctrl_c_during_an_import_is_one_line_and_exit_130(world):
    """SIGINT while the import waits for more input on stdin (a blocking read, where asyncio's own
    handling would not stop it) after its first batch is stored."""
    home, d = world["home"], world["d"]
    with d.client() as c:
        before = c.health()["active_messages"]
    proc = subprocess.Popen(cli_cmd(d.data_dir, "import", "-"), cwd=str(home), env=cli_env(home),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(b"".join(msg_line(i, "ctrl-c") for i in range(1500)))
        proc.stdin.flush()
        deadline = time.monotonic() + 60
        with d.client() as c:
            while c.health()["active_messages"] < before + 1000:  # the first batch is in
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out == b""
    # the first batch, and a second if the interrupt came after the importer sent what it had read
    # (it does not wait for a full batch forever): the store holds at least what it names
    m = re.fullmatch(r"convmem: interrupted after ([\d,]+) messages were sent; .*", one_line(err).strip())
    assert m, err
    sent = int(m.group(1).replace(",", ""))
    with d.client() as c:
        assert 1000 <= sent <= 1500 and before + sent <= c.health()["active_messages"] <= before + 1500


def test_export_into_a_missing_directory_is_one_line_and_exit_4(world, tmp_path):
    home, d = world["home"], world["d"]
    target = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    p = convmem(d.data_dir, home, "export", "-o", str(target))
    assert p.returncode == 4 and p.stdout == b""
    assert one_line(p.stderr) == f"convmem: cannot write {target}: No such file or directory\n"


def test_a_closed_output_pipe_is_exit_141_without_traceback(world):
    home, d = world["home"], world["d"]
    with d.client() as c:
        for i in range(200):
            c.write("pipe", f"{i} " + "p" * 2000)  # ~400 KiB of export: more than a pipe buffer holds
    proc = subprocess.Popen(cli_cmd(d.data_dir, "export"), cwd=str(home), env=cli_env(home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdout.readline()
        proc.stdout.close()  # like `convmem export | head -1`
        err = proc.stderr.read()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 141 and b"Traceback" not in err, err


# ------------------------------------------------------------------------------ health, imports
SIZE = re.compile(r"([\d,]+(?:\.\d+)?) (B|KiB|MiB|GiB)\b")


def test_health_sizes_are_in_units_that_fit(world):
    home, d = world["home"], world["d"]
    with d.client() as c:
        h = c.health()
    p = convmem(d.data_dir, home, "health")
    assert p.returncode == 0 and p.stderr == b""
    text = p.stdout.decode()
    sizes = SIZE.findall(text)
    assert len(sizes) >= 8, text
    for value, unit in sizes:
        v = float(value.replace(",", ""))
        if unit == "B":
            assert v < 1024 and value.isdigit(), text
        else:
            assert 1.0 <= v < 1024, text  # never "0.0 MiB" for a small store, never "5,000.0 KiB"
    assert h["log_size"] < 1024 * 1024 and re.search(r"^log\s+[\d.]+ KiB", text, re.M), text


def test_the_cli_does_not_load_the_mcp_sdk_for_admin_commands():
    """Importing the SDK costs ~1.5 s at every start: no command needs it (rebuild included)."""
    code = "import sys, admin.__main__; print(sorted(m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')))"
    p = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=cli_env(ROOT), capture_output=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == b"[]"


def test_rebuild_through_the_daemon_client(world):
    home, d = world["home"], world["d"]
    assert out_json(convmem(d.data_dir, home, "rebuild"))["status"] == "OK"


# ------------------------------------------------------------------------------ progress line



@pytest.mark.unit  # in-process, unlike the rest of this module
def test_a_warning_clears_the_progress_line_and_redraws_it_below():
    from admin.progress import Progress, say

    tty = FakeTty()
    p = Progress("imported", total=100, stream=tty, interval=0)
    p.advance(10)
    drawn = tty.text
    say("convmem: skipped line 7: message.role is required", stream=tty)
    added = tty.text[len(drawn):]
    # cleared first (carriage return + erase line), the warning on its own line, then the progress again
    assert added.startswith("\r\033[Kconvmem: skipped line 7: message.role is required\n\rimported: 10 / 100"), added
    p.done()
    assert Progress.active is None
    say("after", stream=tty)
    assert tty.text.endswith("\nafter\n")


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_progress_of_an_import_file_has_an_eta_from_its_size():
    from admin.progress import Progress

    p = Progress("imported", stream=FakeTty(), interval=0, total_bytes=1000)
    p.start = time.monotonic() - 10.0
    p.bytes_done = 250
    p.advance(500)
    assert re.search(r"imported: 500 \(\d+/s, 25% of the file, ETA 3\ds\)", p.line()), p.line()
    p.bytes_done = 1000
    assert "ETA" not in p.line()


@pytest.mark.unit  # in-process, unlike the rest of this module
def test_format_bytes():
    from admin.progress import format_bytes

    assert [format_bytes(n) for n in (0, 1023, 1024, 1536, 1024 ** 2 * 5 // 2, 3 * 1024 ** 3)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "2.5 MiB", "3.00 GiB"]


def test_on_a_terminal_a_skipped_line_is_written_above_the_progress_line(world, tmp_path):
    from tests.process.test_admin_transfer import run_on_pty

    home, d = world["home"], world["d"]
    f = tmp_path / "bad-late.jsonl"
    lines = [msg_line(5000 + i, "tty-skip") for i in range(1500)]
    lines[1200] = b'{"session_id": "tty-skip", "content": "no id, no role"}\n'  # after the first batch drew
    f.write_bytes(b"".join(lines))
    rc, out, tty = run_on_pty(cli_cmd(d.data_dir, "import", str(f)), cli_env(home), home)
    assert rc == 0, tty
    assert json.loads(out)["invalid_lines"] == 1
    before, warning = tty.split("convmem: skipped line 1201: ", 1)
    # (batches of IMPORT_BATCH_PREFERRED: the count drawn last depends on the redraw's pace)
    assert re.search(r"imported: [1-9][\d,]* \(", before) and before.endswith("\r\x1b[K"), repr(tty)  # cleared first
    assert re.match(r"message\.message_id is required\r?\n\rimported: 1,000 \(", warning), repr(warning)  # redrawn
    assert "no id, no role" not in tty
