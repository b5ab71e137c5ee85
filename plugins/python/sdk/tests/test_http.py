"""The SDK's HTTP client over a fake wasi:http: the requests it makes, the
answers it reads, the one redirect it follows and its errors."""

import pytest
from conftest import Refuse, Resource


def test_a_get_sends_the_parts_of_the_url_and_reads_the_answer(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(200, [("Content-Type", "text/plain"), ("X-A", "1")], b"hello")]
    answer = sluice.http.get(
        "https://api.example.com:8443/v1/x?q=1#frag", headers={"Accept": "text/plain"}
    )
    (sent,) = fakes.handler.sent
    assert sent["method"] == "Method_Get"
    assert sent["scheme"] == "Scheme_Https"
    assert sent["authority"] == "api.example.com:8443"
    assert sent["path"] == "/v1/x?q=1"
    assert sent["headers"] == [("Accept", b"text/plain")]
    assert sent["options"] is None
    assert answer.status == 200 and answer.ok
    assert answer.headers == [("content-type", "text/plain"), ("x-a", "1")]
    assert answer.header("CONTENT-TYPE") == "text/plain"
    assert answer.header("missing", "none") == "none"
    assert answer.text() == "hello"
    # Every child resource is dropped before its parent.
    drops = Resource.drops
    assert drops.index("OutputStream") < drops.index("FutureIncomingResponse")
    assert drops.index("InputStream") < drops.index("IncomingBody") < drops.index("IncomingResponse")
    assert drops.index("Fields") < drops.index("IncomingResponse")


def test_a_post_with_json_sets_the_body_and_content_type(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(201, [], b'{"id": 7}'), (200, [], b"")]
    answer = sluice.http.post("http://h/charge", json={"order": 7}, timeout=2.5)
    sent = fakes.handler.sent[0]
    assert sent["method"] == "Method_Post"
    assert sent["scheme"] == "Scheme_Http"
    assert sent["path"] == "/charge"
    assert sent["body"] == b'{"order":7}'
    assert ("content-type", b"application/json") in sent["headers"]
    assert sent["options"].connect == sent["options"].first_byte == 2_500_000_000
    assert answer.json() == {"id": 7}
    # A content type the handler gives is kept.
    sluice.http.post("http://h/", json=[1], headers=[("Content-Type", "application/x+json")])
    assert fakes.handler.sent[1]["headers"] == [("Content-Type", b"application/x+json")]
    with pytest.raises(ValueError, match="body= or json="):
        sluice.http.post("http://h/", body="x", json=1)


def test_a_large_body_is_written_in_chunks_wasi_io_takes(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(204, [], b"")]
    body = bytes(range(256)) * 40  # 10,240 bytes
    sluice.http.put("https://h/blob", body=body)
    assert fakes.handler.sent[0]["body"] == body
    assert fakes.handler.sent[0]["method"] == "Method_Put"


def test_other_methods_are_sent_by_name(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(200, [], b"")]
    sluice.http.request("purge", "https://h/")
    assert fakes.handler.sent[0]["method"] == "Method_Other(PURGE)"


def test_one_redirect_is_followed_with_a_new_request(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(302, [("Location", "/v2/x")], b""), (200, [], b"moved")]
    answer = sluice.http.post("https://a.example.com/v1/x", body="b")
    assert answer.text() == "moved"
    first, second = fakes.handler.sent
    assert (second["authority"], second["path"]) == ("a.example.com", "/v2/x")
    assert second["method"] == "Method_Post" and second["body"] == b"b"
    # 303 turns it into a GET without a body.
    fakes.handler.answers = [(303, [("location", "https://b.example.com/done")], b""), (200, [], b"")]
    sluice.http.post("https://a.example.com/v1/x", body="b")
    third = fakes.handler.sent[3]
    assert third["method"] == "Method_Get" and third["body"] == b""
    assert third["authority"] == "b.example.com"


def test_only_one_redirect_is_followed(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(301, [("location", "/b")], b""), (301, [("location", "/c")], b"")]
    answer = sluice.http.get("https://h/a")
    assert answer.status == 301 and answer.header("location") == "/c"
    assert len(fakes.handler.sent) == 2


def test_a_redirect_without_location_is_the_answer(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(302, [], b"")]
    assert sluice.http.get("https://h/a").status == 302


@pytest.mark.parametrize(
    "base, location, want",
    [
        ("https://a.example.com/v1/old?x=1", "https://b.example.com/new", "https://b.example.com/new"),
        ("https://a.example.com/v1/old?x=1", "/new", "https://a.example.com/new"),
        ("https://a.example.com/v1/old?x=1", "new", "https://a.example.com/v1/new"),
        ("https://a.example.com/v1/old?x=1", "//c.example.com/p", "https://c.example.com/p"),
        ("http://a.example.com", "next", "http://a.example.com/next"),
    ],
)
def test_redirects_resolve_against_the_url_that_answered(sdk, base, location, want):
    sluice, _ = sdk
    assert sluice._resolve_location(base, location) == want


@pytest.mark.parametrize(
    "url, parts",
    [
        ("https://api.example.com:8443/v1/charge?x=1#frag", (True, "api.example.com:8443", "/v1/charge?x=1")),
        ("http://10.0.0.5", (False, "10.0.0.5", "/")),
        ("http://h?q=1", (False, "h", "/?q=1")),
    ],
)
def test_urls_split_into_scheme_host_and_path(sdk, url, parts):
    sluice, _ = sdk
    assert sluice._split_url(url) == parts


@pytest.mark.parametrize("url", ["ftp://h/", "api.example.com/x", "http:///x", "https://u:p@h/", None])
def test_bad_urls_are_invalid_before_any_request(sdk, url):
    sluice, fakes = sdk
    with pytest.raises(sluice.http.InvalidUrl):
        sluice.http.get(url)
    assert fakes.handler.sent == []


@pytest.mark.parametrize(
    "code, arg, cls, text, settles",
    [
        ("HttpRequestDenied", None, "Refused", "request refused: the host is not in the stage's `http.allow`", "reject"),
        ("DestinationIpProhibited", None, "Refused", "request refused: the host resolves to a private address the stage does not allow", "reject"),
        ("ConnectionTimeout", None, "Timeout", "request timed out: ConnectionTimeout", "retry"),
        ("HttpResponseTimeout", None, "Timeout", "request timed out: HttpResponseTimeout", "retry"),
        ("ConnectionRefused", None, "Failed", "request failed: ConnectionRefused", "retry"),
        ("InternalError", "held for 900 ms", "Failed", "request failed: held for 900 ms", "retry"),
    ],
)
@pytest.mark.parametrize("where", ["handle", "future"])
def test_error_codes_become_typed_errors_that_retry_or_reject(sdk, code, arg, cls, text, settles, where):
    sluice, fakes = sdk
    variant = getattr(fakes.http_types, f"ErrorCode_{code}")
    value = variant() if arg is None and not variant.__dataclass_fields__ else variant(arg)
    fakes.handler.answers = [Refuse(value) if where == "handle" else value]
    with pytest.raises(getattr(sluice.http, cls)) as caught:
        sluice.http.get("https://h/")
    assert isinstance(caught.value, sluice.http.Error)
    assert str(caught.value) == text

    fakes.handler.answers = [Refuse(value) if where == "handle" else value]
    raw = fakes.types.Emit(topic="in", key=None, headers=[], payload=b"")
    result = sluice.handler(lambda msg: sluice.http.get("https://h/").body)().handle(raw)
    if settles == "retry":
        assert result.value == fakes.types.HandlerError_Retry(None)
    else:
        assert result.value == fakes.types.HandlerError_Reject(text)


def test_an_answer_that_is_not_json_rejects(sdk):
    sluice, fakes = sdk
    fakes.handler.answers = [(200, [], b"<html>")]
    answer = sluice.http.get("https://h/")
    with pytest.raises(sluice.Reject, match="the answer is not the JSON expected"):
        answer.json()
    assert not sluice.Response(404, [], b"").ok
