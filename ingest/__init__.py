"""Transcript ingestion: agent harnesses' session files (Claude Code, Codex, Gemini CLI) as store events.

Each harness has a small parser module that turns its file format into ``events.Event`` and
``events.SessionInfo`` values; ``reader`` follows files from durable checkpoints (kept in the daemon's
store); ``workspace`` says which project a path belongs to; ``service`` runs it all as a daemon client
(``convmem-ingest``, and ``convmem import-transcripts`` for one-off runs).
"""
