"""The daemon's tuning options as ``convmem-storaged`` takes them (``apply_tuning``): defaults kept when
an option is not given, "off" for 0 or less, and a mapped-pages cap under the floor raised to it."""
from __future__ import annotations

import pytest

from storaged import fileio
from storaged.__main__ import apply_tuning, parse_args
from storaged.server import (MAPPED_RESIDENT_CAP, MAPPED_RESIDENT_MIN, RELEASE_IDLE_S, SNAPSHOT_EVERY_RECORDS,
                             Server)

pytestmark = pytest.mark.unit


@pytest.fixture
def server():
    s = Server(None, "inproc://convmem-tuning")
    try:
        yield s
    finally:
        s.close()
        fileio.set_drop_pages(True)


def tuned(server: Server, *argv: str) -> tuple[int, float, int, bool]:
    apply_tuning(server, parse_args(list(argv)))
    return (server.snapshot_every_records, server.release_idle_s, server.mapped_resident_cap,
            fileio.dropping_pages())


def test_no_option_keeps_the_defaults(server):
    assert tuned(server) == (SNAPSHOT_EVERY_RECORDS, RELEASE_IDLE_S, MAPPED_RESIDENT_CAP, True)


@pytest.mark.parametrize("mib, cap", [
    ("512", 512 << 20),
    (str(MAPPED_RESIDENT_MIN >> 20), MAPPED_RESIDENT_MIN),
    ("1", MAPPED_RESIDENT_MIN),            # under the floor: raised to it
    ("0", 0),                              # off
    ("-5", 0),
])
def test_the_mapped_pages_cap_is_clamped(server, mib, cap):
    assert tuned(server, "--mapped-resident-mib", mib)[2] == cap


@pytest.mark.parametrize("seconds, idle, dropping", [
    ("12.5", 12.5, True),
    ("0", 0.0, False),       # never: not after a start or a rebuild either
    ("-1", 0.0, False),
    ("nan", 0.0, False),
    ("inf", 0.0, False),
])
def test_the_idle_release_is_clamped(server, seconds, idle, dropping):
    _, got, _, drops = tuned(server, "--release-idle-s", seconds)
    assert (got, drops) == (idle, dropping)


@pytest.mark.parametrize("records, every", [("2500", 2500), ("0", 0), ("-3", 0)])
def test_the_snapshot_period_is_clamped(server, records, every):
    assert tuned(server, "--snapshot-every", records)[0] == every
