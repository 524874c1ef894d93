"""`ccsup run`'s stdin, forwarded to its turn, end of input included.

Once the turn has started, one thread reads this process's stdin (os.read, up to CHUNK bytes)
and sends each chunk with the control command `send` over its own client (a zmq socket is not
shared between threads), as `data` when it is UTF-8 and `data_b64` otherwise, so bytes arrive
exactly; at end of input it sends `eof`, which closes the turn's stdin. So
`producer | ccsup run -- consumer` behaves like the bare pipeline and `ccsup run -- cat < file`
prints the file.

Back-pressure: the supervisor queues what the turn's pipe has not taken yet and says how much
(`pending` in the reply); above PENDING_LIMIT the forwarder waits (polling with an empty send)
before it reads more, so a slow consumer never makes the supervisor hold more than about
PENDING_LIMIT + CHUNK bytes of it (under the supervisor's own bound, STDIN_MAX_PENDING in
supervisor.turns.manager; a `busy` answer, when another client fills it, is waited out the same
way). When the turn has ended (the send is refused) the forwarder
stops reading. A terminal as stdin is forwarded too (line by line, as the terminal delivers it).

Across a supervisor's death (`ride_within`, what `ccsup run` waits for one: adopt_within + 5 s):
a send that finds no supervisor, or gets no answer, waits for one to answer again
(supervisor.client.ride_through.await_return) and is sent again there (an adopted turn's stdin
stays open: the guard holds a writer), so the rest of the input and its end still arrive. A
`send` carries no offset, so the one chunk in flight when the supervisor died may arrive twice,
and what the dead supervisor had queued but not written (`pending`) died with it.

Knows file descriptors and the `send` command; nothing of events or exit codes.
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Callable

CHUNK = 64 * 1024
PENDING_LIMIT = 1 << 20
POLL = 0.01  # seconds between polls while the turn's pipe is full


class StdinForwarder:
    def __init__(
        self, make_client: Callable, turn_id: str, fd: int = 0, *, ride_within: float = 0.0
    ):
        self.make_client = make_client  # a new supervisor.client.Client for this thread
        self.turn_id = turn_id
        self.fd = fd
        self.ride_within = ride_within  # seconds a send waits for a supervisor to answer again
        self.sent = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._run, name="ccsup-stdin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        from ...errors import CcsupError

        try:
            with self.make_client() as client:
                while True:
                    try:
                        data = os.read(self.fd, CHUNK)
                    except OSError as e:
                        self.error = f"unable to read stdin: {e.strerror}"
                        data = b""
                    reply = self._send_when_room(client, data, eof=not data)
                    self.sent += len(data)
                    while data and reply.get("pending", 0) > PENDING_LIMIT:
                        time.sleep(POLL)
                        reply = self._send(client, b"", eof=False)
                    if not data:
                        return
        except CcsupError as e:  # the turn ended (or the supervisor went): nothing to write to
            self.error = e.message

    def _send_when_room(self, client, data: bytes, *, eof: bool) -> dict:
        """Send, waiting while the supervisor answers `busy` (the turn's stdin is full: another
        client sends to it too), so nothing read here is dropped."""
        from ...client.control import RemoteError

        while True:
            try:
                return self._send(client, data, eof=eof)
            except RemoteError as e:
                if e.code != "busy":
                    raise
            time.sleep(POLL)

    def _send(self, client, data: bytes, *, eof: bool) -> dict:
        """Send once; again on the next supervisor when this one went away (ride_within)."""
        from ...client.control import RemoteError
        from ...client.ride_through import await_return
        from ...errors import CcsupError

        while True:
            try:
                return self._send_once(client, data, eof=eof)
            except RemoteError:
                raise  # answered: the turn ended, or the send was refused
            except CcsupError:
                if self.ride_within <= 0 or await_return(client, self.ride_within) is None:
                    raise

    def _send_once(self, client, data: bytes, *, eof: bool) -> dict:
        try:
            text = data.decode()
        except UnicodeDecodeError:
            encoded = base64.b64encode(data).decode()
            return client.call("send", id=self.turn_id, data_b64=encoded, eof=eof)
        return client.call("send", id=self.turn_id, data=text, eof=eof)
