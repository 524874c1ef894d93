"""Hostile and broken input against a real supervisor: the control socket and the bus are fed
thousands of malformed messages; each gets an error reply or a `rejected` event, nothing of the
supervisor changes, it stays up and its memory stays bounded.

The messages come from a seeded generator (CCSUP_FUZZ_SEED, printed with the figures), so a failing
run can be replayed. Control requests go out in windows rather than one round trip at a time (the
ROUTER drops replies to a peer that does not read them), and every reply is checked: one per
request, an error, a code from protocol.ERROR_CODES, the request's id echoed where it had a usable
one. Bus messages are followed by a marker published on the same PUB: the supervisor handles bus-in
in order and publishes its rejections before forwarding the marker, so once the marker is seen
every rejection has been too.

Every request is built to be refused: a valid base request with exactly one field made wrong (the
base of a turn is a `sleep 60`, so one that slips through shows as a running turn), garbage, wrong
framing, or oversize. A valid `quit`, `reload` or `reap` is never sent.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import random
import time
import uuid

import pytest
import zmq
from conftest import wait_until

from supervisor.wire import args as command_args
from supervisor.wire import protocol

SEED = int(os.environ.get("CCSUP_FUZZ_SEED", "20240605"))
MiB = 1 << 20
WINDOW = 200  # control requests in flight at once (below the sockets' default HWM of 1000)
ANY = object()  # a reply whose id we do not predict (unparseable request, or an id not echoed)

# -- bad values -----------------------------------------------------------------------------------

NAN, INF = float("nan"), float("inf")
BAD_IDS = [
    "",
    "a/b",
    "..",
    "../x",
    "../../etc/passwd",
    "a b",
    " ",
    "x" * 200,
    "x" * 129,
    "a.b",
    "ü",
    "a\nb",
    "\ud800",
    "a\0b",
    "/",
    "turn.x",
    "*",
]
BAD_KEYS = [
    "",
    "codex/x",
    "../codex",
    "codex/../x",
    "..",
    ".codex",
    "codex:.x",
    "a:b:c",
    "_machine",
    "_x",
    "x" * 129,
    "co dex",
    "codex:",
    ":x",
    "codex\0",
    "codex/",
    "/etc",
    "\ud800",
    "ü",
]
WRONG_TYPES = [0, -1, 1.5, True, False, [], {}, [1], {"a": 1}, NAN, INF]
NUMBERS = [-1, 0, -0.0, -1e-300, 1 << 63, 1 << 70, 10**30, -(10**30), 1e308, -1e308, NAN, INF, -INF]


def deep(depth: int, leaf=0):
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


# Per command, per field: values each of which must make the request fail. None is listed only for
# required fields (for optional ones it means "absent").
TURN_BAD = {
    "id": BAD_IDS + [5, 1.5, True, [], {}, NAN],
    "key": BAD_KEYS + [None, *WRONG_TYPES, deep(50, "codex")],
    "argv": [
        None,
        [],
        "sleep 60",
        ["sleep", 60],
        [None],
        ["a\0b"],
        ["x"] * (command_args.MAX_ARGV + 1),
        5,
        {},
        [[]],
        [{"a": "b"}],
        True,
        deep(40, "x"),
    ],
    "cwd": [
        "relative",
        "",
        "..",
        "../etc",
        5,
        [],
        True,
        "/nonexistent-ccsup-fuzz",
        "/tmp\0x",
        "x" * 5000,
        "/\ud800",
        {"a": 1},
    ],
    "env": [
        [],
        5,
        "A=b",
        True,
        False,
        0,
        "",
        {"": "x"},
        {"A=B": "x"},
        {"A": 5},
        {"A": ["x"]},
        {"A": "x\0"},
        {"A\0": "x"},
        {"x" * 1025: "v"},
        {"A": True},
        {"A": {"b": "c"}},
        {"A": NAN},
    ],
    "holder": [
        "s",
        5,
        [],
        True,
        {"pid": -1},
        {"pid": 0},
        {"pid": 1.5},
        {"pid": "1"},
        {"pid": True},
        {"pid": 1 << 70},
        {"pid": NAN},
        {"pid": 1 << 22},
        {"start": -1},
        {"start": 1.5},
        {"start": "0"},
        {"session": 5},
        {"agent": []},
        {"model": "x" * 300},
        {"bogus": 1},
        {"../x": 1},
        {"harness": {"a": 1}},
        deep(30),
    ],
    "reservation": BAD_IDS + [5, [], True, {}],
    "wait_timeout": NUMBERS[:3]
    + [NAN, INF, -INF, 1e308, command_args.MAX_WAIT_TIMEOUT + 1, 10**30, "5", True, [], {}, -5],
}
RESERVE_BAD = {name: TURN_BAD[name] for name in ("id", "key", "holder", "wait_timeout")}
CANCEL_BAD = {"id": BAD_IDS + [None, *WRONG_TYPES]}
SEND_BAD = {
    "id": BAD_IDS + [None, *WRONG_TYPES],
    "data": [5, None, [], True, {}, 1.5, NAN],
    "eof": ["yes", 1, 0, None, [], "true", 1.0],
}
REAP_BAD = {"key": BAD_KEYS + WRONG_TYPES}
PAUSE_BAD = {  # one of for/until, each a finite number (for > 0)
    "id": BAD_IDS + [5, 1.5, True, [], {}],
    "key": BAD_KEYS + [None, *WRONG_TYPES],
    "for": [0, -1, NAN, "1s", True, [], {}, None, 1e12],
    "until": ["2026-12-01", True, NAN, [], {}, 1.0],
    "reason": [5, [], {}, True, "x" * 2000],
    "by": [5, [], {}, "x" * 300],
}
RESUME_BAD = {"key": BAD_KEYS + [None, *WRONG_TYPES], "reason": [5, [], {}, "x" * 2000]}
EXTRA_FIELDS = [{"bogus": 1}, {"../x": 1}, {"": None}, {"a/b": "c"}, {"x" * 200: 1}, {"\ud800": 1}]
BAD_VERSIONS = [0, 2, -1, "1", None, True, 1.0, 1.5, NAN, [], {}, 1 << 64]
BAD_ENVELOPE_IDS = ["", "x" * 129, "x" * 200, None, [], {}, True, NAN, 1.5, {"id": "x"}]
UNKNOWN_COMMANDS = [
    "",
    "STATUS",
    "Status",
    "bogus",
    "status ",
    " status",
    "../quit",
    "quit/",
    "turn.",
    "x" * 10000,
    "\ud800",
    "run",
    "stop",
    "kill",
    "exec",
    "status\0",
    "request.turn",
    "q",
]
COMMANDS_FUZZED = ("turn", "reserve", "cancel", "send", "ps", "reap", "status", "reload", "quit")
COMMANDS_FUZZED += ("pause", "resume")


class Fuzzer:
    """Makes the malformed messages. Every turn-like request has a fresh id (so a reply or a
    rejection is attributable); `reused` ids are shared on purpose by different requests."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.n = 0
        self.reused = [f"reused-{i}" for i in range(5)]

    def fresh(self, prefix: str = "f") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def pick(self, values):
        return values[self.rng.randrange(len(values))]

    def envelope_id(self) -> str:
        return self.pick(self.reused) if self.rng.random() < 0.05 else self.fresh("r")

    # -- valid bases (never sent as they are) --

    def base_args(self, cmd: str) -> dict:
        if cmd == "turn":
            return {
                "id": self.fresh("t"),
                "key": "codex",
                "argv": ["sleep", "60"],
                "cwd": "/",
                "env": {"CCSUP_FUZZ": "1"},
                "holder": {"session": "s", "agent": "a"},
                "wait_timeout": 30,
            }
        if cmd == "reserve":
            return {
                "id": self.fresh("v"),
                "key": "codex",
                "holder": {"session": "s", "agent": "a"},
                "wait_timeout": 30,
            }
        if cmd == "cancel":
            return {"id": self.fresh("c")}
        if cmd == "send":
            return {"id": self.fresh("s"), "data": "x", "eof": False}
        if cmd == "reap":
            return {"key": "codex"}
        if cmd == "pause":
            return {"id": self.fresh("p"), "key": "codex", "for": 1, "reason": "fuzz"}
        if cmd == "resume":
            return {"key": "codex", "reason": "fuzz"}
        return {}

    def bad_args(self, cmd: str, *, keep_id: bool = False) -> dict:
        """The base args of cmd with exactly one field wrong (or one unknown field added);
        keep_id: not the id (the bus needs a good one to answer to)."""
        args = self.base_args(cmd)
        table = {
            "turn": TURN_BAD,
            "reserve": RESERVE_BAD,
            "cancel": CANCEL_BAD,
            "send": SEND_BAD,
            "reap": REAP_BAD,
            "pause": PAUSE_BAD,
            "resume": RESUME_BAD,
        }.get(cmd)
        fields = sorted(name for name in table or () if not (keep_id and name == "id"))
        if not fields or self.rng.random() < 0.15:
            args.update(self.pick(EXTRA_FIELDS))
            return args
        name = self.pick(fields)
        args[name] = self.pick(table[name])
        return args

    # -- control frames --

    def control_payload(self) -> tuple[bytes, str | None]:
        """One control frame and the error code it must get (None: any code)."""
        r = self.rng.random()
        if r < 0.45:  # a known command, one argument wrong
            cmd = self.pick(COMMANDS_FUZZED)
            return json.dumps(
                {"v": 1, "id": self.envelope_id(), "cmd": cmd, "args": self.bad_args(cmd)}
            ).encode(), None
        if r < 0.60:  # the envelope wrong
            cmd = self.pick(COMMANDS_FUZZED)
            request = {"v": 1, "id": self.envelope_id(), "cmd": cmd, "args": self.base_args(cmd)}
            field = self.pick(["v", "id", "cmd", "args", "drop"])
            if field == "v":
                request["v"] = self.pick(BAD_VERSIONS)
                return json.dumps(request).encode(), "unsupported_version"
            if field == "id":
                request["id"] = self.pick(BAD_ENVELOPE_IDS)
            elif field == "cmd":
                request["cmd"] = self.pick([None, 5, [], {}, True, 1.5])
            elif field == "args":
                request["args"] = self.pick([5, "x", [], True, 1.5, [{"key": "codex"}]])
            else:
                del request[self.pick(["v", "id", "cmd"])]
            return json.dumps(request).encode(), None
        if r < 0.68:
            request = {
                "v": 1,
                "id": self.envelope_id(),
                "cmd": self.pick(UNKNOWN_COMMANDS),
                "args": {},
            }
            return json.dumps(request).encode(), "unknown_command"
        if r < 0.80:
            return self.garbage(), None
        if r < 0.88:  # numbers and nesting in raw JSON text that json.dumps would not write
            return self.raw_numbers(), None
        if r < 0.94:
            return self.nested(), None
        # duplicate keys: the last one wins, and it is wrong
        rid = self.envelope_id()
        return (
            f'{{"v":1,"id":"{rid}","cmd":"status","cmd":"{self.pick(["bogus", "STATUS", "quit "])}"}}'.encode(),
            "unknown_command",
        )

    def garbage(self) -> bytes:
        kind = self.rng.randrange(9)
        if kind == 0:
            return self.rng.randbytes(self.rng.randrange(1, 300))
        if kind == 1:  # invalid UTF-8, also inside an otherwise good request
            return self.pick(
                [
                    b"\xff",
                    b"\xc3\x28",
                    b"\xed\xa0\x80",
                    b'{"v":1,"id":"\xff\xfe","cmd":"status"}',
                    b'{"v":1,"id":"a","cmd":"st\xc0\xafatus"}',
                    b"\xef\xbb\xbf{}",
                ]
            )
        if kind == 2:  # truncated
            whole = json.dumps(
                {"v": 1, "id": self.fresh("r"), "cmd": "turn", "args": self.bad_args("turn")}
            ).encode()
            return whole[: self.rng.randrange(1, len(whole) - 1)]
        if kind == 3:  # JSON, not an object
            return self.pick(
                [
                    b"[]",
                    b"1",
                    b'"x"',
                    b"null",
                    b"NaN",
                    b"true",
                    b"-Infinity",
                    b'[{"v":1}]',
                    b"1e999",
                ]
            )
        if kind == 4:
            return self.pick(
                [b" ", b"\n\t", b"{", b"}", b'{"v":1,}', b"{'v':1}", b'{"v":1 "id":"a"}']
            )
        if kind == 5:
            return (
                b'{"v":1,"id":"'
                + self.fresh("r").encode()
                + b'","cmd":"status","args":{"a":'
                + b"[" * 3
                + b"}"
            )
        if kind == 6:  # a NUL and control characters
            return b'{"v":1,"id":"a\x00b","cmd":"status"}'
        if kind == 7:  # lone surrogates, legal JSON escapes that UTF-8 cannot carry
            return json.dumps(
                {
                    "v": 1,
                    "id": self.pick(["\ud800", "ok\udfff", self.fresh("r")]),
                    "cmd": self.pick(["\ud800", "bogus"]),
                    "args": {"\udc00": "\ud800"},
                }
            ).encode()
        return bytes(self.rng.randrange(32, 127) for _ in range(self.rng.randrange(1, 200)))

    def raw_numbers(self) -> bytes:
        rid = self.fresh("n")
        number = self.pick(
            [
                "NaN",
                "Infinity",
                "-Infinity",
                "-0",
                "1e999",
                "-1e999",
                "9" * 5000,
                "1e-400",
                "0.0000001",
                "18446744073709551617",
                "-9223372036854775809",
                "1.0",
                "1E2",
                "0x10",
            ]
        )
        field = self.pick(["wait_timeout", "v", "id", "holder.pid", "holder.start"])
        args = '"key":"codex","argv":["sleep","60"]'
        if field == "v":
            return f'{{"v":{number},"id":"{rid}","cmd":"turn","args":{{{args}}}}}'.encode()
        if field == "id":
            return f'{{"v":1,"id":{number},"cmd":"turn","args":{{{args}}}}}'.encode()
        if field == "wait_timeout":
            args += f',"wait_timeout":{number}'
        else:
            args += f',"holder":{{"{field.split(".")[1]}":{number}}}'
        if (field, number) in (
            ("wait_timeout", "1.0"),
            ("wait_timeout", "1E2"),
            ("wait_timeout", "0.0000001"),
            ("holder.start", "-0"),
        ):  # sane values: make the turn bad elsewhere
            args += ',"cwd":"relative"'
        return f'{{"v":1,"id":"{rid}","cmd":"turn","args":{{{args}}}}}'.encode()

    def nested(self) -> bytes:
        depth = self.pick([50, 500, 5000, 200_000])
        if self.rng.random() < 0.5:
            return b"[" * depth + b"]" * depth
        # a deep value inside a field of an otherwise good turn
        return (
            b'{"v":1,"id":"' + self.fresh("d").encode() + b'","cmd":"turn","args":{"key":"codex",'
            b'"argv":["sleep","60"],"env":' + b'{"A":' * depth + b'"x"' + b"}" * depth + b"}}"
        )

    def control_message(self) -> tuple[list[bytes], str | None]:
        """Frames a DEALER sends (an empty first frame makes it look like a REQ peer)."""
        r = self.rng.random()
        if r < 0.05:  # wrong frame counts: 0 (only a delimiter), 2, 5 frames
            good = protocol.encode_request(self.fresh("g"), "status")
            frames = self.pick(
                [
                    [b""],
                    [good, good],
                    [good] * 5,
                    [b"", good, good],
                    [b"", b"", b""],
                    [good, b""],
                    [b"", b""] + [good] * 3,
                ]
            )
            return frames, "bad_request"
        payload, code = self.control_payload()
        return ([b"", payload] if r < 0.25 else [payload]), code

    # -- bus --

    def bus_message(self) -> tuple[list[bytes], str | None]:
        """Frames for bus-in and the id whose `rejected` event must follow (None: no event)."""
        r = self.rng.random()
        if r < 0.45:  # a request with a good id and one bad field
            kind = self.pick(["turn", "reserve", "cancel", "pause"])
            body = self.bad_args(kind, keep_id=True)
            body["id"] = self.fresh("b")
            if self.rng.random() < 0.2:
                body.update(
                    self.pick(
                        [
                            {"v": 2},
                            {"v": "1"},
                            {"v": None},
                            {"v": 1.0},
                            {"ts": "now"},
                            {"ts": NAN},
                            {"ts": [1]},
                        ]
                    )
                )
            elif kind == "cancel":
                body.update(
                    self.pick(EXTRA_FIELDS + [{}])
                )  # {}: a good cancel of nothing, not_found
            body.setdefault("v", 1)
            return [f"request.{kind}".encode(), json.dumps(body).encode()], body["id"]
        if r < 0.55:  # a request with a bad id: nobody to answer
            kind = self.pick(["turn", "reserve", "cancel"])
            body = self.bad_args(kind) if self.rng.random() < 0.5 else self.base_args(kind)
            body["id"] = self.pick(BAD_IDS[:-1] + [None, 5, [], {}])
            if body["id"] is None:
                del body["id"]
            return [f"request.{kind}".encode(), json.dumps(body).encode()], None
        if r < 0.65:  # a good request, badly framed
            good = json.dumps({"v": 1, **self.base_args("turn")}).encode()
            return self.pick(
                [
                    [b"request.turn"],
                    [b"request.turn", good, b"x"],
                    [b"request.turn"] + [good] * 4,
                    [b"request.turn\xff", good],
                    [b"request.turn" + b"x" * 600, good],
                    [b"", good, good],
                ]
            ), None
        if r < 0.75:  # bodies that are not JSON objects
            body = self.pick([self.garbage(), self.nested(), b"", b"[]", b"null", b"NaN"])
            return [self.pick([b"request.turn", b"request.reserve", b"request.cancel"]), body], None
        if r < 0.85:  # topics nobody serves, and forged hints for turns that do not exist
            topic = self.pick(
                [
                    "fuzz.x",
                    "",
                    "request.",
                    "request",
                    "request.quit",
                    "request.status",
                    "REQUEST.TURN",
                    "request.turn.x",
                    "request..turn",
                    "guard.x.gone",
                    "guard.x.exited",
                    "guard..gone",
                    "guard.a/b.gone",
                    "ccsup.hello.x",
                    "..",
                    "a/b",
                    "\ud800x",
                    "x" * 500,
                ]
            )
            body = {"v": 1, **self.base_args("turn")}
            return [topic.encode(errors="surrogatepass"), json.dumps(body).encode()], None
        # forged events of topics only the supervisor speaks
        forged_id = self.fresh("forged")
        topic = self.pick(
            [
                f"turn.{forged_id}.released",
                f"turn.{forged_id}.queued",
                f"turn.{forged_id}.rejected",
                f"turn.{forged_id}.exited",
                "supervisor.stopping",
                "supervisor.reloaded",
                "slot.codex.reaped",
                "slot.codex.orphaned",
                "turn.",
                "slot.",
                "supervisor.",
            ]
        )
        return [
            topic.encode(),
            json.dumps({"v": 1, "ts": time.time(), "seq": 1, "id": forged_id}).encode(),
        ], None


# -- helpers --------------------------------------------------------------------------------------


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def expected_echo(frames: list[bytes]) -> object:
    """The id the error reply must carry, as the test can tell it, or ANY."""
    rest = frames[1:] if frames and frames[0] == b"" else frames
    if len(rest) != 1 or len(rest[0]) > protocol.MAX_FRAME:
        return ANY
    try:
        obj = json.loads(rest[0])
    except (ValueError, RecursionError):
        return ANY
    if isinstance(obj, dict) and isinstance(obj.get("id"), str) and 1 <= len(obj["id"]) <= 128:
        return obj["id"]
    return ANY


def bus_expect(frames: list[bytes]) -> str | None:
    """The id whose `rejected` event this bus message must bring, as the test can tell it."""
    if len(frames) != 2 or frames[0].decode(errors="replace") not in protocol.REQUEST_TOPICS:
        return None
    if len(frames[1]) > protocol.MAX_FRAME:
        return None
    try:
        body = json.loads(frames[1])
    except (ValueError, RecursionError):
        return None
    if (
        isinstance(body, dict)
        and isinstance(body.get("id"), str)
        and protocol.TURN_ID.match(body["id"])
    ):
        return body["id"]
    return None


def padded(payload: bytes, size: int) -> bytes:
    """A valid JSON document of exactly `size` bytes (trailing whitespace is legal JSON)."""
    return payload + b" " * (size - len(payload))


class Replies:
    """Checks every control reply: an error with a known code; tallies ids and codes."""

    def __init__(self):
        self.count = 0
        self.ids = collections.Counter()
        self.codes = collections.Counter()
        self.problems: list[str] = []

    def take(self, frames: list[bytes]) -> dict:
        self.count += 1
        try:
            reply = json.loads(frames[-1])
        except ValueError:
            self.problems.append(f"a reply that is not JSON: {frames[-1][:200]!r}")
            return {}
        error = reply.get("error") or {}
        if reply.get("ok") is not False or error.get("code") not in protocol.ERROR_CODES:
            self.problems.append(f"not an error reply with a known code: {frames[-1][:300]!r}")
        if not isinstance(error.get("message"), str) or not error.get("message"):
            self.problems.append(f"an error without a message: {frames[-1][:300]!r}")
        if len(frames) not in (1, 2) or (len(frames) == 2 and frames[0] != b""):
            self.problems.append(f"a reply with a bad envelope: {[f[:40] for f in frames]}")
        if isinstance(reply.get("id"), str):
            self.ids[reply["id"]] += 1
        self.codes[error.get("code")] += 1
        return reply


def run_dealer(sock: zmq.Socket, messages: list[list[bytes]], replies: Replies, d) -> None:
    """Send everything with at most WINDOW unanswered, then wait for the rest of the replies."""

    def where() -> str:
        code = d.proc.poll()
        last = messages[sent - 1] if sent else []
        return (
            f"{sent - replies.count} of {sent} requests unanswered; the supervisor "
            + ("still runs" if code is None else f"EXITED with {code}")
            + f"; last sent: {[f[:100] for f in last]}"
        )

    sent = 0
    for frames in messages:
        sock.send_multipart(frames)
        sent += 1
        while sent - replies.count > WINDOW:
            assert sock.poll(10_000), f"no reply for 10 s: {where()}"
            replies.take(sock.recv_multipart())
    deadline = time.monotonic() + 30
    while replies.count < sent:
        left = deadline - time.monotonic()
        assert left > 0 and sock.poll(int(left * 1000)), f"no reply for 30 s: {where()}"
        replies.take(sock.recv_multipart())
    if sock.poll(300):  # exactly one reply each: nothing more may come
        replies.take(sock.recv_multipart())
        pytest.fail("a request got more than one reply")


def tree(root) -> dict:
    """Every file under root with its content (logs and the history excepted: they are expected
    to grow; the history's rows of rejected requests are checked on their own)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel in ("daemon.stderr", "ccsup.log") or rel.startswith(("ccsup.log.", "history.")):
                continue
            try:
                found[rel] = open(path, "rb").read() if os.path.isfile(path) else "<socket>"
            except OSError as e:
                found[rel] = f"<{e.strerror}>"
        found.update(
            {os.path.relpath(os.path.join(dirpath, d), root) + "/": "<dir>" for d in dirnames}
        )
    return found


# -- the test -------------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_ten_thousand_malformed_messages_change_nothing(daemon, event_log, state_dir):
    d = daemon(caps="codex = 2")
    log = event_log(d)
    pid = d.proc.pid
    fuzz = Fuzzer(SEED)
    ctx = zmq.Context()
    control_endpoint = f"ipc://{state_dir}/control"
    bus_in = f"ipc://{state_dir}/bus-in"
    figures: dict = {"seed": SEED}
    try:
        with d.client() as client:
            before_status = client.status()
            before_ps = client.ps()
        assert before_status["turns"] == 0 and before_status["waits"] == 0
        before_tree = tree(state_dir)

        pub = ctx.socket(zmq.PUB)
        pub.sndhwm = 0  # queue rather than drop: every message must reach the supervisor
        pub.connect(bus_in)
        ping = f"fuzz.ping.{uuid.uuid4().hex}"
        wait_until(
            lambda: pub.send_multipart([ping.encode(), b"{}"]) or log.find(ping),
            timeout=10,
            interval=0.05,
            what="the fuzzing PUB to be connected",
        )
        rss_before = rss_kib(pid)
        started = time.monotonic()

        # 1. DEALER: malformed requests in windows, plus frames over MAX_FRAME that must not be
        #    parsed (a valid `status` padded past the limit: parsed, it would be answered ok).
        dealer = ctx.socket(zmq.DEALER)
        dealer.rcvhwm = dealer.sndhwm = 0
        dealer.connect(control_endpoint)
        messages, expected_codes = [], collections.Counter()
        for _ in range(8000):
            frames, code = fuzz.control_message()
            messages.append(frames)
            if code:
                expected_codes[code] += 1
        oversized = [
            [padded(protocol.encode_request("big-1", "status"), protocol.MAX_FRAME + 1)],
            [b"", padded(protocol.encode_request("big-2", "status"), protocol.MAX_FRAME + 1)],
            [padded(protocol.encode_request("big-3", "status"), 3 * MiB)],
        ]
        for i, frames in enumerate(oversized):
            messages.insert(1000 + 2000 * i, frames)
        expected_ids = collections.Counter(e for e in map(expected_echo, messages) if e is not ANY)
        replies = Replies()
        run_dealer(dealer, messages, replies, d)
        assert replies.problems == [], replies.problems[:10]
        assert replies.count == len(messages)
        assert replies.ids == expected_ids, (replies.ids - expected_ids, expected_ids - replies.ids)
        # every single frame over MAX_FRAME (the padded statuses and the deepest nestings) and no other
        too_large = sum(
            1 for m in messages if len(m[-1]) > protocol.MAX_FRAME and len(m) - (m[0] == b"") == 1
        )
        assert too_large > len(oversized) and replies.codes["too_large"] == too_large
        for code, n in expected_codes.items():
            assert replies.codes[code] >= n, (code, n, replies.codes)
        figures["dealer"] = len(messages)

        # 2. REQ: one at a time, strict send/recv, some of them multi-frame.
        req = ctx.socket(zmq.REQ)
        req.connect(control_endpoint)
        req_replies = Replies()
        req_sent = 0
        for _ in range(1000):
            frames, _code = fuzz.control_message()
            if frames[0] == b"":  # the REQ socket adds its own delimiter
                frames = frames[1:] or [b""]
            req.send_multipart(frames)
            req_sent += 1
            assert req.poll(10_000), (
                f"no reply to {[f[:80] for f in frames]} (supervisor exit: {d.proc.poll()})"
            )
            req_replies.take(req.recv_multipart())
        assert req_replies.problems == [] and req_replies.count == req_sent
        figures["req"] = req_sent

        # 3. The bus: bad requests with an id get a rejected event; everything else gets nothing.
        bus_sent, must_reject = 0, collections.Counter()
        for _ in range(3500):
            frames, reject_id = fuzz.bus_message()
            pub.send_multipart(frames)
            bus_sent += 1
            # Garbage that happens to parse with a good id is answered too: the test's own reading.
            reject_id = bus_expect(frames) if reject_id is None else reject_id
            if reject_id:
                must_reject[reject_id] += 1
        # ids reused by different bad requests: each request is answered, none is run
        for body in (
            {"key": "../x", "argv": ["sleep", "60"]},
            {"key": "codex", "argv": []},
            {"key": "codex", "argv": ["sleep", "60"], "env": False},
        ):
            pub.send_multipart(
                [b"request.turn", json.dumps({"v": 1, "id": "bus-reused", **body}).encode()]
            )
            bus_sent += 1
        # over MAX_FRAME: a good turn request padded past the limit must not be parsed, so not run
        for size in (protocol.MAX_FRAME + 1, 3 * MiB):
            body = json.dumps(
                {"v": 1, "id": fuzz.fresh("big"), "key": "codex", "argv": ["sleep", "60"]}
            ).encode()
            pub.send_multipart([b"request.turn", padded(body, size)])
            bus_sent += 1
        done = f"fuzz.done.{uuid.uuid4().hex}"
        pub.send_multipart([done.encode(), b"{}"])
        log.wait_for(done, timeout=60)
        figures["bus"] = bus_sent
        figures["seconds"] = round(time.monotonic() - started, 1)

        # 4. Over MAXMSGSIZE (8 MiB): the peer is dropped, nothing is answered or parsed.
        huge = padded(protocol.encode_request("huge-1", "status"), 9 * MiB)
        dropped = ctx.socket(zmq.DEALER)
        dropped.connect(control_endpoint)
        dropped.send(huge)
        assert not dropped.poll(1500), "a 9 MiB request was answered: it was read"
        dropped.close(linger=0)
        huge_pub = ctx.socket(zmq.PUB)
        huge_pub.connect(bus_in)
        for _ in range(3):  # the first may leave before the connection is up
            huge_pub.send_multipart(
                [
                    b"request.turn",
                    padded(
                        json.dumps(
                            {"v": 1, "id": "huge-bus", "key": "codex", "argv": ["sleep", "60"]}
                        ).encode(),
                        9 * MiB,
                    ),
                ]
            )
            time.sleep(0.2)
        huge_pub.close(linger=0)
        done2 = f"fuzz.done.{uuid.uuid4().hex}"
        pub.send_multipart([done2.encode(), b"{}"])
        log.wait_for(done2, timeout=30)

        # Still up, and nothing changed.
        assert d.proc.poll() is None
        rss_after = rss_kib(pid)
        with d.client() as client:
            status = client.status()
            ps = client.ps()
        rejected = [t for t in log.topics("turn.") if t.endswith(".rejected")]
        rejected_ids = collections.Counter(t.split(".")[1] for t in rejected)
        figures.update(
            control_replies=replies.count + req_replies.count,
            rejected_events=len(rejected),
            bus_rejected_count=status.get("bus_rejected"),
            rss_before_kib=rss_before,
            rss_after_kib=rss_after,
        )
        figures["total"] = figures["dealer"] + figures["req"] + figures["bus"] + 4
        print("\nFUZZ " + json.dumps(figures))

        assert status["pid"] == pid and status["turns"] == 0 and status["waits"] == 0
        assert [s for s in ps["slots"] if s["state"] != "free"] == [] and ps["waits"] == []
        assert ps == before_ps
        assert [t for t in log.topics("turn.") if not t.endswith(".rejected")] == []
        assert log.topics("slot.") == []
        # each rejected request's end is announced once on the supervisor family, nothing else
        assert log.topics("supervisor.") == ["supervisor.turn_ended"] * len(rejected)
        reused = rejected_ids.pop("bus-reused", 0)
        assert 1 <= reused <= 3
        assert rejected_ids == must_reject, (rejected_ids - must_reject, must_reject - rejected_ids)
        assert os.listdir(state_dir / "turns") == [] and os.listdir(state_dir / "guards") == []
        assert tree(state_dir) == before_tree
        from supervisor.history import db as history

        wait_until(
            lambda: (
                {r["id"] for r in history.query(state_dir, limit=10**6)}
                == {t.split(".")[1] for t in rejected}
            ),
            what="the history of every rejected request",
        )
        assert {r["outcome"] for r in history.query(state_dir, limit=10**6)} == {"rejected"}
        assert rss_after - rss_before < 50 * 1024, (
            f"RSS grew from {rss_before} KiB to {rss_after} KiB"
        )
        assert figures["total"] >= 10_000
    finally:
        ctx.destroy(linger=0)


@pytest.mark.timeout(30)
def test_a_bug_in_a_handler_costs_one_answer_not_the_sockets(state_dir):
    """Defence in depth: whatever a handler raises, the request still gets a `failed` reply and the
    control and bus loops keep serving."""
    from supervisor.daemon.server import Server

    async def scenario():
        server = Server(
            f"ipc://{state_dir}/control", f"ipc://{state_dir}/bus-in", f"ipc://{state_dir}/bus-out"
        )
        server.bind()
        seen: list[str] = []

        async def on_request(request):
            if request.cmd == "ps":
                raise RuntimeError("a bug")
            return {"answered": request.cmd}

        def on_bus(topic, body):
            seen.append(topic)
            if topic == "x.boom":
                raise RuntimeError("a bug")

        server.start(on_request, on_bus, lambda *args: None)
        dealer = server.ctx.socket(zmq.DEALER)
        pub = server.ctx.socket(zmq.PUB)
        try:
            dealer.connect(f"ipc://{state_dir}/control")
            pub.connect(f"ipc://{state_dir}/bus-in")
            replies = []
            for req_id, cmd in (("a\ud800", "ps"), ("b", "ps"), ("c", "status")):
                await dealer.send(protocol.encode_request(req_id, cmd))
                replies.append(json.loads(await asyncio.wait_for(dealer.recv(), 5)))
            assert [(r["id"], r["ok"], r.get("error", {}).get("code")) for r in replies] == [
                ("a\ud800", False, "failed"),
                ("b", False, "failed"),
                ("c", True, None),
            ]
            deadline = time.monotonic() + 5
            while "x.ping" not in seen:  # a new PUB drops what it sends before it is connected
                assert time.monotonic() < deadline
                await pub.send_multipart([b"x.ping", b"{}"])
                await asyncio.sleep(0.02)
            await pub.send_multipart([b"x.boom", b"{}"])
            await pub.send_multipart([b"x.after", b"{}"])
            while "x.after" not in seen:
                assert time.monotonic() < deadline, seen[-5:]
                await asyncio.sleep(0.01)
            assert seen[-2:] == ["x.boom", "x.after"] and server.rejected_bus_messages == 1
        finally:
            dealer.close(linger=0)
            pub.close(linger=0)
            server.close()

    asyncio.run(scenario())
