"""Secret redaction for imported agent transcripts: secrets are replaced before storage, never stored.

Transcripts of coding agents (user prompts, tool-call arguments, shell output, config files the agent
read) routinely contain credentials. Everything imported goes through :func:`redact` first, so a
secret never reaches the log, the index or a snapshot; the per-kind counts it returns are what the
ingest status reports as "secrets redacted". Pure code (stdlib ``re`` only, no I/O, no logging), shared
by the daemon and its clients.

Each secret becomes ``[REDACTED:<kind>]``. Where a rule has context (a header word, a key name, quotes)
only the value is replaced and the context is kept. Text without secrets comes back unchanged. Rules
run in this order, which is also the order of ``REDACTION_KINDS``; a later rule never matches inside
an earlier rule's marker, so every secret is counted once, under the most specific kind:

- ``private_key``: a PEM block ``-----BEGIN <LABEL >PRIVATE KEY[ BLOCK]-----`` ... ``-----END ...
  PRIVATE KEY[ BLOCK]-----`` (RSA, EC, DSA, OPENSSH, ENCRYPTED, PGP ... BLOCK, PKCS#8 without label),
  whole block replaced. The body may hold base64, whitespace, RFC 1421 headers (``Proc-Type:``,
  ``DEK-Info:``) and escaped line breaks (``\\n`` inside a JSON string, as in a cloud service-account
  file). Without an END line (truncated output) the BEGIN line and the run of base64/header lines
  right after it (newline-separated, real or escaped) are replaced. Either way the body must contain
  16 consecutive base64 characters, so a bare BEGIN string in code or prose about PEM stays.
- ``jwt``: ``eyJ<5+>.eyJ<5+>.<10+>`` in the base64url alphabet (header and payload both start with
  ``eyJ``), not inside a longer token.
- ``github_token``: ``ghp_`` / ``gho_`` / ``ghu_`` / ``ghs_`` / ``ghr_`` + 36 or more letters/digits;
  ``github_pat_`` + 22 or more of ``[A-Za-z0-9_]``; not preceded by a letter, digit or ``_``.
- ``anthropic_api_key``: ``sk-ant-`` + 20 or more of ``[A-Za-z0-9_-]`` (api03, admin01, oat01, ...).
- ``openai_api_key``: ``sk-`` (also ``sk-proj-``, ``sk-svcacct-``, ``sk-admin-``; never ``sk-ant-``)
  + 20 or more of ``[A-Za-z0-9_-]``, not preceded by a letter, digit, ``_`` or ``-`` (so ``task-1``,
  ``disk-...`` never match), and only if the part after ``sk-`` holds a run of 20 or more letters and
  digits with at least one of each (so ``sk-learn`` or ``sk-some-long-hyphenated-name`` never match).
  Other providers' ``sk-`` keys of that shape are counted here too.
- ``stripe_key``: ``sk_live_`` / ``rk_live_`` / ``sk_test_`` / ``rk_test_`` + 16 or more letters/digits.
- ``slack_token``: ``xoxb-`` / ``xoxp-`` / ``xoxa-`` / ``xoxr-`` / ``xoxs-`` / ``xoxe-`` /
  ``xoxe.xoxp-`` / ``xapp-`` + 10 or more of ``[A-Za-z0-9-]`` containing a digit (``xoxb-your-token``
  stays).
- ``google_api_key``: ``AIza`` + exactly 35 of ``[A-Za-z0-9_-]``, as a whole token.
- ``aws_access_key_id``: ``AKIA`` / ``ASIA`` / ``AGPA`` / ``AIDA`` / ``AROA`` / ``ANPA`` / ``ANVA`` /
  ``AIPA`` + 16 of ``[A-Z0-9]``, not inside a longer run of letters/digits.
- ``aws_secret_access_key``: exactly 40 of ``[A-Za-z0-9/+]`` after a key named
  ``aws_secret_access_key`` / ``secret_access_key`` / ``SecretAccessKey`` (any case, ``_`` or ``-``
  or nothing between the words) and ``=``, ``:``, ``=>`` or whitespace, quotes optional; value only.
- ``bearer_token``: ``Bearer`` (any case, as a word) + spaces + 16 or more of
  ``[A-Za-z0-9._~+/=-]`` plus ``_`` (RFC 6750); the word is kept, the token replaced. A token of one
  letter case with no digit (``YOUR_ACCESS_TOKEN_HERE``, ``authentication-required``) stays.
- ``generic_secret_assignment``: runs last, deliberately conservative. Key: any name containing
  ``password``, ``passwd``, ``passphrase``, ``secret`` (so ``client_secret``, ``SECRET_KEY``),
  ``api_key`` / ``apikey`` / ``api-key``, ``access_token``, ``auth_token``, ``refresh_token``,
  ``session_token`` or ``private_key`` (any case, ``_`` / ``-`` / nothing between the words), at most
  64 more name characters after the word, optionally quoted (also ``\\"`` inside JSON strings). Then
  ``=``, ``:``, ``:=`` or ``=>`` with optional spaces or tabs (so ``KEY=v``, ``export KEY=v``,
  ``KEY: v``, ``"key": "v"``, ``'key': 'v'``, ``key = "v"``, ``--password=v``). Value, on the same
  line: a ``"..."`` / ``'...'`` literal, or an unquoted run of ``[A-Za-z0-9+/=_.!@#%^*~-]`` not
  followed by ``(``, ``[``, ``{``, ``<`` or ``$`` (a call, subscript or template, not a literal); it
  ends at anything else, e.g. whitespace, ``,``, ``;``, ``&`` (URL query) or ``:``.
  Only the value (inside its quotes) is replaced, and only if all of these hold:

  * at least 8 characters and no whitespace;
  * it contains a character other than ASCII letters, ``_``, ``.`` and ``-`` (so identifiers,
    attribute paths, env-var names and words stay: ``form.fields``, ``OPENAI_API_KEY``, ``required``);
  * unquoted, it is not a dotted attribute path (``settings.API_KEY_V2``);
  * it is not a placeholder: starts with ``$`` ``%`` ``{`` ``<`` or ``your``; contains ``${``,
    ``{{``, ``[REDACTED:``, ``xxxx``, ``****``, ``...``, ``changeme`` / ``change_me`` /
    ``change-me``, ``example``, ``placeholder``, ``redacted``; has at most two distinct characters;
    is ``None`` / ``null`` / ``true`` / ``false`` (any case);
  * it is not a URL (``://``) or a file path (``/``, ``./``, ``../``, ``~/`` followed only by path
    characters).

Deliberately NOT covered (would cost false positives on ordinary code and prose, or needs context this
pure per-text function does not have): high-entropy strings without a known prefix or key name;
passwords in prose ("my password is hunter2") or passed as separate arguments (``-p secret``,
``--password secret``, SQL ``IDENTIFIED BY '...'``); letters-only passwords and quoted values with
spaces in the generic rule; credentials inside URLs (``postgres://user:pass@host``); ``Authorization:
Basic`` / ``Token`` schemes and cookies, unless the token itself has a known shape; publishable keys
(``pk_live_``); key names outside the list above (plain ``token``, ``pwd``, ``credentials``); cloud
keys of other providers (Azure, ...); PuTTY ``.ppk`` files; secrets split across messages or encoded
(base64 of a config file, escaped twice).

Known false positives (accepted): an unquoted identifier with a digit after a key word, such as the
type annotation ``private_key: Ed25519PrivateKey``; example tokens in documentation (they have the
shape of real ones, which is the point).
"""
from __future__ import annotations

import re
from collections.abc import Callable

REDACTION_KINDS: tuple[str, ...] = (
    "private_key",
    "jwt",
    "github_token",
    "anthropic_api_key",
    "openai_api_key",
    "stripe_key",
    "slack_token",
    "google_api_key",
    "aws_access_key_id",
    "aws_secret_access_key",
    "bearer_token",
    "generic_secret_assignment",
)

_MARKER_PREFIX = "[REDACTED:"

# Every pattern is linear: possessive quantifiers (Python >= 3.11) wherever a run can never give
# characters back, bounded repeats elsewhere, and a "not inside a longer token" check so that a long
# run of token characters is tried from its start only. Patterns open with their literal (the check is
# a lookbehind placed after it) and spell case-insensitive words as [Xx] classes instead of using
# re.IGNORECASE, so that re can skip quickly to candidate positions.


def _ci(word: str) -> str:
    """``word`` as a case-insensitive (ASCII) pattern; ``?`` stands for an optional ``_`` or ``-``."""
    return "".join(
        "[_-]?" if c == "?" else f"[{c.upper()}{c.lower()}]" if c.isalpha() else re.escape(c) for c in word
    )


_PEM_LABEL = r"(?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----"
_PRIVATE_KEY = re.compile(
    r"-----BEGIN " + _PEM_LABEL
    + r"(?:(?P<full>(?:[A-Za-z0-9+/=\s,:.]|-(?!----)|\\{1,4}[nrt])*+)-----END " + _PEM_LABEL
    + r"|(?P<trunc>(?:(?:(?:\r?\n|\\{1,4}[nr])[ \t]*+)++"
    + r"(?:[A-Za-z][A-Za-z0-9-]*+:[ \t][^\r\n\\]*+|[A-Za-z0-9+/=]++))*+))",
    re.ASCII,
)
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{16}", re.ASCII)

_JWT = re.compile(
    r"eyJ(?<![A-Za-z0-9_-]eyJ)[A-Za-z0-9_-]{5,}+\.eyJ[A-Za-z0-9_-]{5,}+\.[A-Za-z0-9_-]{10,}+", re.ASCII
)
_GITHUB = re.compile(
    r"g(?<![A-Za-z0-9_]g)(?:h[pousr]_[A-Za-z0-9]{36,}+|ithub_pat_[A-Za-z0-9_]{22,}+)", re.ASCII
)
_ANTHROPIC = re.compile(r"sk-ant-(?<![A-Za-z0-9_-]sk-ant-)[A-Za-z0-9_-]{20,}+", re.ASCII)
_OPENAI = re.compile(r"sk-(?<![A-Za-z0-9_-]sk-)(?!ant-)(?P<body>[A-Za-z0-9_-]{20,}+)", re.ASCII)
_ALNUM_RUN = re.compile(r"[A-Za-z0-9]{20,}+", re.ASCII)
_STRIPE = re.compile(r"[sr]k_(?:live|test)_(?<![A-Za-z0-9_][sr]k_(?:live|test)_)[A-Za-z0-9]{16,}+", re.ASCII)
_SLACK = re.compile(
    r"x(?<![A-Za-z0-9_-]x)(?:ox[abprs]|oxe(?:\.xox[bp])?|app)-(?P<body>[A-Za-z0-9-]{10,}+)", re.ASCII
)
_GOOGLE = re.compile(r"AIza(?<![A-Za-z0-9_-]AIza)[A-Za-z0-9_-]{35}(?![A-Za-z0-9_-])", re.ASCII)
_AWS_PREFIXES = ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA")
_AWS_KEY_ID = re.compile(
    r"A(?<![A-Za-z0-9]A)(?:" + "|".join(p[1:] for p in _AWS_PREFIXES) + r")[A-Z0-9]{16}(?![A-Za-z0-9])",
    re.ASCII,
)
_AWS_SECRET = re.compile(
    _ci("secret?access?key") + r"\\?[\"']?(?:[ \t]*+(?:=>|[=:])[ \t]*+|[ \t]++)\\?[\"']?"
    r"(?P<v>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])",
    re.ASCII,
)
_BEARER = re.compile(
    r"[Bb](?<![A-Za-z0-9_][Bb])" + _ci("earer") + r"[ \t]++(?P<v>[A-Za-z0-9._~+/=_-]{16,}+)", re.ASCII
)
_SINGLE_CASE_WORDS = re.compile(r"[a-z._~+/=-]+|[A-Z._~+/=-]+", re.ASCII)

# The key words of the generic rule ("?" = optional "_" or "-"), matched case-insensitively.
_KEY_WORDS = (
    "password", "passwd", "passphrase", "secret", "api?key", "access?token", "auth?token",
    "refresh?token", "session?token", "private?key",
)


def _key_words_pattern(words: tuple[str, ...]) -> str:
    # One leading class of initials (lets re skip to candidates), then the rest of each word.
    initials = sorted({w[0] for w in words})
    branches = []
    for initial in initials:
        rests = "|".join(_ci(w[1:]) for w in words if w[0] == initial)
        branches.append(f"(?<=[{initial.upper()}{initial}])(?:{rests})")
    return "[" + "".join(i.upper() + i for i in initials) + "](?:" + "|".join(branches) + ")"


_GENERIC = re.compile(
    _key_words_pattern(_KEY_WORDS) + r"[A-Za-z0-9_.-]{0,64}+"  # the key name, from its key word on
    r"(?:\\?[\"'])?[ \t]*+(?::=|=>|[=:])[ \t]*+"                # closing quote, separator
    r"(?:\\?\"(?P<d>[^\"\\\r\n]*+)\\?\""                        # "value" (or \"value\" inside JSON)
    r"|'(?P<s>[^'\r\n]*+)'"                                     # 'value'
    r"|(?P<u>[A-Za-z0-9+/=_.!@#%^*~-]++)(?![(\[{<$]))",        # unquoted literal, not an expression
    re.ASCII,
)
_WORDISH = re.compile(r"[A-Za-z_.-]+", re.ASCII)
_DOTTED_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+", re.ASCII)
_PATH = re.compile(r"(?:/|\./|\.\./|~/)[A-Za-z0-9_./~-]*", re.ASCII)
_WHITESPACE = re.compile(r"\s")
_PLACEHOLDER_PARTS = (
    "${", "{{", _MARKER_PREFIX.lower(), "xxxx", "****", "...", "changeme", "change_me", "change-me",
    "example", "placeholder", "redacted", "://",
)
_PLACEHOLDER_WORDS = frozenset({"none", "null", "true", "false"})


def _marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def _whole(kind: str) -> Callable[[re.Match[str]], str | None]:
    marker = _marker(kind)
    return lambda m: marker


def _value_only(m: re.Match[str], group: str, kind: str) -> str:
    start, end = m.start(group) - m.start(), m.end(group) - m.start()
    whole = m.group(0)
    return whole[:start] + _marker(kind) + whole[end:]


def _private_key(m: re.Match[str]) -> str | None:
    body = m.group("full") if m.group("full") is not None else m.group("trunc")
    return _marker("private_key") if _BASE64_RUN.search(body) else None


def _openai(m: re.Match[str]) -> str | None:
    for run in _ALNUM_RUN.findall(m.group("body")):
        if not run.isalpha() and not run.isdigit():
            return _marker("openai_api_key")
    return None


def _slack(m: re.Match[str]) -> str | None:
    return _marker("slack_token") if any(c.isdigit() for c in m.group("body")) else None


def _aws_secret(m: re.Match[str]) -> str | None:
    return _value_only(m, "v", "aws_secret_access_key")


def _bearer(m: re.Match[str]) -> str | None:
    if _SINGLE_CASE_WORDS.fullmatch(m.group("v")):
        return None
    return _value_only(m, "v", "bearer_token")


def _is_placeholder(value: str) -> bool:
    low = value.lower()
    if low.startswith(("$", "%", "{", "<", "your")) or low in _PLACEHOLDER_WORDS:
        return True
    if any(part in low for part in _PLACEHOLDER_PARTS):
        return True
    return len(set(low)) <= 2


def _generic(m: re.Match[str]) -> str | None:
    for group in ("d", "s", "u"):
        value = m.group(group)
        if value is not None:
            break
    if len(value) < 8 or _WHITESPACE.search(value) or _WORDISH.fullmatch(value):
        return None
    if group == "u" and _DOTTED_PATH.fullmatch(value):
        return None
    if _is_placeholder(value) or _PATH.fullmatch(value):
        return None
    return _value_only(m, group, "generic_secret_assignment")


# (kind, anchors: literals of which at least one occurs wherever the pattern matches, in lower case if
#  the pattern is case-insensitive (then looked for in the text's ASCII-lowered UTF-8 bytes), pattern,
#  replacement for a match or None to leave that match as it is). The anchors only skip work.
_Rule = tuple[str, tuple[str, ...], bool, re.Pattern[str], Callable[[re.Match[str]], str | None]]
_RULES: tuple[_Rule, ...] = (
    ("private_key", ("PRIVATE KEY",), False, _PRIVATE_KEY, _private_key),
    ("jwt", ("eyJ",), False, _JWT, _whole("jwt")),
    ("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"), False, _GITHUB,
     _whole("github_token")),
    ("anthropic_api_key", ("sk-ant-",), False, _ANTHROPIC, _whole("anthropic_api_key")),
    ("openai_api_key", ("sk-",), False, _OPENAI, _openai),
    ("stripe_key", ("k_live_", "k_test_"), False, _STRIPE, _whole("stripe_key")),
    ("slack_token", ("xox", "xapp-"), False, _SLACK, _slack),
    ("google_api_key", ("AIza",), False, _GOOGLE, _whole("google_api_key")),
    ("aws_access_key_id", _AWS_PREFIXES, False, _AWS_KEY_ID, _whole("aws_access_key_id")),
    ("aws_secret_access_key", ("secretaccess", "secret_access", "secret-access"), True, _AWS_SECRET,
     _aws_secret),
    ("bearer_token", ("bearer",), True, _BEARER, _bearer),
    ("generic_secret_assignment", ("pass", "secret", "api", "token", "private"), True, _GENERIC, _generic),
)
assert tuple(rule[0] for rule in _RULES) == REDACTION_KINDS
_FOLDED_ANCHORS = {kind: tuple(a.encode("ascii") for a in anchors) for kind, anchors, folded, _, _ in _RULES
                   if folded}


def redact(text: str) -> tuple[str, dict[str, int]]:
    """Return (text with every secret replaced, {kind: count} for kinds that matched, empty dict if none).

    Each secret becomes ``[REDACTED:<kind>]`` (see the module docstring for every kind's rule); all
    other characters are kept as they are. Applying it again to its own output changes nothing.
    """
    counts: dict[str, int] = {}
    lowered: bytes | None = None
    for kind, anchors, folded, pattern, replace in _RULES:
        if folded:
            if lowered is None:  # ASCII-only case folding, like the patterns; never fails
                lowered = text.encode("utf-8", "surrogatepass").lower()
            if not any(anchor in lowered for anchor in _FOLDED_ANCHORS[kind]):
                continue
        elif not any(anchor in text for anchor in anchors):
            continue
        hits = 0

        def substitute(m: re.Match[str]) -> str:
            nonlocal hits
            replacement = replace(m)
            if replacement is None:
                return m.group(0)
            hits += 1
            return replacement

        result = pattern.sub(substitute, text)
        if hits:
            counts[kind] = hits
            text = result
            lowered = None
    return text, counts
