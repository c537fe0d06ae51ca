"""The browser origin policy (pipeline/origin.py): table tests, then the hub on port 0."""

from __future__ import annotations

import logging

import pytest
import websockets

from client_fakes import real_tts_engines, start_hub, ws_url
from pipeline.origin import exposure_warning, is_loopback_host, normalize_origin, origin_allowed, refused_origin
from rt import recv
from base.config import load_config
from base.errors import ConfigError

LOCAL, PUBLIC = "127.0.0.1", "0.0.0.0"

# (origin, Host header, server.allowed_origins, server.host, allowed?)
CASES = [
    (None, "127.0.0.1:8765", (), LOCAL, True),  # not a browser
    ("http://127.0.0.1:8765", "127.0.0.1:8765", (), LOCAL, True),  # the page served at /
    ("http://localhost:3000", "127.0.0.1:8765", (), LOCAL, True),  # loopback, any port
    ("https://LOCALHOST", "127.0.0.1:8765", (), LOCAL, True),
    ("http://[::1]:9000", "[::1]:8765", (), LOCAL, True),
    ("http://127.0.0.1", "127.0.0.1:8765", (), LOCAL, True),
    ("http://evil.example", "127.0.0.1:8765", (), LOCAL, False),
    ("https://evil.example:8765", "evil.example:8765", (), LOCAL, False),  # DNS rebinding onto loopback
    ("null", "127.0.0.1:8765", (), LOCAL, False),  # file:// pages, sandboxed frames
    ("chrome-extension://abc", "127.0.0.1:8765", (), LOCAL, False),
    ("http://localhost.evil.example", "127.0.0.1:8765", (), LOCAL, False),
    ("http://127.0.0.1.evil.example", "127.0.0.1:8765", (), LOCAL, False),
    ("", "127.0.0.1:8765", (), LOCAL, False),
    ("http://evil.example", "127.0.0.1:8765", ("http://evil.example",), LOCAL, True),
    ("HTTP://Evil.Example:80", "127.0.0.1:8765", ("http://evil.example",), LOCAL, True),
    ("http://evil.example:81", "127.0.0.1:8765", ("http://evil.example",), LOCAL, False),
    ("https://evil.example", "127.0.0.1:8765", ("http://evil.example",), LOCAL, False),
    ("http://evil.example", "127.0.0.1:8765", ("*",), LOCAL, True),
    ("null", "127.0.0.1:8765", ("*",), LOCAL, True),
    # Bound to the network: the server's own page (Origin host:port = Host) is allowed too.
    ("http://voice.lan:8765", "voice.lan:8765", (), PUBLIC, True),
    ("https://voice.example.com", "voice.example.com", (), PUBLIC, True),  # default port on both
    ("https://voice.example.com", "voice.example.com:443", (), PUBLIC, True),
    ("http://voice.example.com", "voice.example.com:443", (), PUBLIC, False),
    ("http://voice.lan:8765", "voice.lan:8766", (), PUBLIC, False),
    ("http://evil.example", "voice.lan:8765", (), PUBLIC, False),
    ("http://evil.example", None, (), PUBLIC, False),
    ("http://192.168.1.5:8765", "192.168.1.5:8765", (), PUBLIC, True),
    ("http://[fd00::5]:8765", "[fd00::5]:8765", (), PUBLIC, True),
    ("http://evil.example", "evil.example:bad", (), PUBLIC, False),
]


@pytest.mark.parametrize(("origin", "host", "allowed", "bind", "expected"), CASES)
def test_origin_policy(origin, host, allowed, bind, expected):
    assert origin_allowed(origin, host, allowed, bind) is expected


@pytest.mark.parametrize(("origin", "normalized"), [
    ("http://A.example", "http://a.example"),
    ("https://a.example:443", "https://a.example"),
    ("http://a.example:8080/", "http://a.example:8080"),
    ("http://[::1]:80", "http://[::1]"),
    ("ws://a.example", None),
    ("http://a.example/path", None),
    ("http://user@a.example", None),
    ("http://a.example:99999", None),
    ("null", None),
])
def test_normalize_origin(origin, normalized):
    assert normalize_origin(origin) == normalized


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("app.localhost", True), ("0.0.0.0", False), ("::", False), ("192.168.1.5", False),
    ("example.com", False), ("localhost.example.com", False),
])
def test_loopback_hosts(host, loopback):
    assert is_loopback_host(host) is loopback


def test_refused_origin_reads_the_headers():
    from websockets.datastructures import Headers

    server = load_config(None, [], environ={}).server
    assert refused_origin(Headers([("Host", "127.0.0.1:8765")]), server) is None
    assert refused_origin(Headers([("Origin", "http://localhost:1")]), server) is None
    assert refused_origin(Headers([("Origin", "http://evil.example")]), server) == "http://evil.example"
    both = Headers([("Origin", "http://localhost"), ("Origin", "http://evil.example")])
    assert refused_origin(both, server) == "http://localhost, http://evil.example"
    public = server.__class__(host="0.0.0.0")
    page = [("Origin", "http://voice.lan:8765")]
    assert refused_origin(Headers([*page, ("Host", "voice.lan:8765")]), public) is None
    assert refused_origin(Headers([*page, ("Host", "voice.lan:8765"), ("Host", "voice.lan:8765")]), public)


def test_exposure_warning():
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", "s3cret") is None
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None and "anyone" in warning and "server.auth_token" in warning


def test_allowed_origins_are_validated():
    cfg = load_config(None, ["server.allowed_origins=https://a.example:8443,*,http://[::1]:80"], environ={})
    assert cfg.server.allowed_origins == ("https://a.example:8443", "*", "http://[::1]:80")
    for bad in ("a.example", "http://a.example/", "ws://a.example", "http://u@a.example"):
        with pytest.raises(ConfigError, match="server.allowed_origins"):
            load_config(None, [f"server.allowed_origins={bad}"], environ={})


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


async def connect_status(hub, origin: str | None, headers: list | None = None) -> int:
    """101 when the upgrade is accepted (and session.created arrives), else the HTTP status."""
    try:
        async with websockets.connect(ws_url(hub), origin=origin, additional_headers=headers) as ws:
            assert (await recv(ws))["type"] == "session.created"
            return 101
    except websockets.InvalidStatus as exc:
        return exc.response.status_code


async def test_hub_refuses_foreign_origins_by_default(tts_engines, caplog):
    hub = await start_hub(tts_engines)
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.hub"):
            assert await connect_status(hub, "http://evil.example") == 403
        refusal = [r.getMessage() for r in caplog.records if "evil.example" in r.getMessage()]
        assert refusal and "server.allowed_origins" in refusal[0]
        assert await connect_status(hub, None) == 101  # not a browser
        assert await connect_status(hub, f"http://127.0.0.1:{hub.port}") == 101  # the page at /
        assert await connect_status(hub, "http://localhost:5173") == 101
        # Two Origin headers (no browser sends that): refused, not a server error.
        assert await connect_status(hub, "http://localhost", [("Origin", "http://evil.example")]) == 403
        # A second Host header counts as none: loopback origins still pass, nothing crashes.
        assert await connect_status(hub, "http://localhost", [("Host", "evil.example")]) == 101
    finally:
        await hub.stop()


async def test_hub_allowed_origins_widen_the_policy(tts_engines):
    hub = await start_hub(tts_engines, "server.allowed_origins=https://app.example")
    try:
        assert await connect_status(hub, "https://app.example") == 101
        assert await connect_status(hub, "https://other.example") == 403
        assert await connect_status(hub, "http://127.0.0.1:1") == 101  # the default still holds
    finally:
        await hub.stop()
    hub = await start_hub(tts_engines, "server.allowed_origins=*")
    try:
        assert await connect_status(hub, "http://evil.example") == 101
    finally:
        await hub.stop()
