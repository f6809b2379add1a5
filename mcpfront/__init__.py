"""Stateless MCP front-end of convmem: MCP tool calls in, storage-daemon requests out."""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("convmem")
except _metadata.PackageNotFoundError:  # running from a source checkout
    __version__ = "0.0.0+source"
