"""A scripted model provider on 127.0.0.1, for `ccsup hook doctor` and the tests with the real
harnesses: it speaks the Anthropic Messages API (Claude Code, `ANTHROPIC_BASE_URL`), streamed
or not, and answers from a script instead of a model.

The script is a list of steps, each a tool call `(name, input)` or a function of the tool results
so far returning one (for `wait` after `run`: its id comes from run's answer). A request whose
conversation holds N tool results gets step N; past the last step, the text "done". A request
that offers no tools (a harness's side requests: titles, summaries) gets a short text. The state
is in the conversation the harness sends, so several sessions at once each get their own steps.
Every tool result seen is kept (`results`), in order, for the caller to judge what the model saw.

`headers` adds response headers to every answer (a provider's rate-limit headers: Codex's
`x-codex-primary-*`, Anthropic's `anthropic-ratelimit-unified-*`); `fail_count` and `failure`
answer the next N model requests (-1: all) with an error status, body and headers (a 429).

Listens on 127.0.0.1 only, port chosen by the system; `close()` stops it. Nothing is stored.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Union

Call = tuple[str, dict[str, Any]]
# A tool call, or a function of the tool results so far that returns one (None: say `final`).
Step = Union[Call, Callable[[list[str]], Union[Call, None]]]  # noqa: UP007 - a runtime alias


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            _text_of(c.get("text", c.get("content", ""))) for c in content if isinstance(c, dict)
        )
    return ""


def tool_results(messages: list[dict]) -> list[tuple[str, str]]:
    """(tool_use_id, text) of every tool_result block in an Anthropic conversation, in order."""
    found = []
    for message in messages:
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    found.append((str(block.get("tool_use_id")), _text_of(block.get("content"))))
    return found


class ScriptedProvider:
    def __init__(self, steps: list[Step], final: str = "done"):
        self.steps = steps
        self.final = final
        self.results: list[str] = []  # every tool result seen, as the model saw it
        self.requests: list[dict] = []
        self._seen_ids: set[str] = set()
        self._lock = threading.Lock()
        # Extra response headers (a provider's rate-limit headers): a dict, or a function of
        # nothing returning one (a reset time computed when the answer is sent).
        self.headers: dict[str, str] | Callable[[], dict[str, str]] = {}
        # Fail the next `fail_count` model requests (-1: all) with (status, JSON body, headers).
        self.fail_count = 0
        self.failure: tuple[int, dict, dict[str, str]] = (429, {}, {})
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._json(200, {"data": [], "has_more": False})

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.end_headers()

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                if self.path.split("?")[0].endswith("/count_tokens"):
                    self._json(200, {"input_tokens": 10})
                    return
                if provider._failing():
                    status, obj, headers = provider.failure
                    self._json(status, obj, {**provider.extra_headers(), **headers})
                    return
                if self.path.split("?")[0].endswith("/chat/completions"):
                    self._chunks(provider.answer_chat(body))
                    return
                if self.path.split("?")[0].endswith("/responses"):
                    self._sse(responses_events(provider.answer_responses(body)))
                    return
                if not self.path.split("?")[0].endswith("/messages"):
                    self._json(
                        404,
                        {
                            "type": "error",
                            "error": {"type": "not_found_error", "message": self.path},
                        },
                    )
                    return
                message = provider.answer(body)
                if body.get("stream"):
                    self._stream(message)
                else:
                    self._json(200, message)

            def _json(self, status: int, obj: dict, headers: dict | None = None) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in (
                    provider.extra_headers() if headers is None else headers
                ).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, message: dict) -> None:
                self._sse(anthropic_events(message))

            def _chunks(self, chunks: list[dict]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                for name, value in provider.extra_headers().items():
                    self.send_header(name, value)
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _sse(self, events: list[tuple[str, dict]]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                for name, value in provider.extra_headers().items():
                    self.send_header(name, value)
                self.end_headers()
                for event, data in events:
                    self.wfile.write(f"event: {event}\ndata: {json.dumps(data)}\n\n".encode())
                self.wfile.flush()

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def extra_headers(self) -> dict[str, str]:
        return self.headers() if callable(self.headers) else dict(self.headers)

    def _failing(self) -> bool:
        with self._lock:
            if self.fail_count == 0:
                return False
            if self.fail_count > 0:
                self.fail_count -= 1
            return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def answer(self, body: dict) -> dict:
        messages = body.get("messages") or []
        seen = tool_results(messages)
        results = [text for _, text in seen]
        offered = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        with self._lock:
            self.requests.append(body)
            if seen and seen[-1][0] not in self._seen_ids:
                self._seen_ids.add(seen[-1][0])
                self.results.append(seen[-1][1])
        model = body.get("model") or "scripted"
        if not offered:
            return _message(model, [{"type": "text", "text": "ok"}], "end_turn")
        if len(results) < len(self.steps):
            step = self.steps[len(results)]
            try:
                call = step(results) if callable(step) else step
            except (
                ValueError,
                KeyError,
                IndexError,
                AttributeError,
            ) as e:  # a script's bug: say so
                return _message(
                    model, [{"type": "text", "text": f"script failed: {e!r}"}], "end_turn"
                )
            if call is None:
                return _message(model, [{"type": "text", "text": self.final}], "end_turn")
            name, tool_input = call
            if name in offered:
                block = {
                    "type": "tool_use",
                    "id": f"toolu_{uuid.uuid4().hex[:20]}",
                    "name": name,
                    "input": tool_input,
                }
                return _message(model, [block], "tool_use")
            return _message(
                model, [{"type": "text", "text": f"no tool {name} offered"}], "end_turn"
            )
        return _message(model, [{"type": "text", "text": self.final}], "end_turn")

    def answer_chat(self, body: dict) -> list[dict]:
        """Chat Completions (OpenCode's custom provider), streamed as chunks."""
        messages = body.get("messages") or []
        seen = [
            (str(m.get("tool_call_id")), _text_of(m.get("content")))
            for m in messages
            if isinstance(m, dict) and m.get("role") == "tool"
        ]
        results = [text for _, text in seen]
        offered = {
            (t.get("function") or {}).get("name")
            for t in body.get("tools") or []
            if isinstance(t, dict)
        }
        with self._lock:
            self.requests.append(body)
            if seen and seen[-1][0] not in self._seen_ids:
                self._seen_ids.add(seen[-1][0])
                self.results.append(seen[-1][1])
        call = None
        if offered and len(results) < len(self.steps):
            step = self.steps[len(results)]
            try:
                call = step(results) if callable(step) else step
            except (ValueError, KeyError, IndexError, AttributeError):
                call = None
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion.chunk",
            "model": "scripted",
            "created": 0,
        }
        if call is None or call[0] not in offered:
            return [
                {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "delta": {"role": "assistant", "content": self.final},
                            "finish_reason": None,
                        }
                    ],
                },
                {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            ]
        name, arguments = call
        tool_call = {
            "index": 0,
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return [
            {
                **base,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "tool_calls": [tool_call]},
                        "finish_reason": None,
                    }
                ],
            },
            {
                **base,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
            },
        ]

    def answer_responses(self, body: dict) -> dict:
        """The OpenAI Responses API (Codex): the same script, function calls for tool calls."""
        given = body.get("input")
        items: list[Any] = given if isinstance(given, list) else []
        seen = [
            (str(i.get("call_id")), _text_of(i.get("output")))
            for i in items
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        results = [text for _, text in seen]
        # A namespace (Codex puts each MCP server's tools in one, "mcp__<server>") offers its
        # tools as "<namespace>__<tool>", called by name within the namespace.
        offered: dict[str, tuple[str | None, str]] = {}
        for tool in body.get("tools") or []:
            if isinstance(tool, dict) and tool.get("type") == "namespace":
                for inner in tool.get("tools") or []:
                    if isinstance(inner, dict) and inner.get("name"):
                        offered[f"{tool.get('name')}__{inner['name']}"] = (
                            tool.get("name"),
                            inner["name"],
                        )
            elif isinstance(tool, dict) and tool.get("name"):
                offered[tool["name"]] = (None, tool["name"])
        with self._lock:
            self.requests.append(body)
            if seen and seen[-1][0] not in self._seen_ids:
                self._seen_ids.add(seen[-1][0])
                self.results.append(seen[-1][1])
        said = {"type": "output_text", "text": self.final}
        text: dict[str, Any] = {"type": "message", "role": "assistant", "content": [said]}
        if not offered or len(results) >= len(self.steps):
            return _response([text])
        step = self.steps[len(results)]
        try:
            call = step(results) if callable(step) else step
        except (ValueError, KeyError, IndexError, AttributeError) as e:
            call = None
            said["text"] = f"script failed: {e!r}"
        if call is None or call[0] not in offered:
            return _response([text])
        namespace, name = offered[call[0]]
        item = {
            "type": "function_call",
            "id": f"fc_{uuid.uuid4().hex[:20]}",
            "call_id": f"call_{uuid.uuid4().hex[:20]}",
            "name": name,
            "arguments": json.dumps(call[1]),
            "status": "completed",
        }
        if namespace is not None:
            item["namespace"] = namespace
        return _response([item])

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _message(model: str, content: list[dict], stop: str) -> dict:
    return {
        "id": f"msg_{uuid.uuid4().hex[:20]}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def anthropic_events(message: dict) -> list[tuple[str, dict]]:
    """A message as the Messages API streams it (server-sent events)."""
    start = {**message, "content": [], "stop_reason": None}
    events: list[tuple[str, dict]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
            )
            delta = {"type": "text_delta", "text": block["text"]}
        else:
            opened = {**block, "input": {}}
            events.append(
                (
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": opened},
                )
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 5},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _response(output: list[dict]) -> dict:
    return {
        "id": f"resp_{uuid.uuid4().hex[:20]}",
        "object": "response",
        "status": "completed",
        "model": "scripted",
        "output": output,
        "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
    }


def responses_events(response: dict) -> list[tuple[str, dict]]:
    """A response as the Responses API streams it (server-sent events)."""
    created = {**response, "status": "in_progress", "output": []}
    events: list[tuple[str, dict]] = [
        ("response.created", {"type": "response.created", "response": created})
    ]
    for index, item in enumerate(response["output"]):
        events.append(
            (
                "response.output_item.added",
                {"type": "response.output_item.added", "output_index": index, "item": item},
            )
        )
        events.append(
            (
                "response.output_item.done",
                {"type": "response.output_item.done", "output_index": index, "item": item},
            )
        )
    events.append(("response.completed", {"type": "response.completed", "response": response}))
    return events
