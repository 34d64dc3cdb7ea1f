"""The one owner of what an endpoint's settings may hold, and of the redaction of what rgb writes: nothing rgb
records, logs or publishes (model.json, run.json, scores.json, logs, W&B, the site) holds a credential.

Admitted, not listed: a value typed into the settings is public by declaration, and recorded; a secret reaches a
request only from an environment variable whose *name* the settings hold.

- `model.base_url` carries no credentials (`user:password@`) and no query parameter but the known-public ones
  (PUBLIC_QUERY: `api-version`); any other is refused (`url_query_problem`), naming where it goes:
  `model.query={name: value}` (public, recorded) or `model.query_env={name: ENV_VAR}` (secret).
- Headers the same way: `model.headers` are public and recorded, secret ones only as `model.header_env={Name:
  ENV_VAR}`; a typed header (or query parameter) whose name says secret is refused as well (`declared_problems`).
- The API key is `model.api_key_env`'s variable, sent as the Authorization bearer; no typed value is replaced by it.
- A second net, which the rules above do not depend on: `redact` walks any record (dicts, lists, strings) and
  `redact_text` any text (a log line, a page), keeping of a URL's query only the public parameters' values, and
  hiding `secret_name=value` pairs and secret-named headers (a record written before these rules, a library
  logging the URL it asked with a secret of `model.query_env` in it).
"""

from __future__ import annotations

import logging
import os
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rgb.core.errors import UserError

REDACTED = "REDACTED"
# The query parameters of a base URL known to be public (Azure OpenAI's API version): the only ones it may carry.
PUBLIC_QUERY = frozenset({"api-version"})
# An environment variable's name, upper case as the convention writes one (OPENAI_API_KEY): a token typed there by
# mistake (lower case, `-`, `.`, `=`) is refused unseen instead of being recorded as a name.
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
# A header's name (an RFC 9110 token) and a query parameter's (anything printable but the URL's own delimiters).
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_QUERY_NAME = re.compile(r"^[^\s&=#?]+$")

# The words that name a key, a token or a signature: an extra refusal of typed names, and the redaction of
# `name=value` texts (the guarantee is that typed values are public, not this list).
_SECRET_WORDS = (r"(?:key|apikey|api[-_]key|token|access[-_]token|secret|password|passwd|pass|passphrase|pwd|sig|"
                 r"signature|auth|authorization|credentials?|cookie|session|jwt|bearer|sas|hmac|otp)")
# Query parameters and header names that say secret (matched whole, case-insensitive).
_SECRET_NAME = re.compile(rf"(?i)^(.*[-_.])?{_SECRET_WORDS}$")
# A URL inside a text: scheme://... up to a space, a quote or a bracket.
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")
# `name=value` of a secret name in a text that is not a URL (a query string written alone, a command line).
# (an Authorization value's scheme, `Bearer sk-...`, is redacted with its token)
_PAIR_IN_TEXT = re.compile(rf"(?i)(?<![\w-])((?:[\w.-]*[-_.])?{_SECRET_WORDS})=((?:(?:bearer|basic|token)\s+)?"
                           rf"[^&\s'\"<>,;)\]}}]+)")
# Where each kind of value goes: (public, recorded) and (secret, from the environment).
_WHERE = {"query parameter": ("model.query", "model.query_env"), "header": ("model.headers", "model.header_env")}


def secret_name(name: str) -> bool:
    """Whether a query parameter or header of this name says it carries a secret."""
    return bool(_SECRET_NAME.match(str(name).strip()))


def _declare(kind: str, name: str) -> str:
    public, secret = _WHERE[kind]
    return (f"{public}={{{name}: VALUE}} if its value is public (recorded), else {secret}={{{name}: ENV_VAR}} (a "
            f"secret: read from that environment variable when sent, only the variable's name recorded)")


def url_credentials_problem(url) -> str | None:
    """Why `url` may not be used (None: it may): credentials in its `user:password@` part."""
    try:
        parts = urlsplit(str(url))
    except ValueError:
        return None  # not a URL: the caller's own rule says what it must be
    if "@" in parts.netloc:
        return ("it holds credentials (user:password@host): put the key in the environment variable model.api_key_env "
                "names (or a header in model.header_env), never in the URL")
    return None


def url_query_problem(url) -> str | None:
    """Why the query of `url` may not be used (None: it may): a parameter other than PUBLIC_QUERY's, named with
    where it goes; its value is never shown."""
    try:
        pairs = parse_qsl(urlsplit(str(url)).query, keep_blank_values=True)
    except ValueError:
        return None
    others = [name for name, _ in pairs if name not in PUBLIC_QUERY]
    if not others:
        return None
    name = others[0]
    recorded = any(value == REDACTED for n, value in pairs if n == name)
    why = (f"its query parameter {name!r} is recorded as {REDACTED} (rgb used to send the API key in its place; it no "
           f"longer does): re-make the run with it in") if recorded else f"move {name!r} to"
    return (f"model.base_url carries no query parameter but {', '.join(sorted(PUBLIC_QUERY))} (public); {why} "
            f"{_declare('query parameter', name)}"
            + (f"; likewise {', '.join(repr(other) for other in others[1:])}" if len(others) > 1 else ""))


def declared_problems(kind: str, public: dict, secret: dict) -> list[str]:
    """Why the `public` (typed, recorded) and `secret` ({name: environment variable}) values of a `kind` ("query
    parameter" or "header") may not be used: a bad name, a typed one whose name says secret, a value of `secret`
    that is not a variable's name, a name in both. Values are never shown (a typed secret is refused unseen)."""
    where, from_env = _WHERE[kind]
    valid = _HEADER_NAME if kind == "header" else _QUERY_NAME
    found = []
    for name in (*public, *secret):
        if not valid.match(str(name)):
            found.append(f"{name!r} is not a valid {kind} name")
    for name, value in public.items():
        if secret_name(name) or value == REDACTED:
            recorded = " is recorded as REDACTED (rgb used to send the API key in its place; it no longer does)" \
                if value == REDACTED else " names a secret, and typed values are recorded"
            found.append(f"{where} {name!r}{recorded}: give it as {from_env}={{{name}: ENV_VAR}} (read from that "
                         f"environment variable when sent, only the variable's name recorded)")
    for name, variable in secret.items():
        if not (isinstance(variable, str) and _ENV_NAME.match(variable)):
            found.append(f"{from_env} {name!r} must name an environment variable (upper-case letters, digits, _), "
                         f"not hold a value")
        if name in public:
            found.append(f"{name!r} is in both {where} and {from_env}: keep one")
    if kind == "header" and any(str(n).lower() == "authorization" for n in secret):
        found.append(f"{from_env} 'Authorization': the API key's variable is model.api_key_env (sent as the bearer)")
    return found


class MissingSecretError(UserError, ValueError):
    """A secret declared by its environment variable's name, with that variable unset or empty when it is sent."""


def from_environment(secret: dict, kind: str) -> dict:
    """{name: value} of `secret` ({name: environment variable}), each read now and never stored;
    MissingSecretError naming the variable when one is unset or empty."""
    values = {}
    for name, variable in secret.items():
        value = os.environ.get(variable)
        if not value:
            raise MissingSecretError(f"the {kind} {name!r} is read from the environment variable {variable}, which "
                                     f"is not set: export {variable}=...")
        values[name] = value
    return values


def redact_url(url: str) -> str:
    """`url` with its userinfo and the values of its query parameters but the public ones (PUBLIC_QUERY) replaced
    by REDACTED: a query is admitted, not searched for secret names."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    netloc = parts.netloc
    if "@" in netloc:
        netloc = f"{REDACTED}@{netloc.rpartition('@')[2]}"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(k not in PUBLIC_QUERY for k, _ in pairs):
            query = urlencode([(k, v if k in PUBLIC_QUERY else REDACTED) for k, v in pairs], safe=REDACTED)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact_headers(headers: dict) -> dict:
    """The headers with the values of the secret ones replaced by REDACTED."""
    return {k: REDACTED if secret_name(k) else v for k, v in headers.items()}


def redact_text(text: str) -> str:
    """`text` with every URL in it redacted, and every `secret_name=value` pair outside a URL."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), str(text))
    return _PAIR_IN_TEXT.sub(lambda m: f"{m.group(1)}={REDACTED}", text)


def redact(value):
    """A record (dicts, lists, strings, numbers) with every secret in it redacted: URLs and pairs in strings, and
    the values of secret-named keys of any `headers` mapping (also under a dotted key: `model.headers`)."""
    if isinstance(value, dict):
        return {k: redact_headers(redact(v)) if str(k).rpartition(".")[2] == "headers" and isinstance(v, dict)
                else redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    if isinstance(value, str):
        return redact_text(value)
    return value


class RedactingFilter(logging.Filter):
    """A log filter that redacts each record's text (a library logging the URL it asked, with its query)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_text(record.getMessage()), ()
        if record.exc_info:  # a traceback quotes the request's URL too: formatted here, redacted, kept as text
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True


def redact_logs(*names: str) -> None:
    """Redact every record of these loggers (each once); a logger's filter sees only its own records, so name the
    logger that logs, not a parent."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())


__all__ = ["PUBLIC_QUERY", "REDACTED", "MissingSecretError", "RedactingFilter", "declared_problems", "from_environment",
           "redact", "redact_headers", "redact_logs", "redact_text", "redact_url", "secret_name",
           "url_credentials_problem", "url_query_problem"]
