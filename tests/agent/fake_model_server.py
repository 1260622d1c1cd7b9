"""A FAKE model endpoint for tests: the streaming chat-completions subset over real HTTP.

``FakeModelServer`` is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (an ephemeral port) in a
daemon thread. Each ``POST .../chat/completions`` is recorded (``requests``: path, headers,
decoded JSON body) and answered with the next scripted :class:`Reply`: an HTTP error status,
or ``200`` with ``text/event-stream`` over chunked transfer encoding — one ``data: {chunk}``
event per chunk, then ``data: [DONE]``. A reply can hold before a given event until the test
releases it (to look at the daemon mid-stream), or cut the connection mid-stream (no
terminating chunk: the client sees a broken body). With no reply left the server answers 500
and says so, so a test that sends one request too many fails loudly. It is not a model.
"""

from __future__ import annotations

import json
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAKE_MODEL = "fake-model-1"


@dataclass
class Reply:
    status: int = 200
    #: SSE data payloads (dicts are JSON-encoded), sent as ``data: ...\n\n`` events.
    events: list = field(default_factory=list)
    #: Send ``data: [DONE]`` after the events.
    done: bool = True
    #: Close the connection abruptly after this many events (a cut stream).
    cut_after: int | None = None
    #: Body of a non-200 reply, and extra headers.
    body: str = ""
    headers: dict = field(default_factory=dict)
    #: Wait for ``hold`` (a threading.Event) before sending event number ``hold_before``.
    hold_before: int | None = None
    hold: threading.Event | None = None


# ---------------------------------------------------------------------- chunk builders
def chunk(delta: dict | None = None, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": FAKE_MODEL,
        "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}],
    }


def usage_chunk(prompt: int = 11, completion: int = 7) -> dict:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "model": FAKE_MODEL,
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }


def _pieces(text: str, n: int) -> list[str]:
    n = max(1, min(n, len(text) or 1))
    size = -(-len(text) // n) if text else 1
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def text_events(text: str, pieces: int = 3) -> list[dict]:
    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in _pieces(text, pieces) if p]
    return events


def tool_events(calls: list[tuple[str, dict | str]], text: str = "", split: int = 3) -> list[dict]:
    """Deltas of ``calls`` (name, arguments): id + name first, the arguments JSON split across
    ``split`` chunks, calls interleaved by index the way real servers send them."""
    events = text_events(text) if text else [chunk({"role": "assistant", "content": None})]
    for index, (name, arguments) in enumerate(calls):
        raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
        events.append(chunk({"tool_calls": [{
            "index": index, "id": f"call_fake_{index}", "type": "function",
            "function": {"name": name, "arguments": ""}}]}))
        for piece in _pieces(raw, split):
            events.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    return events


def text_reply(text: str, pieces: int = 3, **kw) -> Reply:
    return Reply(events=[*text_events(text, pieces), chunk(finish="stop"), usage_chunk()], **kw)


def tool_reply(calls: list[tuple[str, dict | str]], text: str = "", split: int = 3, **kw) -> Reply:
    return Reply(events=[*tool_events(calls, text, split), chunk(finish="tool_calls"),
                         usage_chunk()], **kw)


def error_reply(status: int, message: str = "fake error", **kw) -> Reply:
    return Reply(status=status, body=json.dumps({"error": {"message": message}}), **kw)


# ---------------------------------------------------------------------- the server
class FakeModelServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_POST(self) -> None:  # noqa: N802 (stdlib name)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = {"unparsable": raw.decode("utf-8", "replace")}
                with server._lock:
                    server.requests.append(
                        {"path": self.path, "headers": dict(self.headers), "body": body}
                    )
                    reply = server.replies.popleft() if server.replies else None
                if reply is None:
                    reply = error_reply(500, "fake model server: no scripted reply left")
                if reply.status != 200:
                    payload = reply.body.encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for k, v in reply.headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Transfer-Encoding", "chunked")
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                for i, event in enumerate(reply.events):
                    if reply.cut_after is not None and i >= reply.cut_after:
                        self._cut()
                        return
                    if reply.hold_before == i and reply.hold is not None:
                        reply.hold.wait(60)
                    data = event if isinstance(event, str) else json.dumps(event)
                    self._chunk(f"data: {data}\n\n".encode())
                if reply.cut_after is not None:
                    self._cut()
                    return
                if reply.done:
                    self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _cut(self) -> None:
                self.wfile.write(b"40\r\ndata: {\"choi")  # half a chunk, then gone
                self.wfile.flush()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass  # a client that hung up mid-stream (a cancelled turn) is not news

        self._httpd = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        daemon=True, name="fake-model-server")

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def bodies(self) -> list[dict]:
        with self._lock:
            return [r["body"] for r in self.requests]

    def start(self) -> "FakeModelServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(10)

    def __enter__(self) -> "FakeModelServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
