"""The layers import only downwards: ``daemonclient`` under the front-end, the CLI and the ingester, and
none of those three importing another's client code. Read from the source with ``ast`` (every import
statement, at module level or inside a function), plus one ``python -c`` that imports the CLI and
looks at what came with it."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

# package -> the top-level modules it must never import
FORBIDDEN = {
    "protocol": {"daemonclient", "storaged", "mcpfront", "admin", "ingest"},
    "admin": {"mcpfront", "mcp", "mcp_types"},
    "mcpfront": {"admin"},
    "ingest": {"mcpfront", "admin"},
    "daemonclient": {"mcpfront", "admin", "ingest", "mcp", "mcp_types", "storaged"},
}


def imported_modules(package: str) -> dict[str, set[str]]:
    """file -> the top-level names of the modules it imports (relative imports are the package's own)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.add(package if node.level else (node.module or "").split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_no_layer_it_must_not(package: str) -> None:
    found = {f: sorted(names & FORBIDDEN[package]) for f, names in imported_modules(package).items()}
    assert {f: bad for f, bad in found.items() if bad} == {}


def test_the_scan_sees_imports_inside_functions() -> None:
    """The check is worth something only if lazy imports count: the front-end's entry point has some."""
    assert "daemonclient" in imported_modules("mcpfront")["mcpfront/__main__.py"]


def test_the_cli_loads_neither_the_front_end_nor_the_sdk() -> None:
    code = ("import sys, admin.__main__; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mcp', 'mcp_types', 'mcpfront')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == b"[]"
