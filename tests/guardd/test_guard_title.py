"""A guard forked by the zygote shows as `ccsup-guard <turn id>` in ps and top, not as the
zygote's command line."""

from __future__ import annotations

from pathlib import Path

from conftest import wait_until


def test_a_forked_guard_is_named_after_its_turn_in_cmdline_and_comm(daemon, event_log):
    d = daemon(grace="300ms")
    log = event_log(d)
    with d.client() as client:
        client.turn("codex", ["sleep", "300"], id="title-t1")
        guard = log.wait_for("turn.title-t1.started")["guard"]["pid"]

        # `started` may come before the forked child has named itself (the zygote answers, then
        # lets it run): wait until the title is set.
        def title() -> list[bytes]:
            return Path(f"/proc/{guard}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")

        wait_until(lambda: title() == [b"ccsup-guard title-t1"], what="the guard's title")
        assert Path(f"/proc/{guard}/comm").read_text() == "ccsup-guard\n"
        client.cancel("title-t1")
        log.wait_for("turn.title-t1.released")
