"""Which project a path belongs to: git boundaries and project identity, read from the filesystem.

``file_attention`` matches files by their project-relative *tail* (``src/app.py``), which is the same
in the main checkout, a sibling worktree and an agent-isolation worktree, and scopes by project
*identity*: the git common directory, shared by every linked worktree of one repository (a non-git
directory is its own identity). Both are decided here — at ingest for the files tool calls touched,
and in the MCP front-end for the path an agent asks about and the directory the client was launched
from — with one rule: a root is used only when it can be proven; otherwise it stays unknown.

Proof: the nearest ancestor holding a ``.git`` entry is a file's worktree root only if the file's
own directory still exists (if it is gone — a deleted worktree — the nearest surviving ``.git`` above
may belong to an enclosing checkout and would give a wrong tail); failing that, the session's own
root is used when the file lies beneath it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache


def _is_dir(path: str) -> bool:
    try:
        return os.path.isdir(path)
    except (OSError, ValueError):
        return False


@lru_cache(maxsize=4096)
def git_boundary(directory: str) -> str | None:
    """The nearest directory at or above ``directory`` that holds a ``.git`` entry (dir or file)."""
    d = os.path.normpath(directory)
    while True:
        try:
            if os.path.lexists(os.path.join(d, ".git")):
                return d
        except (OSError, ValueError):
            return None
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096).strip()
    except (OSError, ValueError):
        return None


@lru_cache(maxsize=4096)
def common_dir(root: str) -> str | None:
    """The git common directory of the checkout at ``root`` (the identity all its worktrees share)."""
    dotgit = os.path.join(root, ".git")
    if _is_dir(dotgit):
        return os.path.realpath(dotgit)
    text = _read_text(dotgit)
    if not text or not text.startswith("gitdir:"):
        return None
    gitdir = text[len("gitdir:"):].strip()
    gitdir = os.path.normpath(os.path.join(root, gitdir))
    common = _read_text(os.path.join(gitdir, "commondir"))
    if common:
        return os.path.realpath(os.path.normpath(os.path.join(gitdir, common)))
    return os.path.realpath(gitdir)  # a submodule or a plain gitdir link: its own identity


@dataclass(frozen=True)
class Project:
    root: str | None      # the worktree (or non-git launch directory) a path is relative to
    identity: str | None  # git common dir, or the canonical directory for a non-git project


def project_of(directory: str | None) -> Project:
    """The project of a working directory: its git worktree and common dir, else the directory itself."""
    if not directory or not os.path.isabs(directory):
        return Project(None, None)
    root = git_boundary(directory)
    if root is not None:
        return Project(root, common_dir(root) or os.path.realpath(os.path.join(root, ".git")))
    if _is_dir(directory):
        return Project(os.path.normpath(directory), os.path.realpath(directory))
    return Project(None, None)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class Resolved:
    path: str             # absolute, normalised (or as given when it could not be made absolute)
    root: str | None
    tail: str | None
    project: str | None


def resolve(path: str, cwd: str | None, session: Project | None = None) -> Resolved:
    """A path a tool call named (absolute, or relative to ``cwd``) with its provable root and tail."""
    if os.path.isabs(path):
        absolute = os.path.normpath(path)
    elif cwd and os.path.isabs(cwd):
        absolute = os.path.normpath(os.path.join(cwd, path))
    else:
        return Resolved(path, None, None, None)
    parent = os.path.dirname(absolute)
    if _is_dir(parent):
        root = git_boundary(parent)
        if root is not None:
            return Resolved(absolute, root, os.path.relpath(absolute, root), common_dir(root))
    if session is not None and session.root is not None and _under(absolute, session.root) \
            and absolute != session.root:
        return Resolved(absolute, session.root, os.path.relpath(absolute, session.root), session.identity)
    return Resolved(absolute, None, None, None)


def launch_context(path: str, cwd: str | None) -> dict[str, object]:
    """What the front-end tells the daemon for file_attention: the launch project's identity and the
    requested path's tail (relative paths resolve from the launch directory, so a file that does not
    exist yet, or any more, keeps the launch project's provenance). Without a launch directory (an
    HTTP client that declared no roots) a relative path stays as given and no project is known."""
    git_boundary.cache_clear()  # the front-end lives long; a repository may have appeared since
    common_dir.cache_clear()
    if cwd is None and not os.path.isabs(path):
        return {"cwd": None, "project": None, "tail": os.path.normpath(path), "tail_is_absolute": False,
                "stripped_root": None, "path_project": None}
    launch = project_of(cwd)
    absolute = os.path.normpath(path if os.path.isabs(path) else os.path.join(cwd, path))
    parent = os.path.dirname(absolute)
    # the nearest existing ancestor decides (a deleted subdirectory of the launch project still
    # belongs to it); an absolute path outside every project stays absolute
    probe = parent
    while probe and not _is_dir(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    root = git_boundary(probe) if probe else None
    out: dict[str, object] = {"cwd": cwd, "project": launch.identity}
    if root is not None and (probe == parent or (launch.root is not None and root == launch.root)):
        out.update(tail=os.path.relpath(absolute, root), tail_is_absolute=False, stripped_root=root,
                   path_project=common_dir(root))
    elif launch.root is not None and _under(absolute, launch.root) and absolute != launch.root:
        out.update(tail=os.path.relpath(absolute, launch.root), tail_is_absolute=False, stripped_root=launch.root,
                   path_project=launch.identity)
    else:
        out.update(tail=absolute, tail_is_absolute=True, stripped_root=None, path_project=None)
    return out
