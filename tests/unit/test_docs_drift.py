"""docs/ is generated from the code (``python -m mcpfront.docs``): the committed reference must be exactly
what the schemas and the argparse parsers generate today. Other branches change options and schemas; after
a merge, regenerate with ``python -m mcpfront.docs`` and commit docs/ with the change."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mcpfront import docs
from mcpfront.tools import ALL_TOOLS, INPUT_SCHEMAS
from tests.support import ROOT

REGENERATE = "docs/ is out of date with the code: run `python -m mcpfront.docs` and commit docs/"


def test_committed_docs_match_the_code() -> None:
    assert docs.stale() == [], REGENERATE


@pytest.mark.process  # starts a process, unlike the rest of this module
def test_the_drift_check_sees_a_change(tmp_path: Path) -> None:
    """The comparison is real: an edited, a missing and an untouched file are told apart."""
    docs.write(tmp_path)
    assert docs.stale(tmp_path) == []
    cli = tmp_path / "cli.md"
    cli.write_text(cli.read_text().replace("--no-spawn", "--no-spwan", 1))
    (tmp_path / "tools.md").unlink()
    assert sorted(docs.stale(tmp_path)) == ["cli.md", "tools.md"]
    rc = subprocess.run([sys.executable, "-m", "mcpfront.docs", "--check", "--docs-dir", str(tmp_path)],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert rc.returncode == 1 and "python -m mcpfront.docs" in rc.stderr
    assert subprocess.run([sys.executable, "-m", "mcpfront.docs", "--docs-dir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, timeout=60).returncode == 0
    assert docs.stale(tmp_path) == []


def test_every_tool_argument_and_cli_option_is_documented() -> None:
    """The generator leaves nothing out: every tool and argument, every option of every command line."""
    generated = docs.generate()
    tools, cli = generated["tools.md"], generated["cli.md"]
    for name in ALL_TOOLS:
        assert f"\n### {name}\n" in tools
        for arg in INPUT_SCHEMAS[name].get("properties", {}):
            assert f"| `{arg}` |" in tools, (name, arg)
    for module, command in docs.CLIS:
        assert f"## `{command}`" in cli
        parsers = [docs.capture_parser(__import__(module, fromlist=["parse_args"]).parse_args)]
        while parsers:
            parser = parsers.pop()
            for action in parser._actions:
                if isinstance(action, argparse._SubParsersAction):
                    parsers.extend(action.choices.values())
                    assert all(f"### `{p.prog}`" in cli for p in action.choices.values())
                elif not isinstance(action, argparse._HelpAction):
                    for flag in action.option_strings or [action.dest]:
                        assert f"`{flag}`" in cli, (parser.prog, flag)


@pytest.mark.parametrize("variable", ["CONVMEM_LOG_LEVEL", "CONVMEM_DATA_DIR"])
def test_generation_ignores_the_environment(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    """Defaults read from CONVMEM_* at parse time must not leak one machine's settings into the docs."""
    before = docs.generate()
    monkeypatch.setenv(variable, "DEBUG" if variable.endswith("LEVEL") else "/somewhere/else")
    monkeypatch.setenv("COLUMNS", "40")
    assert docs.generate() == before
