"""Secret redaction of imported transcripts (protocol.redact): every kind, the negatives, linear time.

All secrets here are fake and built at runtime from short repeated pieces, so that no literal in this
file looks like a live credential to a secret scanner.
"""
from __future__ import annotations

import base64
import json
import random
import re
import time

import pytest

from protocol.redact import REDACTION_KINDS, redact

pytestmark = pytest.mark.timeout(120)

MiB = 1024 * 1024


def R(kind: str) -> str:
    return f"[REDACTED:{kind}]"


def b64url(obj) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


# --- fake secrets --------------------------------------------------------------------------------

B64_LINE = ("MIIEowIBAAKCAQEAq7Vd" + "x9Kf3Lm0Qp+Zt/Wn" * 3)[:64]
PEM_BODY_LINES = [B64_LINE, B64_LINE[::-1], ("Zm9v" * 16)[:64], "q2Lk9/Ty+Xw="]


def pem(label: str = "RSA ", sep: str = "\n", headers: tuple[str, ...] = (), block: str = "") -> str:
    lines = [f"-----BEGIN {label}PRIVATE KEY{block}-----", *headers, *PEM_BODY_LINES,
             f"-----END {label}PRIVATE KEY{block}-----"]
    return sep.join(lines)


JWT = ".".join([
    b64url({"alg": "HS256", "typ": "JWT"}),
    b64url({"sub": "user-42", "iat": 1700000000, "scope": "repo"}),
    "s1Gn4tUr3-x" * 4,
])
GH_PAT_CLASSIC = "ghp_" + "Ab1" * 12
GH_OAUTH = "gho_" + "Zy9x" * 10
GH_SERVER = "ghs_" + "Qw3" * 12
GH_FINE = "github_pat_" + "11ABCDEFG0" + "Ab12" * 3 + "_" + "cD34" * 14 + "efg"
ANTHROPIC = "sk-ant-api03-" + "Xy9_Kp2-Lm" * 9 + "AA"
ANTHROPIC_ADMIN = "sk-ant-admin01-" + "Qa7Ws3Ed" * 4
OPENAI_LEGACY = "sk-" + "Ab3De6Gh9J" * 4 + "Kl2Mn5Op"
OPENAI_PROJ = "sk-proj-" + "Qw3_Er5-Ty7Ui9Op1As3Df5Gh7Jk9Lz1Xc3Vb5Nm7" * 2
STRIPE_LIVE = "sk_live_" + "51Hx" + "Ab3Cd5Ef7Gh9" * 2
STRIPE_RESTRICTED = "rk_live_" + "Zz8Yy7Xx6" * 3
STRIPE_TEST = "sk_test_" + "Tt4Ss3Rr2Qq1" * 2
SLACK_BOT = "xoxb-" + "1234567890-1234567890123-" + "AbCdEfGhIjKlMnOpQrStUvWx"
SLACK_APP = "xapp-1-A0123456789-1234567890123-" + "ab12" * 16
GOOGLE = "AIza" + "Sy" + "Ab3_Cd5-Ef7" * 3
AWS_ID = "AKIA" + "Z7Q3" * 4
AWS_STS_ID = "ASIA" + "K2M9" * 4
AWS_SECRET = ("Ab3/Cd5+Ef7" * 4)[:40]
BEARER = "Ab3dEf6hIj9kLm2nOp5q"
BEARER_DOTTED = "mF_9.B5f-4.1JqM" + "xY7z~+/A=="


# --- positives, one table: (id, text, expected text, expected counts) --------------------------------

POSITIVES = [
    # private_key
    ("pem-rsa-shell", "$ cat ~/.ssh/id_rsa\n" + pem() + "\n$ ls\n",
     f"$ cat ~/.ssh/id_rsa\n{R('private_key')}\n$ ls\n", {"private_key": 1}),
    ("pem-openssh-crlf", "key:\r\n" + pem("OPENSSH ", sep="\r\n") + "\r\nend",
     f"key:\r\n{R('private_key')}\r\nend", {"private_key": 1}),
    ("pem-pkcs8-json-escaped",
     '{"type": "service_account", "private_key_id": "abc", "private_key": "' + pem("", sep="\\n")
     + '\\n", "client_email": "svc@proj.iam.gserviceaccount.com"}',
     '{"type": "service_account", "private_key_id": "abc", "private_key": "' + R("private_key")
     + '\\n", "client_email": "svc@proj.iam.gserviceaccount.com"}', {"private_key": 1}),
    ("pem-encrypted-pkcs1-headers",
     pem("RSA ", headers=("Proc-Type: 4,ENCRYPTED", "DEK-Info: AES-128-CBC,8A4C0F1E2D3B4A5968776655443322AA", "")),
     R("private_key"), {"private_key": 1}),
    ("pem-ec-and-encrypted-yaml",
     "tls:\n  key: |\n    " + pem("EC ", sep="\n    ") + "\n  pass: |\n    " + pem("ENCRYPTED ", sep="\n    ")
     + "\nnext: 1\n",
     f"tls:\n  key: |\n    {R('private_key')}\n  pass: |\n    {R('private_key')}\nnext: 1\n",
     {"private_key": 2}),
    ("pem-pgp-block",
     pem("PGP ", block=" BLOCK", headers=("Version: GnuPG v2", "Comment: https://gnupg.org", "")).replace(
         "q2Lk9/Ty+Xw=", "q2Lk9/Ty+Xw=\n=nYxK") + "\nthat was the key",
     R("private_key") + "\nthat was the key", {"private_key": 1}),
    ("pem-dsa-one-line", "KEY=-----BEGIN DSA PRIVATE KEY----- " + " ".join(PEM_BODY_LINES)
     + " -----END DSA PRIVATE KEY----- rest",
     f"KEY={R('private_key')} rest", {"private_key": 1}),
    ("pem-truncated-then-prose",
     "$ head -c 300 key.pem\n-----BEGIN RSA PRIVATE KEY-----\n" + "\n".join(PEM_BODY_LINES[:3])
     + "\n\n... (output truncated)\n",
     f"$ head -c 300 key.pem\n{R('private_key')}\n\n... (output truncated)\n", {"private_key": 1}),
    ("pem-truncated-at-end-of-text", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + B64_LINE + "\n" + B64_LINE[:20],
     R("private_key"), {"private_key": 1}),
    # jwt
    ("jwt-json-log", '{"level":"info","msg":"login","id_token":"' + JWT + '","user":42}',
     '{"level":"info","msg":"login","id_token":"' + R("jwt") + '","user":42}', {"jwt": 1}),
    ("jwt-in-bearer-header-counts-as-jwt",
     f"curl -H 'Authorization: Bearer {JWT}' https://api.example.com/v1/me",
     f"curl -H 'Authorization: Bearer {R('jwt')}' https://api.example.com/v1/me", {"jwt": 1}),
    ("jwt-cookie", f"Set-Cookie: session={JWT}; Path=/; HttpOnly",
     f"Set-Cookie: session={R('jwt')}; Path=/; HttpOnly", {"jwt": 1}),
    # github_token
    ("github-export", f"export GITHUB_TOKEN={GH_PAT_CLASSIC}\ngh pr list",
     f"export GITHUB_TOKEN={R('github_token')}\ngh pr list", {"github_token": 1}),
    ("github-remote-url-and-oauth",
     f"git remote set-url origin https://x-access-token:{GH_SERVER}@github.com/o/r.git # {GH_OAUTH}",
     f"git remote set-url origin https://x-access-token:{R('github_token')}@github.com/o/r.git # "
     f"{R('github_token')}", {"github_token": 2}),
    ("github-fine-grained-env", f"GH_TOKEN={GH_FINE}\nGH_HOST=github.com\n",
     f"GH_TOKEN={R('github_token')}\nGH_HOST=github.com\n", {"github_token": 1}),
    # anthropic_api_key
    ("anthropic-dotenv", f"ANTHROPIC_API_KEY={ANTHROPIC}\nMODEL=claude-sonnet\n",
     f"ANTHROPIC_API_KEY={R('anthropic_api_key')}\nMODEL=claude-sonnet\n", {"anthropic_api_key": 1}),
    ("anthropic-curl-header",
     f'curl https://api.anthropic.com/v1/messages -H "x-api-key: {ANTHROPIC_ADMIN}" -H "anthropic-version: 2023-06-01"',
     f'curl https://api.anthropic.com/v1/messages -H "x-api-key: {R("anthropic_api_key")}" '
     '-H "anthropic-version: 2023-06-01"', {"anthropic_api_key": 1}),
    # openai_api_key
    ("openai-python-kwarg", f'client = OpenAI(api_key="{OPENAI_LEGACY}")',
     f'client = OpenAI(api_key="{R("openai_api_key")}")', {"openai_api_key": 1}),
    ("openai-project-key-export", f"export OPENAI_API_KEY='{OPENAI_PROJ}'",
     f"export OPENAI_API_KEY='{R('openai_api_key')}'", {"openai_api_key": 1}),
    # stripe_key
    ("stripe-python", f'stripe.api_key = "{STRIPE_LIVE}"\nstripe.Charge.create(amount=100)',
     f'stripe.api_key = "{R("stripe_key")}"\nstripe.Charge.create(amount=100)', {"stripe_key": 1}),
    ("stripe-curl-basic-user", f"curl https://api.stripe.com/v1/charges -u {STRIPE_TEST}: -d amount=2000",
     f"curl https://api.stripe.com/v1/charges -u {R('stripe_key')}: -d amount=2000", {"stripe_key": 1}),
    ("stripe-restricted-yaml", f"stripe:\n  restricted: {STRIPE_RESTRICTED}\n",
     f"stripe:\n  restricted: {R('stripe_key')}\n", {"stripe_key": 1}),
    # slack_token
    ("slack-log-line", f"2024-05-01T10:00:00Z DEBUG slack client init token={SLACK_BOT} team=T123",
     f"2024-05-01T10:00:00Z DEBUG slack client init token={R('slack_token')} team=T123", {"slack_token": 1}),
    ("slack-app-json", f'{{"app_token": "{SLACK_APP}", "socket_mode": true}}',
     f'{{"app_token": "{R("slack_token")}", "socket_mode": true}}', {"slack_token": 1}),
    # google_api_key
    ("google-url-query", f"GET https://maps.googleapis.com/maps/api/geocode/json?address=Tokyo&key={GOOGLE} 200",
     f"GET https://maps.googleapis.com/maps/api/geocode/json?address=Tokyo&key={R('google_api_key')} 200",
     {"google_api_key": 1}),
    ("google-js-config", f'const firebaseConfig = {{ apiKey: "{GOOGLE}", projectId: "demo" }};',
     f'const firebaseConfig = {{ apiKey: "{R("google_api_key")}", projectId: "demo" }};', {"google_api_key": 1}),
    # aws_access_key_id + aws_secret_access_key
    ("aws-credentials-file",
     f"[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\nregion = us-east-1\n",
     f"[default]\naws_access_key_id = {R('aws_access_key_id')}\naws_secret_access_key = "
     f"{R('aws_secret_access_key')}\nregion = us-east-1\n",
     {"aws_access_key_id": 1, "aws_secret_access_key": 1}),
    ("aws-sts-json",
     f'{{"Credentials": {{"AccessKeyId": "{AWS_STS_ID}", "SecretAccessKey": "{AWS_SECRET}", "Expiration": "x"}}}}',
     f'{{"Credentials": {{"AccessKeyId": "{R("aws_access_key_id")}", "SecretAccessKey": '
     f'"{R("aws_secret_access_key")}", "Expiration": "x"}}}}',
     {"aws_access_key_id": 1, "aws_secret_access_key": 1}),
    ("aws-export-and-cli",
     f"export AWS_SECRET_ACCESS_KEY={AWS_SECRET}\naws configure set aws_secret_access_key {AWS_SECRET[::-1]}",
     f"export AWS_SECRET_ACCESS_KEY={R('aws_secret_access_key')}\naws configure set aws_secret_access_key "
     f"{R('aws_secret_access_key')}", {"aws_secret_access_key": 2}),
    # bearer_token
    ("bearer-curl", f'curl -s -H "Authorization: Bearer {BEARER}" https://api.example.com/items',
     f'curl -s -H "Authorization: Bearer {R("bearer_token")}" https://api.example.com/items', {"bearer_token": 1}),
    ("bearer-lowercase-http-log", f"> GET /v2 HTTP/1.1\n> authorization: bearer {BEARER_DOTTED}\n> accept: */*",
     f"> GET /v2 HTTP/1.1\n> authorization: bearer {R('bearer_token')}\n> accept: */*", {"bearer_token": 1}),
    ("bearer-python-headers", f"headers = {{'Authorization': 'Bearer {BEARER[::-1]}'}}",
     f"headers = {{'Authorization': 'Bearer {R('bearer_token')}'}}", {"bearer_token": 1}),
    # generic_secret_assignment
    ("generic-dotenv", "DB_HOST=localhost\nDB_PASSWORD=Hunter22!x\nDEBUG=1\n",
     f"DB_HOST=localhost\nDB_PASSWORD={R('generic_secret_assignment')}\nDEBUG=1\n",
     {"generic_secret_assignment": 1}),
    ("generic-export-quoted", "export CLIENT_SECRET='q8Z!w2#e4R'\n",
     f"export CLIENT_SECRET='{R('generic_secret_assignment')}'\n", {"generic_secret_assignment": 1}),
    ("generic-yaml", "database:\n  user: app\n  password: s3cr3t-Pa55\n  port: 5432\n",
     f"database:\n  user: app\n  password: {R('generic_secret_assignment')}\n  port: 5432\n",
     {"generic_secret_assignment": 1}),
    ("generic-json", '{"username": "bob", "api_key": "9f8e7d6c5b4a3f2e1d0c", "retries": 3}',
     f'{{"username": "bob", "api_key": "{R("generic_secret_assignment")}", "retries": 3}}',
     {"generic_secret_assignment": 1}),
    ("generic-python-dict", "cfg = {'access_token': 'ya29.a0AfH6SMBx', 'auth_token': \"t0k3n_v4lue\"}",
     f"cfg = {{'access_token': '{R('generic_secret_assignment')}', "
     f"'auth_token': \"{R('generic_secret_assignment')}\"}}",
     {"generic_secret_assignment": 2}),
    ("generic-log-and-cli-flag",
     "2024-05-01 WARN retry login user=bob password=pa55w0rd,attempt=2\n$ mysql --password=Zx9!Zx9!Zx9 db\n",
     f"2024-05-01 WARN retry login user=bob password={R('generic_secret_assignment')},attempt=2\n"
     f"$ mysql --password={R('generic_secret_assignment')} db\n", {"generic_secret_assignment": 2}),
    ("generic-json-escaped-in-tool-output",
     '{"output": "{\\"apiKey\\": \\"a1b2c3d4e5f6\\", \\"ok\\": true}"}',
     '{"output": "{\\"apiKey\\": \\"' + R("generic_secret_assignment") + '\\", \\"ok\\": true}"}',
     {"generic_secret_assignment": 1}),
    ("generic-go-and-toml", 'apiSecret := "Mx7#kQ2$vL9p"\n[auth]\nsecret_key = "django-insecure-8f!k2"\n',
     f'apiSecret := "{R("generic_secret_assignment")}"\n[auth]\nsecret_key = "{R("generic_secret_assignment")}"\n',
     {"generic_secret_assignment": 2}),
]


@pytest.mark.parametrize("text,expected,counts", [p[1:] for p in POSITIVES], ids=[p[0] for p in POSITIVES])
def test_positive(text, expected, counts):
    out, got = redact(text)
    assert out == expected
    assert got == counts
    assert redact(out) == (out, {}), "redacting twice must change nothing more"


def test_marker_shape_and_value_only_context_kept():
    out, counts = redact(f"Authorization: Bearer {BEARER}")
    assert out == "Authorization: Bearer [REDACTED:bearer_token]"
    assert counts == {"bearer_token": 1}
    out, _ = redact(f'password = "{"Zq1!" * 3}"  # do not commit')
    assert out == 'password = "[REDACTED:generic_secret_assignment]"  # do not commit'


# --- negatives ---------------------------------------------------------------------------------------

PUBLIC_PEM = ("-----BEGIN PUBLIC KEY-----\n" + "\n".join(PEM_BODY_LINES) + "\n-----END PUBLIC KEY-----\n"
              "-----BEGIN CERTIFICATE-----\n" + "\n".join(PEM_BODY_LINES) + "\n-----END CERTIFICATE-----\n"
              "-----BEGIN RSA PUBLIC KEY-----\n" + B64_LINE + "\n-----END RSA PUBLIC KEY-----\n"
              "-----BEGIN OPENSSH PRIVATE KEY-----\n...\n-----END OPENSSH PRIVATE KEY-----\n")

NEGATIVES = [
    ("prose", "The bearer of this letter keeps a secret: never share your password with anyone. "
              "Use a password manager and rotate API keys and access tokens regularly."),
    ("prose-bearer-placeholder",
     "Send the header as Bearer YOUR_ACCESS_TOKEN_HERE, the Bearer authentication-required scheme."),
    ("identifiers", "token_count = len(tokens)\npassword_field = form.fields[\"password\"]\nvalue = get_secret()\n"
                    "secret_key = get_secret_key(name)\napi_key = os.environ[\"API_KEY\"]\n"
                    "password = request.POST.get('password')\nif password == confirm_password: pass\n"),
    ("identifier-values", "password=password\nsecret = secrets.token_hex(32)\napi_key=settings.API_KEY_V2\n"
                          "self.access_token = access_token\npasswordless_login = True\n"
                          "api_key_env = \"OPENAI_API_KEY\"\npassword: str = field(default=None)\n"),
    ("uuid-and-sha", "request 3f2504e0-4f89-11d3-9a0c-0305e82c3301 at commit 9fceb02d0ae598e95dc970b74767f19372d61af8 "
                     "(tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904) "
                     "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    ("base64-non-secret", 'PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJ'
                          'RU5ErkJggg=="\n'
                          'hello = base64.b64decode("SGVsbG8sIFdvcmxkIQ==")\n'
                          'header = "eyJhbGciOiJIUzI1NiJ9"  # just a JWT header\n'),
    ("sk-words", "pip install scikit-learn  # sk-learn, task-123, disk-usage-report-2024-01-15, risk-assessment-v2\n"
                 "mask-rcnn-resnet50-fpn-coco-2020 sk-learn-compatible-estimator-v2 sk-1234\n"),
    ("short-or-embedded-prefixes", "ghp_short gho_ AKIA123 xAKIA" + "Z7Q3" * 4 + " AKIA" + "Z7Q3" * 5
                                   + " xoxb-your-token-here xapp-placeholder-value sk_live_short AIzaShort"),
    ("public-pem-and-certificate", PUBLIC_PEM),
    ("pem-parsing-code", 'BEGIN = "-----BEGIN RSA PRIVATE KEY-----"\nEND = "-----END RSA PRIVATE KEY-----"\n'
                         "if line.startswith(BEGIN):\n    in_key = True\n"
                         "The file starts with -----BEGIN PRIVATE KEY----- and ends with -----END PRIVATE KEY-----.\n"),
    ("placeholders", "API_KEY=${API_KEY}\npassword: <your password>\nSECRET=changeme\nDB_PASSWORD=$DB_PASSWORD\n"
                     "client_secret: \"{{ vault_client_secret }}\"\nAPI_KEY=your_api_key_here\n"
                     "password=********\nSECRET_KEY=xxxxxxxxxxxxxxxx\nauth_token: null\n\"api_key\": None\n"
                     "password: \"<password>\"\nAPI_SECRET=example-secret-123\nSECRET_FILE=/run/secrets/db_password\n"
                     "secret_url = \"https://vault.internal/v1/kv\"\npassword=%DB_PASSWORD%\n"
                     "passphrase: \"correct horse battery staple\"\n"),
    ("bearer-placeholders", "curl -H 'Authorization: Bearer $TOKEN' -H \"Authorization: Bearer ${API_TOKEN}\"\n"
                            "headers = {\"Authorization\": f\"Bearer {token}\"}\nAuthorization: Bearer <token>\n"),
    ("kubernetes-and-actions", "kind: Secret\nmetadata:\n  name: db\nsecretName: my-tls-secret\n"
                               "password: ${{ secrets.DOCKER_PASSWORD }}\nsecrets: inherit\n"),
    ("already-redacted", "KEY=[REDACTED:openai_api_key] password=\"[REDACTED:generic_secret_assignment]\" "
                         "Authorization: Bearer [REDACTED:bearer_token]\n[REDACTED:private_key]\n"
                         "aws_secret_access_key = [REDACTED:aws_secret_access_key]"),
    ("japanese", "秘密の鍵はありません。パスワードを設定してください。トークン数は 1234 です。"),
    ("empty", ""),
]


@pytest.mark.parametrize("text", [n[1] for n in NEGATIVES], ids=[n[0] for n in NEGATIVES])
def test_negative_untouched(text):
    out, counts = redact(text)
    assert out == text
    assert counts == {}


def test_unchanged_text_is_returned_as_is():
    text = "nothing to see here " * 1000
    out, counts = redact(text)
    assert out is text and counts == {}


def test_japanese_around_secrets_keeps_its_characters():
    text = f"本番のトークンは{GH_PAT_CLASSIC}です。password=Hunter22!です。鍵:\n{pem()}\n以上。"
    out, counts = redact(text)
    assert out == (f"本番のトークンは{R('github_token')}です。password={R('generic_secret_assignment')}です。"
                   f"鍵:\n{R('private_key')}\n以上。")
    assert counts == {"private_key": 1, "github_token": 1, "generic_secret_assignment": 1}
    assert redact(out) == (out, {})


def test_multiple_kinds_in_one_text_counts_summed_per_kind():
    text = (
        "# .env\n"
        f"OPENAI_API_KEY={OPENAI_LEGACY}\n"
        f"ANTHROPIC_API_KEY={ANTHROPIC}\n"
        f"GITHUB_TOKEN={GH_PAT_CLASSIC}\n"
        f"GH_TOKEN_2={GH_FINE}\n"
        f"AWS_ACCESS_KEY_ID={AWS_ID}\n"
        f"AWS_SECRET_ACCESS_KEY={AWS_SECRET}\n"
        "DB_PASSWORD=Hunter22!x\n"
        "REDIS_PASSWORD='r3d!s-Pa55'\n"
        f"$ curl -H 'Authorization: Bearer {BEARER}' -H 'X-Session: {JWT}' https://h/\n"
        f"{pem('EC ')}\n"
    )
    out, counts = redact(text)
    assert counts == {
        "private_key": 1, "jwt": 1, "github_token": 2, "anthropic_api_key": 1, "openai_api_key": 1,
        "aws_access_key_id": 1, "aws_secret_access_key": 1, "bearer_token": 1, "generic_secret_assignment": 2,
    }
    assert list(counts) == [k for k in REDACTION_KINDS if k in counts], "counts follow the order of the kinds"
    for secret in (OPENAI_LEGACY, ANTHROPIC, GH_PAT_CLASSIC, GH_FINE, AWS_ID, AWS_SECRET, "Hunter22!x",
                   "r3d!s-Pa55", BEARER, JWT, B64_LINE):
        assert secret not in out
    assert out.count("[REDACTED:") == sum(counts.values())
    assert out.startswith("# .env\nOPENAI_API_KEY=[REDACTED:openai_api_key]\n")
    assert redact(out) == (out, {})


def test_redaction_kinds_are_exactly_the_kinds_produced():
    produced = set()
    for _, text, _, counts in POSITIVES:
        produced |= set(redact(text)[1])
    assert produced == set(REDACTION_KINDS)
    assert len(REDACTION_KINDS) == len(set(REDACTION_KINDS))
    assert all(re.fullmatch(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*", k) for k in REDACTION_KINDS)
    # the specific shapes run before the generic rule, private keys first
    assert REDACTION_KINDS[0] == "private_key"
    assert REDACTION_KINDS[-1] == "generic_secret_assignment"


def test_idempotent_on_random_mixtures():
    """Secrets, negatives and separators glued at random: a second pass never finds anything more."""
    fragments = [p[1] for p in POSITIVES] + [n[1] for n in NEGATIVES] + [
        GH_PAT_CLASSIC, JWT, AWS_SECRET, BEARER, B64_LINE, "password=", "Bearer ", '"api_key": ',
        "-----BEGIN RSA PRIVATE KEY-----\n", "\n-----END RSA PRIVATE KEY-----", "\\n", " ", "\n", "'", '"',
        "=", ":", "日本",
    ]
    rng = random.Random(20240501)
    for _ in range(3000):
        text = "".join(rng.choice(fragments) for _ in range(rng.randint(1, 6)))
        out, counts = redact(text)
        assert redact(out) == (out, {}), text
        assert out.count("[REDACTED:") - text.count("[REDACTED:") == sum(counts.values()), text


def test_lone_surrogates_and_control_characters_do_not_break_it():
    text = "\ud800 x\x00 DB_PASSWORD=Hunter22!x \udfff"
    assert redact(text) == (f"\ud800 x\x00 DB_PASSWORD={R('generic_secret_assignment')} \udfff",
                            {"generic_secret_assignment": 1})


# --- linear time -------------------------------------------------------------------------------------

def fill(unit: str, size: int = MiB) -> str:
    return unit * (size // len(unit))


ADVERSARIAL = {
    "a": "a" * MiB,
    "A": "A" * MiB,
    "equals": "=" * MiB,
    "dashes": "-" * MiB,
    "begin": fill("-----BEGIN "),
    "begin-private-repeated": fill("-----BEGIN RSA PRIVATE KEY-----\n"),
    "begin-no-end-one-line": "-----BEGIN PRIVATE KEY-----\n" + "A" * MiB,
    "begin-no-end-lines": "-----BEGIN PRIVATE KEY-----" + fill("\n" + B64_LINE),
    "begin-prose-no-end": "-----BEGIN PRIVATE KEY-----\n" + fill("a b, c. - "),
    "begin-escaped-newlines": "-----BEGIN PRIVATE KEY-----" + fill("\\n"),
    "begin-headers": "-----BEGIN PRIVATE KEY-----" + fill("\nProc-Type: x"),
    "eyJ": fill("eyJ"),
    "eyJ-long-segment": "eyJ" + "a" * MiB + ".",
    "eyJ-dots": fill("eyJabcdef."),
    "eyJ-two-segments": fill("eyJabcdef.eyJabcdef."),
    "bearer": fill("Bearer "),
    "bearer-long": "bearer " + "a" * MiB,
    "bearer-spaces": "Bearer" + " " * MiB,
    "sk": fill("sk-"),
    "sk-hyphens": fill("sk-a-"),
    "sk-ant": fill("sk-ant-"),
    "ghp": fill("ghp_"),
    "github_pat": fill("github_pat_"),
    "xoxb": fill("xoxb-"),
    "AIza": fill("AIza"),
    "AKIA": fill("AKIA"),
    "password": fill("password"),
    "password=": fill("password="),
    "password-spaces": "password: " + " " * MiB,
    "password-open-quote": 'password="' + "a" * MiB,
    "password-quotes": fill('password="a'),
    "secret_access_key=": fill("secret_access_key="),
    "secret_access_key-spaces": "secret_access_key" + " " * MiB,
    "api_key-long-name": "api_key" + "_" * MiB + "=x",
    "access_token:": fill("access_token:"),
}


@pytest.mark.parametrize("text", list(ADVERSARIAL.values()), ids=list(ADVERSARIAL))
def test_adversarial_input_is_linear(text):
    start = time.perf_counter()
    out, counts = redact(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, f"{elapsed:.2f} s: a pattern backtracks"
    assert isinstance(out, str) and isinstance(counts, dict)


def _plausible_mib(rng: random.Random) -> tuple[str, int]:
    pieces = [
        "def handle(request):\n    token_count = len(request.tokens)\n    return Response(status=200)\n",
        "2024-05-01T10:00:00.123Z INFO  server: GET /api/v1/items?page=2 200 12ms user=42\n",
        "The quick brown fox jumps over the lazy dog; the secret is good tests and small commits.\n",
        '{"id": "3f2504e0-4f89-11d3-9a0c-0305e82c3301", "sha": "9fceb02d0ae598e95dc970b74767f19372d61af8"}\n',
        "export PATH=$HOME/.local/bin:$PATH\npassword_field = form.fields[\"password\"]\n",
        "日本語のテキストも含まれます。パスワードは教えません。\n",
        "    return base64.b64encode(data).decode('ascii')  # SGVsbG8sIFdvcmxkIQ==\n",
    ]
    out, size, secrets = [], 0, 0
    while size < MiB:
        if rng.random() < 0.002:
            piece = f"export GITHUB_TOKEN={GH_PAT_CLASSIC}\n"
            secrets += 1
        else:
            piece = rng.choice(pieces)
        out.append(piece)
        size += len(piece)
    return "".join(out), secrets


def test_plausible_mib_benchmark():
    text, secrets = _plausible_mib(random.Random(7))
    start = time.perf_counter()
    out, counts = redact(text)
    elapsed = time.perf_counter() - start
    print(f"\nredact: {len(text) / MiB:.2f} MiB of plausible text with {secrets} secrets in {elapsed * 1000:.0f} ms")
    assert counts == ({"github_token": secrets} if secrets else {})
    assert GH_PAT_CLASSIC not in out
