"""The SDK's capabilities (sluice:plugin@0.2.0) over fakes of the host's
imports: what reaches the host, and how each error settles a message."""

from datetime import timedelta

import pytest
from conftest import Refuse, load_sdk


def outcome(sdk, fakes, handle, *, key="k"):
    """What ``sluice.handler(handle)`` returns to the host for one message."""
    raw = fakes.types.Emit(topic="in", key=key, headers=[], payload=b"p")
    raw.id, raw.attempt, raw.published_at = "m-1", 1, 0
    return sdk.handler(handle)().handle(raw)


# --- state -------------------------------------------------------------------


def test_state_calls_reach_the_host_with_bytes_and_milliseconds(sdk):
    sluice, fakes = sdk
    sluice.state.set("a", "text")
    sluice.state.set("b", b"\x00\x01", ttl=2.5)
    sluice.state.set("c", bytearray(b"x"), ttl=timedelta(minutes=1))
    assert fakes.state.calls == [
        ("set", "a", b"text", None),
        ("set", "b", b"\x00\x01", 2500),
        ("set", "c", b"x", 60000),
    ]
    assert sluice.state.get("a").value == b"text"
    assert sluice.state.get_text("a") == "text"
    assert sluice.state.get_text("missing") is None
    assert sluice.state.increment("n") == 1
    assert sluice.state.increment("n", 41) == 42
    assert sluice.state.increment("n", -2) == 40
    assert sluice.state.list("") == ["a", "b", "c", "n"]
    assert sluice.state.list("n", limit=5) == ["n"]
    assert fakes.state.calls[-1] == ("list", "n", 5)
    sluice.state.delete("a")
    assert sluice.state.get("a") is None


def test_compare_and_set_passes_the_revision_and_says_whether_it_set(sdk):
    sluice, fakes = sdk
    assert sluice.state.compare_and_set("lock", 0, "me", ttl=30) is True
    assert fakes.state.calls[-1] == ("compare_and_set", "lock", 0, b"me", 30000)
    # Held now: revision 0 (absent) no longer matches.
    assert sluice.state.compare_and_set("lock", 0, "you") is False
    assert sluice.state.get_text("lock") == "me"


def test_bad_values_and_ttls_fail_on_the_handlers_line(sdk):
    sluice, fakes = sdk
    with pytest.raises(TypeError, match="bytes or str"):
        sluice.state.set("k", 42)
    with pytest.raises(ValueError, match=">= 0"):
        sluice.state.set("k", "v", ttl=-1)
    with pytest.raises(TypeError, match="seconds"):
        sluice.state.set("k", "v", ttl="1s")
    assert fakes.state.calls == []


def test_a_value_that_is_not_utf8_is_invalid_as_text(sdk):
    sluice, fakes = sdk
    sluice.state.set("bin", b"\xff")
    with pytest.raises(sluice.StateInvalid, match="the value at `bin` is not UTF-8"):
        sluice.state.get_text("bin")


@pytest.mark.parametrize(
    "variant, cls, text",
    [
        ("NotGranted", "StateNotGranted", "state not granted: add `state: true`"),
        ("StoreFull", "StateStoreFull", "state store full: add `state: true`"),
        ("Invalid", "StateInvalid", "invalid state operation: add `state: true`"),
        ("Unavailable", "StateUnavailable", "state unavailable: add `state: true`"),
    ],
)
def test_state_errors_are_typed_and_say_what_failed(sdk, variant, cls, text):
    sluice, fakes = sdk
    fakes.state.fail = getattr(fakes.state, f"StateError_{variant}")("add `state: true`")
    with pytest.raises(getattr(sluice, cls)) as caught:
        sluice.state.get("k")
    assert isinstance(caught.value, sluice.StateError)
    assert str(caught.value) == text
    assert caught.value.reason == "add `state: true`"
    assert sluice.state.describe(caught.value) == text
    # The namespaced names are the same classes.
    assert getattr(sluice.state, variant) is getattr(sluice, cls)


@pytest.mark.parametrize(
    "variant, settles",
    [
        ("Unavailable", "retry"),
        ("StoreFull", "retry"),
        ("NotGranted", "reject"),
        ("Invalid", "reject"),
    ],
)
def test_an_uncaught_state_error_retries_or_rejects_as_the_rust_sdk(sdk, variant, settles):
    sluice, fakes = sdk
    fakes.state.fail = getattr(fakes.state, f"StateError_{variant}")("why")

    def handle(msg):
        return str(sluice.state.increment(f"count/{msg.key}"))

    result = outcome(sluice, fakes, handle)
    assert isinstance(result, fakes.Err)
    if settles == "retry":
        assert result.value == fakes.types.HandlerError_Retry(None)
    else:
        assert isinstance(result.value, fakes.types.HandlerError_Reject)
        assert result.value.value.endswith(": why")


def test_a_caught_state_error_lets_the_handler_go_on(sdk):
    sluice, fakes = sdk
    fakes.state.fail = fakes.state.StateError_Unavailable("down")

    def handle(msg):
        try:
            seen = sluice.state.get_text("seen")
        except sluice.StateError:
            seen = "unknown"
        return f"seen {seen}"

    result = outcome(sluice, fakes, handle)
    assert isinstance(result, fakes.Ok)
    assert result.value[0].payload == b"seen unknown"


def test_a_counter_per_key_emits_the_count(sdk):
    sluice, fakes = sdk

    def handle(msg):
        return str(sluice.state.increment(f"count/{msg.key}"))

    assert outcome(sluice, fakes, handle, key="a").value[0].payload == b"1"
    assert outcome(sluice, fakes, handle, key="a").value[0].payload == b"2"
    assert outcome(sluice, fakes, handle, key="b").value[0].payload == b"1"


# --- secrets -----------------------------------------------------------------


def test_a_granted_secret_is_read_and_an_ungranted_one_rejects(sdk):
    sluice, fakes = sdk
    fakes.secrets.values["api_token"] = "s3cret"
    assert sluice.secrets.get("api_token") == "s3cret"
    with pytest.raises(sluice.SecretNotGranted) as caught:
        sluice.secrets.get("other")
    assert str(caught.value) == "secret not granted: stage `s` does not list `other`"
    assert sluice.secrets.describe(caught.value) == str(caught.value)

    result = outcome(sluice, fakes, lambda msg: sluice.secrets.get("other"))
    assert result.value == fakes.types.HandlerError_Reject(
        "secret not granted: stage `s` does not list `other`"
    )


# --- a world without the capability --------------------------------------------


def test_a_capability_the_world_lacks_names_what_the_build_looks_for(monkeypatch):
    sluice, fakes = load_sdk(monkeypatch)
    for call, what, use in [
        (lambda: sluice.state.get("k"), "sluice:plugin/state", "sluice.state"),
        (lambda: sluice.secrets.get("k"), "sluice:plugin/secrets", "sluice.secrets"),
        (lambda: sluice.http.get("https://a.example"), "wasi:http/outgoing-handler", "sluice.http"),
    ]:
        with pytest.raises(RuntimeError) as caught:
            call()
        assert f"does not import {what}" in str(caught.value)
        assert f"`{use}`" in str(caught.value)
    # A plain handler works without them (a 0.1.0 world, or 0.2.0 with none).
    result = outcome(sluice, fakes, lambda msg: msg.text().upper())
    assert result.value[0].payload == b"P"


def test_the_types_module_is_found_under_either_name(monkeypatch):
    for qualified in (False, True):
        sluice, fakes = load_sdk(monkeypatch, qualified_types=qualified)
        assert sluice._types is fakes.types


# --- batches -----------------------------------------------------------------


def test_a_capability_error_returned_or_raised_in_a_batch_settles_as_in_a_handler(sdk):
    sluice, fakes = sdk
    raws = []
    for key in ("a", "b"):
        raw = fakes.types.Emit(topic="in", key=key, headers=[], payload=b"p")
        raw.id, raw.attempt, raw.published_at = f"m-{key}", 1, 0
        raws.append(raw)

    def per_item(msgs):
        return ["fine", sluice.Timeout("slow")]

    results = sluice.batch_handler(per_item)().handle_batch(raws)
    assert isinstance(results[0], fakes.Ok)
    assert results[1].value == fakes.types.HandlerError_Retry(None)

    def raising(msgs):
        raise sluice.Refused("not allowed")

    results = sluice.batch_handler(raising)().handle_batch(raws)
    assert [r.value for r in results] == [
        fakes.types.HandlerError_Reject("request refused: not allowed")
    ] * 2
