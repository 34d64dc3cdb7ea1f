"""The one owner of what counts as a secret in an endpoint's settings, and of its redaction: nothing rgb records,
logs or publishes (model.json, run.json, scores.json, logs, W&B, the site) holds a credential.

- A URL may not carry credentials as `user:password@host` (refused: `url_credentials_problem`).
- A query parameter that carries a key (`key=`, `api_key=`, `token=`, `access_token=`, `sig=`, ...) is allowed,
  and recorded with its value as REDACTED; so is the value of a header whose name says secret (`Authorization`,
  `api-key`, `X-Auth-Token`, ...). A redacted value is the API key: a request fills it back from the environment
  variable `model.api_key_env` names (`fill_secrets`), as it does the Authorization header.
- `redact` walks any record (dicts, lists, strings) and `redact_text` any text (a log line, a page, a file),
  so a record written before this rule (scores.json, model.json) is cleaned when it is shown again.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from rgb.core.errors import UserError

REDACTED = "REDACTED"

# The words that name a key, a token or a signature: one list for query parameters, headers and `name=value` texts.
_SECRET_WORDS = (r"(?:key|apikey|api[-_]key|token|access[-_]token|secret|password|passwd|pwd|sig|signature|auth|"
                 r"authorization|credentials?|cookie|session)")
# Query parameters and header names that carry a secret (matched whole, case-insensitive).
_SECRET_NAME = re.compile(rf"(?i)^(.*[-_.])?{_SECRET_WORDS}$")
# A URL inside a text: scheme://... up to a space, a quote or a bracket.
_URL_IN_TEXT = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s'\"<>()\[\]{}]+")
# `name=value` of a secret name in a text that is not a URL (a query string written alone, a command line).
# (an Authorization value's scheme, `Bearer sk-...`, is redacted with its token)
_PAIR_IN_TEXT = re.compile(rf"(?i)(?<![\w-])((?:[\w.-]*[-_.])?{_SECRET_WORDS})=((?:(?:bearer|basic|token)\s+)?"
                           rf"[^&\s'\"<>,;)\]}}]+)")


def secret_name(name: str) -> bool:
    """Whether a query parameter or header of this name carries a secret."""
    return bool(_SECRET_NAME.match(str(name).strip()))


def url_credentials_problem(url) -> str | None:
    """Why `url` may not be used (None: it may): credentials in its `user:password@` part."""
    try:
        parts = urlsplit(str(url))
    except ValueError:
        return None  # not a URL: the caller's own rule says what it must be
    if "@" in parts.netloc:
        return ("it holds credentials (user:password@host): put the key in the environment variable model.api_key_env "
                "names (or a header in model.headers), never in the URL")
    return None


def redact_url(url: str) -> str:
    """`url` with its userinfo and the values of its secret query parameters replaced by REDACTED."""
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
        if any(secret_name(k) for k, _ in pairs):
            query = urlencode([(k, REDACTED if secret_name(k) else v) for k, v in pairs], safe=REDACTED)
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


class MissingSecretError(UserError, ValueError):
    """A recorded REDACTED value with no key in the environment to fill it."""


def fill_secrets(url: str, headers: dict, key: str | None) -> tuple[str, dict, dict]:
    """(url without its query, query parameters, headers) to send, each REDACTED value (a secret query parameter,
    a secret header) filled with `key`, the API key from the environment. The query apart, as the SDK takes it
    (`default_query`: it appends paths to the base URL). MissingSecretError when a value is REDACTED and there is no key."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    if REDACTED in (*query.values(), *headers.values()) and not key:
        raise MissingSecretError("a secret query parameter or header of the endpoint is recorded as REDACTED; its value is "
                         "read from the API key's environment variable, which is not set")
    filled = {k: key if v == REDACTED else v for k, v in query.items()}
    return (urlunsplit((parts.scheme, parts.netloc, parts.path, "", parts.fragment)), filled,
            {k: key if v == REDACTED else v for k, v in headers.items()})


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


__all__ = ["RedactingFilter", "REDACTED", "fill_secrets", "redact", "redact_headers", "redact_logs", "redact_text", "redact_url", "secret_name",
           "url_credentials_problem"]
