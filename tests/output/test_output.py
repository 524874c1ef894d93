"""Output on the bus is exact: whole characters, lossless bytes, offsets that tile the log.

Unit tests drive supervisor.output.chunks's splitter over every split position; the end-to-end tests run
real turns under a real supervisor and reassemble their streams with the client's TurnOutput.
"""

from __future__ import annotations

import hashlib
import json
import sys

import pytest

from supervisor.client import OutputGap, RemoteError, TurnOutput
from supervisor.output.chunks import StreamSplitter, complete_length
from supervisor.wire import protocol

MIXED = "aé€😀 中文 z\n".encode()  # 1-, 2-, 3- and 4-byte characters
INVALID = [
    b"\xff",  # never a UTF-8 byte
    b"\x80abc",  # a lone continuation byte
    b"\xc0\x80",  # an overlong NUL
    b"\xed\xa0\x80",  # a surrogate, encoded
    b"\xf4\x90\x80\x80",  # past U+10FFFF
    b"ok\xe4\xb8",  # ends mid-character for good (the stream ends here)
]


def split_all(reads: list[bytes]) -> list:
    splitter = StreamSplitter()
    chunks = [c for data in reads if (c := splitter.feed(data)) is not None]
    last = splitter.finish()
    return chunks + ([last] if last is not None else [])


def wire(chunk) -> tuple[int, bytes]:
    """A chunk as a subscriber gets it: body -> JSON -> body -> (offset, bytes)."""
    body = protocol.output_body("t", chunk.offset, chunk.data, chunk.text)
    return protocol.output_bytes(json.loads(protocol.dumps(body)))


def assert_tiles(chunks: list, expected: bytes) -> None:
    position = 0
    for chunk in chunks:
        offset, data = wire(chunk)
        assert offset == position
        position += len(data)
    assert b"".join(wire(c)[1] for c in chunks) == expected


@pytest.mark.timeout(30)
def test_text_split_at_every_position_arrives_as_whole_characters():
    text = MIXED * 3
    for cut in range(len(text) + 1):
        chunks = split_all([text[:cut], text[cut:]])
        assert all(c.text is not None for c in chunks), cut  # never base64 for valid text
        assert "".join(c.text for c in chunks) == text.decode()
        assert_tiles(chunks, text)
    for a in range(len(MIXED) + 1):  # three reads: every pair of cuts
        for b in range(a, len(MIXED) + 1):
            chunks = split_all([MIXED[:a], MIXED[a:b], MIXED[b:]])
            assert "".join(c.text for c in chunks) == MIXED.decode(), (a, b)
            assert_tiles(chunks, MIXED)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("bad", INVALID, ids=lambda b: b.hex())
def test_bytes_that_are_not_utf8_travel_exactly_at_every_split(bad):
    stream = MIXED + bad + b"\x00tail\x00" + bad
    for cut in range(len(stream) + 1):
        chunks = split_all([stream[:cut], stream[cut:]])
        assert_tiles(chunks, stream)
        assert any(c.text is None for c in chunks)


def test_nul_bytes_are_text_and_survive_json():
    chunks = split_all([b"\x00a\x00\n"])
    assert [c.text for c in chunks] == ["\x00a\x00\n"]
    assert_tiles(chunks, b"\x00a\x00\n")


@pytest.mark.parametrize(
    "data, kept",
    [
        (b"abc", 3),
        (b"ab\xc3", 2),
        (b"ab\xe4\xb8", 2),
        (b"\xf0\x9f\x98", 0),
        (b"\xf0\x9f\x98\x80", 4),
        (b"ab\xe0\x80", 4),  # invalid second byte: nothing to wait for
        (b"ab\xff", 3),
        (b"\x80\x80\x80", 3),
        (b"", 0),
    ],
)
def test_complete_length_holds_back_only_a_completable_tail(data, kept):
    assert complete_length(data) == kept


def test_turn_output_reassembles_refills_a_gap_and_ignores_repeats():
    out = TurnOutput("t")
    assert out.feed("turn.t.started", {"id": "t"}) is None
    assert out.feed("turn.t.stdout", {"offset": 0, "data": "é"}) == ("stdout", "é".encode())
    assert out.feed("turn.t.stdout", {"offset": 0, "data": "é"}) == ("stdout", b"")
    with pytest.raises(OutputGap) as gap:
        out.feed("turn.t.stdout", {"offset": 5, "data_b64": "/w=="})
    assert (gap.value.stream, gap.value.expected, gap.value.got) == ("stdout", 2, 5)
    log = "é".encode() + b"abc\xff"
    filled = TurnOutput("t", fill=lambda stream, start, end: log[start:end])
    filled.feed("turn.t.stdout", {"offset": 0, "data": "é"})
    assert filled.feed("turn.t.stdout", {"offset": 5, "data_b64": "/w=="}) == (
        "stdout",
        b"abc\xff",
    )


@pytest.mark.parametrize(
    "body, words",
    [
        ({"offset": -1, "data": ""}, "offset"),
        ({"offset": True, "data": ""}, "offset"),
        ({"offset": 0, "data_b64": "!!"}, "base64"),
        ({"offset": 0, "data_b64": 5}, "base64"),
        ({"offset": 0, "data": "a", "data_b64": "YQ=="}, "not both"),
        ({"offset": 0, "data": 7}, "'data'"),
    ],
)
def test_a_malformed_output_body_is_refused_naming_the_field(body, words):
    with pytest.raises(protocol.ProtocolError) as err:
        protocol.output_bytes(body)
    assert words in err.value.message


# -- end to end -----------------------------------------------------------------------------------

WRITER = r"""
import os, sys
block = open(sys.argv[1], "rb").read()
size, times = int(sys.argv[2]), int(sys.argv[3])
for _ in range(times):
    view = memoryview(block)
    while view:
        n = os.write(1, view[:size])
        view = view[n:]
"""


def run_and_reassemble(d, turn_id: str, argv: list[str], send: bytes | None = None):
    """Run a turn, hash/collect its stdout from the bus; returns (bytes or digest, chunk count)."""
    out = TurnOutput(turn_id)
    digest, kept, b64_chunks = hashlib.sha256(), bytearray(), 0
    with d.client(timeout=30) as client, client.subscribe([f"turn.{turn_id}."]) as sub:
        client.turn("codex", argv, id=turn_id)
        for topic, body in sub.until_terminal(idle_check=client.check_running):
            if topic.endswith(".started") and send is not None:
                client.send(turn_id, send, eof=True)
            got = out.feed(topic, body)
            if got is not None and got[0] == "stdout":
                digest.update(got[1])
                if len(kept) < 1 << 20:
                    kept += got[1]
                b64_chunks += "data_b64" in body
            if topic.endswith(".exited"):
                assert body["code"] == 0, body
    return digest.hexdigest(), bytes(kept), b64_chunks, out.position["stdout"]


@pytest.mark.timeout(60)
def test_send_takes_bytes_and_a_turn_echoes_them_exactly(daemon, state_dir):
    d = daemon()
    payload = b"\x00\xff\xfe" + MIXED + b"\xe4\xb8" + b"\x00"
    _, kept, b64_chunks, size = run_and_reassemble(d, "echo", ["cat"], send=payload)
    assert kept == payload and size == len(payload)
    assert (state_dir / "turns" / "echo" / "stdout.log").read_bytes() == payload
    assert b64_chunks >= 1
    with d.client() as client:
        for args, words in [
            ({"id": "echo", "data_b64": "%%%"}, "not valid base64"),
            ({"id": "echo", "data": "a", "data_b64": "YQ=="}, "not both"),
        ]:
            with pytest.raises(RemoteError) as err:
                client.call("send", **args)
            assert err.value.code == "bad_request" and words in str(err.value)


@pytest.mark.timeout(180)
def test_a_100_mb_stream_of_mixed_bytes_arrives_exactly_as_logged(daemon, state_dir):
    d = daemon()
    text = ("Grüße, 世界! 😀 naïve café ½ " * 40 + "\n").encode()
    block = text * 256 + b"\xff\x00\xc3" + text * 7 + b"\x80"  # a few invalid bytes per block
    times = (100 << 20) // len(block) + 1
    (state_dir / "block").write_bytes(block)
    expected = hashlib.sha256(block * times).hexdigest()
    argv = [sys.executable, "-c", WRITER, str(state_dir / "block"), "4093", str(times)]
    digest, kept, b64_chunks, size = run_and_reassemble(d, "big", argv)
    assert size == len(block) * times >= 100 << 20
    assert digest == expected
    logged = hashlib.sha256()
    with open(state_dir / "turns" / "big" / "stdout.log", "rb") as f:
        while chunk := f.read(1 << 20):
            logged.update(chunk)
    assert logged.hexdigest() == expected
    assert 0 < b64_chunks <= 2 * times  # only the reads holding the invalid bytes are base64


@pytest.mark.timeout(60)
@pytest.mark.parametrize("tail", [b"\xe4", b"\xe4\xb8", b"\xf0\x9f\x98"], ids=["1", "2", "3"])
def test_a_stream_that_ends_inside_a_character_arrives_whole_before_the_turn_ends(
    daemon, state_dir, tail
):
    d = daemon()
    payload = MIXED + tail
    _, kept, b64_chunks, size = run_and_reassemble(d, "cut", ["cat"], send=payload)
    assert kept == payload and size == len(payload)  # every byte, before `released`
    assert b64_chunks == 1  # only the incomplete tail travels as bytes
