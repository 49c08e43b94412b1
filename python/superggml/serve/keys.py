"""API keys for `superggml serve`: requests carry `Authorization: Bearer <key>`, as OpenAI's, llama-server's and
vLLM's do. Keys come from --api-key (repeatable), --api-key-file (one per line) and SUPERGGML_API_KEY; they are
compared in constant time. The health check and the page (which asks for a key) are open. A server with no key
listens on loopback only, unless told --insecure."""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
from typing import Any, Awaitable, Callable, Iterable, Sequence

OPEN_PATHS = ("/health", "/")  # answered without a key: the health check and the page
OPEN_PREFIXES = ("/web/",)  # the page's static files


class KeyFileError(ValueError):
    """A key file that cannot be read or holds no key."""


def load_keys(keys: Sequence[str] = (), key_file: str | None = None, env: bool = True) -> list[str]:
    """The server's keys: those given, a file's non-empty lines (# comments skipped), SUPERGGML_API_KEY."""
    out = [k.strip() for k in keys if k and k.strip()]
    if key_file:
        try:
            with open(key_file, encoding="utf-8") as f:
                lines = [ln.strip() for ln in f]
        except OSError as e:
            raise KeyFileError(f"cannot read the API key file {key_file!r}: {e.strerror or e}") from None
        found = [ln for ln in lines if ln and not ln.startswith("#")]
        if not found:
            raise KeyFileError(f"the API key file {key_file!r} holds no key")
        out += found
    if env and os.environ.get("SUPERGGML_API_KEY", "").strip():
        out.append(os.environ["SUPERGGML_API_KEY"].strip())
    return list(dict.fromkeys(out))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: Sequence[str], insecure: bool) -> None:
    """Refuses to listen beyond loopback with no key (anyone who reaches the port could use the model)."""
    if not keys and not insecure and not is_loopback(host):
        raise ValueError(
            f"refusing to listen on {host} with no API key: any machine that reaches it could use "
            "the model. Give --api-key (or --api-key-file, SUPERGGML_API_KEY), listen on "
            "127.0.0.1, or pass --insecure to serve it open"
        )


def allows(keys: Iterable[str], authorization: bytes) -> bool:
    """Whether an Authorization header value carries one of the keys (each compared in constant time)."""
    scheme, _, given = authorization.partition(b" ")
    ok = scheme.lower() == b"bearer"
    match = False
    for k in keys:
        match |= hmac.compare_digest(given.strip(), k.encode())
    return ok and match


class RequireKey:
    """ASGI middleware: a request to any path but OPEN_PATHS without a valid key gets 401 in OpenAI's shape."""

    def __init__(self, app: Any, keys: Sequence[str], open_paths: Sequence[str] = OPEN_PATHS):
        self.app, self.keys, self.open = app, list(keys), set(open_paths)

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]
    ) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not self.keys or path in self.open or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, send)
            return
        auth = dict(scope.get("headers") or []).get(b"authorization", b"")
        if allows(self.keys, auth):
            await self.app(scope, receive, send)
            return
        why = "a wrong API key" if auth else "no API key (send Authorization: Bearer <key>)"
        body = json.dumps(
            {
                "error": {
                    "message": f"the request has {why}",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")],
            }
        )
        await send({"type": "http.response.body", "body": body})
