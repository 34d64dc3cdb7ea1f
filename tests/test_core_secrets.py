"""rgb.core.secrets: what an endpoint's settings may declare (typed values public, secrets by their variables'
names), and the second net: a URL's query keeps only the public values, secret-named `name=value` texts and
headers are redacted, and log records whose traceback quotes a secret URL."""

import io
import logging
import uuid

from rgb.core.secrets import REDACTED, RedactingFilter, declared_problems, redact_text, redact_url, secret_name


def test_a_urls_query_keeps_only_the_public_values_whatever_the_names():
    """Admitted, not listed: a parameter of a random name (no list knows it) is redacted, api-version kept."""
    name, mark = f"p{uuid.uuid4().hex[:10]}", f"MARK{uuid.uuid4().hex[:10]}"
    url = f"https://fn.example.net/v1?api-version=2024-06-01&{name}={mark}&code={mark}"
    assert redact_url(url) == f"https://fn.example.net/v1?api-version=2024-06-01&{name}={REDACTED}&code={REDACTED}"
    assert mark not in redact_text(f"POST {url} failed")


def test_declared_values_are_refused_where_they_could_be_secrets_never_showing_them():
    assert declared_problems("header", {"X-Team": "vision"}, {"X-Functions-Key": "AZURE_FN_KEY"}) == []
    for public, secret, said in (({"X-Pass": "hunter2"}, {}, "model.header_env={X-Pass: ENV_VAR}"),
                                 ({"Proxy-Authorization": "Basic hunter2"}, {}, "model.header_env={Proxy-Author"),
                                 ({}, {"X-Jwt": "hunter2 value"}, "must name an environment variable"),
                                 ({"X-A": "1"}, {"X-A": "A_VAR"}, "in both model.headers and model.header_env"),
                                 ({}, {"Authorization": "MY_KEY"}, "model.api_key_env"),
                                 ({"Bad Name": "1"}, {}, "not a valid header name")):
        found = declared_problems("header", public, secret)
        assert any(said in problem for problem in found) and not any("hunter2" in p for p in found), found
    assert "model.query_env={jwt: ENV_VAR}" in declared_problems("query parameter", {"jwt": "x"}, {})[0]


def test_every_secret_name_of_a_header_is_also_redacted_as_a_pair_in_a_text():
    for name in ("pwd", "passwd", "auth", "credential", "session", "cookie", "api-key", "x_token", "X-Pass", "jwt"):
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


def test_a_query_parameter_declared_in_two_places_is_refused():
    import pytest

    from rgb.core.values import ConfigValueError
    from rgb.endpoints.settings import EndpointSettings, ClientSettings
    from rgb.models.chat import ChatClassifier

    with pytest.raises(ConfigValueError, match="'api-version' is in both model.base_url and model.query"):
        EndpointSettings("http://127.0.0.1:1/v1?api-version=1", "tiny", query={"api-version": "2"})
    with pytest.raises(ConfigValueError, match="'region' is in both .* and model.query_env"):
        ChatClassifier(EndpointSettings("http://127.0.0.1:1/v1", "tiny", query={"region": "eu"}),
                      ClientSettings(query_env={"region": "RGB_REGION"}), ["a", "b"], "toy")


def test_a_secret_typed_where_a_variables_name_belongs_is_refused_unseen():
    """`model.header_env={X-Key: <the token itself>}` or a token for the whole mapping: one line naming the key,
    never the value."""
    import pytest

    from rgb.core.values import ConfigValueError
    from rgb.endpoints.settings import ClientSettings

    token = f"tok{uuid.uuid4().hex}"
    for given in ({"header_env": {"X-Key": token}}, {"query_env": token}, {"headers": f"Bearer {token}"},
                  {"header_env": {"X-Key": token.upper()[:3] + "-" + token}}):
        with pytest.raises(ConfigValueError) as refused:
            ClientSettings(**given)
        assert token not in str(refused.value) and token.upper() not in str(refused.value), given
