"""rgb.core.secrets: one list of secret names for URLs, headers and `name=value` texts, and log records whose
traceback quotes a secret URL."""

import io
import logging

from rgb.core.secrets import REDACTED, RedactingFilter, redact_text, secret_name


def test_every_secret_name_of_a_header_is_also_redacted_as_a_pair_in_a_text():
    for name in ("pwd", "passwd", "auth", "credential", "session", "cookie", "api-key", "x_token"):
        assert secret_name(name)
        assert redact_text(f"run {name}=hunter2 now") == f"run {name}={REDACTED} now", name


def test_a_logged_traceback_is_redacted_too():
    out = io.StringIO()
    logger = logging.getLogger("rgb.tests.secrets")
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    logger.addFilter(RedactingFilter())
    try:
        raise RuntimeError("GET https://host/v1/models?api_key=hunter2 failed")
    except RuntimeError:
        logger.exception("request failed")
    logger.removeHandler(handler)
    assert "hunter2" not in out.getvalue() and "api_key=REDACTED" in out.getvalue()


def test_an_authorization_value_is_redacted_with_its_scheme_and_headers_under_a_dotted_key():
    from rgb.core.secrets import redact

    assert "sk-D" not in redact_text("model.headers.Authorization=Bearer sk-D")
    shown = redact({"model.headers": {"Authorization": "Bearer sk-E", "X-Team": "vision"}})
    assert shown == {"model.headers": {"Authorization": REDACTED, "X-Team": "vision"}}


def test_a_bad_header_value_is_refused_without_the_secret_beside_it():
    import pytest

    from rgb.core.values import ConfigValueError
    from rgb.endpoints.settings import ClientSettings

    with pytest.raises(ConfigValueError) as refused:
        ClientSettings(headers={"Authorization": "Bearer sk-SECRET1", "X-N": 3})
    assert "sk-SECRET1" not in str(refused.value) and "headers" in str(refused.value)
