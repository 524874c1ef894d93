"""pause_on's stderr scanner alone: matching off the event loop, in a matcher process."""

from __future__ import annotations

import os
import queue
import re
import time

import pytest
from conftest import wait_until

from supervisor.admission import pause_on
from supervisor.admission.pause_on import PauseRules, StderrScanner, retry_after
from supervisor.config.admission import PauseRule


@pytest.fixture
def scanner():
    answers: queue.Queue = queue.Queue()

    def call_soon(callback, *args):  # the loop's call_soon_threadsafe, run at once here
        callback(*args)

    s = StderrScanner(
        lambda *a: answers.put(("match", a)), lambda *a: answers.put(("done", a)), call_soon
    )
    s.answers = answers  # type: ignore[attr-defined]
    yield s
    s.close()


def next_kind(s, timeout=10.0):
    return s.answers.get(timeout=timeout)


def test_a_match_across_two_chunks_is_found_and_a_later_retry_after_refines_it(scanner):
    scanner.watch("t", re.compile(r"rate.?limit"), "ctx")
    scanner.feed("t", b"error: rate")
    watch = scanner._watches["t"]  # white-box: the first chunk scanned on its own, no match
    wait_until(lambda: not (watch.pending or watch.scanning), what="the first chunk scanned")
    assert scanner.answers.empty()
    scanner.feed("t", b" limit exceeded\n")
    assert next_kind(scanner) == ("match", ("t", "ctx", None, False))
    scanner.feed("t", b"Retry-After: 12\n")
    assert next_kind(scanner) == ("match", ("t", "ctx", 12.0, True))
    scanner.feed("t", b"rate limit again, Retry-After: 99\n")  # a turn pauses its key once
    assert scanner.finish("t") is False  # nothing more to scan: the key need not wait
    assert scanner.answers.empty()


def test_a_retry_after_before_the_match_sets_the_length_at_once(scanner):
    scanner.watch("t", re.compile("429"), None)
    scanner.feed("t", b"Retry-After: 30\nHTTP 429\n")
    assert next_kind(scanner) == ("match", ("t", None, 30.0, False))
    assert scanner.finish("t") is False


def test_an_ended_turn_is_done_at_once_or_once_its_text_was_scanned(scanner):
    assert scanner.finish("nobody") is False
    scanner.watch("idle", re.compile("429"), None)
    assert scanner.finish("idle") is False  # wrote nothing: nothing to wait for
    scanner.watch("t", re.compile("429"), None)
    scanner.feed("t", b"all good\n")
    if scanner.finish("t"):  # its text not scanned yet: done comes once it is
        assert next_kind(scanner) == ("done", ("t", None))
    assert scanner.answers.empty()


def test_a_pattern_that_runs_too_long_is_killed_and_counts_as_no_match(scanner, monkeypatch):
    monkeypatch.setattr(pause_on, "SEARCH_TIMEOUT", 0.3)
    scanner.watch("slow", re.compile(r"(x+x+)+y"), None)
    scanner.feed("slow", b"x" * 40)  # hours of backtracking
    scanner.finish("slow")
    started = time.monotonic()
    assert next_kind(scanner) == ("done", ("slow", None))
    assert time.monotonic() - started < 5
    scanner.watch("t", re.compile("429"), None)  # a new matcher serves the next turn
    scanner.feed("t", b"429")
    assert next_kind(scanner) == ("match", ("t", None, None, False))


@pytest.mark.parametrize("megabytes", [1, 10, 100])
def test_feeding_is_constant_work_and_pending_text_is_bounded(scanner, megabytes, monkeypatch):
    """10x and 100x: feeding 100 MiB costs the loop only appends; the matcher sees at most
    PENDING_LIMIT of what waits, and the latest output is kept."""
    sizes = []
    search = pause_on._Matcher.search

    def measured(self, pattern, text):
        sizes.append(len(text))
        return search(self, pattern, text)

    monkeypatch.setattr(pause_on._Matcher, "search", measured)
    scanner.watch("t", re.compile("429"), None)
    chunk = os.urandom(32 * 1024).hex().encode().replace(b"429", b"000")  # 64 KiB, no 429
    started = time.perf_counter()
    for _ in range(megabytes * 16):
        scanner.feed("t", chunk)
    feeding = time.perf_counter() - started
    scanner.feed("t", b"\nHTTP 429\n")
    assert next_kind(scanner, timeout=30) == ("match", ("t", None, None, False))
    assert feeding < 0.05 * megabytes + 0.05, feeding  # appends, not scans
    assert max(sizes) <= pause_on.PENDING_LIMIT + pause_on.TAIL + 64 * 1024


def test_rules_apply_to_the_key_else_each_key_of_the_bare_harness():
    rules = PauseRules({"codex": PauseRule("codex"), "opencode:xai": PauseRule("opencode:xai")})
    assert rules.rule_for("codex:o3").key == "codex"
    assert rules.rule_for("opencode:xai").key == "opencode:xai"
    assert rules.rule_for("opencode:glm") is None
    assert retry_after("Retry-After: 5\nretry-after=7") == 7.0
    assert retry_after("no header") is None
