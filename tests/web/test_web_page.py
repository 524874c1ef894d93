"""The live page in a real browser: Debian's chromium, headless, driven by Playwright over CDP.

Each test starts a supervisor and `ccsup web`, opens pages in a chromium that the module's tests
share on their worker (a fresh profile, its own process group, ended by pid at the module's end;
a context of each test's own), and checks what a person would see. The browser is
Debian's /usr/bin/chromium (Playwright downloads none); without it or without the playwright
package the tests skip, saying which is missing.

The main page's screenshot is saved to $CCSUP_ARTIFACTS (default /tmp/ccsup-artifacts).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from conftest import PYTHON, SHARED, SHARED_GROUPS, leftovers, wait_until

from guardd import procs

CHROMIUM = os.environ.get("CCSUP_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("CCSUP_ARTIFACTS", "/tmp/ccsup-artifacts"))
TOKEN = "t0ken-for-the-web-test-" + "x" * 8
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]

try:
    from playwright.sync_api import expect, sync_playwright
except ImportError:  # pragma: no cover - the test extras install it
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.skipif(sync_playwright is None, reason="the playwright package is not installed"),
    pytest.mark.skipif(
        not os.access(CHROMIUM, os.X_OK),
        reason=f"no browser at {CHROMIUM} (apt-get install chromium)",
    ),
    pytest.mark.timeout(90),
]


# -- the pieces -------------------------------------------------------------------------------------


class Web:
    """`ccsup web` as a child of the test; `url` once it serves."""

    def __init__(self, state_dir: Path, config: Path, listen: str = "127.0.0.1:0"):
        self.proc = subprocess.Popen(
            [
                PYTHON,
                "-m",
                "supervisor",
                "--state-dir",
                str(state_dir),
                "--config",
                str(config),
                "web",
                "--listen",
                listen,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        first = self.proc.stdout.readline()  # the handshake: it prints once it listens
        if not first.startswith("ccsup web: serving "):
            self.stop()
            pytest.fail(f"ccsup web did not start: {first}{self.proc.stdout.read()}")
        self.url = first.split()[3]
        self.login_url = None
        if "token" in config.read_text():
            line = self.proc.stdout.readline()
            assert line.startswith("ccsup web: log in once at "), line
            self.login_url = line.split()[-1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


@pytest.fixture
def web(state_dir):
    started: list[Web] = []

    def make(config: Path, listen: str = "127.0.0.1:0") -> Web:
        w = Web(state_dir, config, listen)
        started.append(w)
        return w

    yield make
    for w in started:
        w.stop()


@pytest.fixture(scope="module")
def browser():
    """A headless chromium for this module's tests on one worker (each test opens a context of
    its own: page_of), connected over CDP; its process group is ended. One start a module, not
    one a test: a chromium's start is seconds of CPU."""
    profile = tempfile.mkdtemp(prefix="ccsup-chromium-")
    # Its temporary files (a singleton directory that a SIGKILLed chromium leaves in /tmp) go
    # inside the profile, which is removed below.
    tmp = Path(profile, "tmp")
    tmp.mkdir()
    proc = subprocess.Popen(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    SHARED_GROUPS.add(proc.pid)  # its group outlives each test, not the module
    before = set(leftovers())
    made: set[procs.Identity] = set()
    port_file = Path(profile, "DevToolsActivePort")
    try:
        port = wait_until(
            lambda: port_file.exists() and port_file.read_text().split("\n")[0],
            timeout=30,
            what="chromium's DevTools port",
        )
        with sync_playwright() as pw:
            b = pw.chromium.connect_over_cdp(f"http://127.0.0.1:{port}")
            made = set(leftovers()) - before  # Playwright's driver, chromium's crash handlers
            SHARED.update(made)
            try:
                yield b
            finally:
                b.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        SHARED_GROUPS.discard(proc.pid)
        for ident in made:
            procs.signal_process(ident, signal.SIGKILL)  # gone already, or now
        SHARED.difference_update(made)
        import shutil

        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(autouse=True)
def _contexts_closed(request):
    """The pages a test opened in the module's browser are closed at its end (they poll)."""
    if "browser" not in request.fixturenames:
        yield
        return
    browser = request.getfixturevalue("browser")
    before = list(browser.contexts)  # the browser's default one
    yield
    for context in browser.contexts:
        if context not in before:
            context.close()


def page_of(browser, url: str):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.goto(url)
    return page


def config_file(state_dir: Path, caps: str, web: str = "", slots: str = "") -> Path:
    path = state_dir / "ccsup.toml"
    path.write_text(
        f'[slots]\ncaps = {{ {caps} }}\n{slots}\n[guard]\ngrace = "300ms"\nscan = "200ms"\n{web}'
    )
    return path


def start_supervisor(daemon, state_dir: Path, caps: str, web: str = "", slots: str = ""):
    d = daemon(start=False, caps=caps)
    d.config = config_file(state_dir, caps, web, slots)
    return d.start()


def hold(client, key: str, session: str, agent: str, argv: list[str] | None = None) -> str:
    turn_id = uuid.uuid4().hex
    client.turn(
        key,
        argv or ["sleep", "300"],
        id=turn_id,
        holder={"session": session, "agent": agent},
    )
    return turn_id


def slot_of(client, turn_id: str) -> dict | None:
    return next((s for s in client.ps()["slots"] if s.get("turn") == turn_id), None)


# -- what a person sees -------------------------------------------------------------------------------


def test_a_key_at_its_cap_shows_its_holders(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 2")
    w = web(d.config)
    with d.client() as client:
        first = hold(client, "codex", "s1", "alpha")
        second = hold(client, "codex", "s2", "<i>beta</i>")  # shown as text, never as markup
        wait_until(lambda: slot_of(client, first) and slot_of(client, second), what="both held")
    page = page_of(browser, w.url)
    row = page.locator('#keys tr[data-key="codex"]')
    expect(row.locator(".badge")).to_have_text("full")
    expect(row.locator('[data-field="held"]')).to_have_text("2")
    assert page.locator("#holders i").count() == 0
    for turn_id, who in ((first, "s1 / alpha"), (second, "s2 / <i>beta</i>")):
        holder = page.locator(f'#holders tr[data-turn="{turn_id}"]')
        expect(holder).to_contain_text(who)
        expect(holder).to_contain_text("held")
        # CPU and memory of the turn's processes now (sampled every 2 s while a page is open)
        expect(holder.locator("td").nth(6)).to_have_text(re.compile(r"^\d+(\.\d)? (KiB|MiB)$"))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "web-main.png"), full_page=True)


def test_a_new_waiter_appears_in_the_queue_within_a_second_without_reload(
    daemon, state_dir, web, browser
):
    d = start_supervisor(daemon, state_dir, "codex = 1")
    w = web(d.config)
    with d.client() as client:
        holder = hold(client, "codex", "s1", "alpha")
        page = page_of(browser, w.url)
        expect(page.locator(f'#holders tr[data-turn="{holder}"]')).to_be_visible()
        page.evaluate("window.__same_document = true")  # gone if the page reloads
        asked = time.monotonic()
        waiter = hold(client, "codex", "s2", "beta")
        row = page.locator(f'#queue tr[data-turn="{waiter}"]')
        row.wait_for(timeout=1000)
        seen = time.monotonic() - asked
        expect(row).to_contain_text("s2 / beta")
        assert page.evaluate("window.__same_document") is True
        assert seen < 1.0, seen
        expect(page.locator('#keys tr[data-key="codex"] [data-field="waiting"]')).to_have_text("1")


def test_cancel_from_the_turn_page_ends_the_turn_and_its_work(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 1")
    w = web(d.config)
    pids = state_dir / "pids"
    script = f"sleep 300 & echo $! >> {pids}; echo $$ >> {pids}; wait"
    with d.client() as client:
        turn_id = hold(client, "codex", "s1", "alpha", ["sh", "-c", script])
        wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2, what="pids")
        work = [procs.identity_of(int(p)) for p in pids.read_text().split()]
        assert all(work)
        with client.subscribe([f"turn.{turn_id}."]) as sub:
            page = page_of(browser, f"{w.url}turn/{turn_id}")
            button = page.locator("#cancel")
            expect(button).to_be_enabled()
            button.click()
            topics = []
            while not topics or topics[-1] != f"turn.{turn_id}.released":
                event = sub.recv(15)
                assert event is not None, topics
                topics.append(event[0])
        assert f"turn.{turn_id}.stopping" in topics
        assert [i for i in work if procs.process_running(i)] == []
        assert slot_of(client, turn_id) is None
    expect(page.locator("#cancel-result")).to_have_text("cancel sent")
    expect(page.locator('[data-fact="state"]')).to_have_text("released")
    expect(page.locator("#cancel")).to_be_disabled()


def test_the_timeline_shows_a_finished_turn_and_its_page_the_exact_output(
    daemon, state_dir, web, browser
):
    d = start_supervisor(daemon, state_dir, "codex = 1")
    w = web(d.config)
    page = page_of(browser, w.url)
    expect(page.locator("#conn")).to_have_text("live")
    go = state_dir / "go"
    # Multi-byte characters, a tab, and a second part only after the page has shown the first.
    script = (
        "printf 'héllo wörld\\t✓\\n<b>not bold</b>\\n'; "
        f"while [ ! -e {go} ]; do sleep 0.05; done; printf 'zweite Zeile ∎\\n'; exit 3"
    )
    with d.client() as client:
        turn_id = hold(client, "codex", "s1", "alpha", ["sh", "-c", script])
        turn = page.context.new_page()
        turn.goto(f"{w.url}turn/{turn_id}")
        out = turn.locator("#stdout")
        expect(out).to_have_text("héllo wörld\t✓\n<b>not bold</b>\n")
        go.touch()
        expect(out).to_have_text("héllo wörld\t✓\n<b>not bold</b>\nzweite Zeile ∎\n")
        expect(out).to_have_attribute("data-complete", "true")
        expect(turn.locator('[data-fact="exit"]')).to_contain_text("code 3")
        expect(turn.locator('#events tr[data-topic$=".released"]')).to_have_count(1)
    bar = page.locator(f'#timeline .bar[data-turn="{turn_id}"]')
    expect(bar).to_have_attribute("data-outcome", "released")
    assert page.locator('#timeline .timeline-row[data-key="codex"]').count() == 1


class _OtherSite(http.server.BaseHTTPRequestHandler):
    page = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


def test_a_page_from_another_origin_cannot_cancel(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 1")
    w = web(d.config)
    with d.client() as client, client.subscribe(["turn."]) as started:
        turn_id = hold(client, "codex", "s1", "alpha")
        # Its `started` published, so nothing more of it comes unless the cancel got through.
        while (event := started.recv(15)) is None or event[0] != f"turn.{turn_id}.started":
            assert event is not None, "no started within 15 s"
        cancel = f"{w.url}api/turn/{turn_id}/cancel"
        # Same host, another port: same-site to the browser, another origin.
        _OtherSite.page = f"""<!doctype html><body>
<form id="f" method="post" action="{cancel}" target="sink"></form>
<iframe name="sink"></iframe>
<script>
fetch("{cancel}", {{method: "POST", mode: "no-cors", credentials: "include"}})
  .then(() => document.title = "simple sent", () => document.title = "simple failed")
  .then(() => fetch("{cancel}", {{method: "POST", credentials: "include",
                                  headers: {{"X-Ccsup-Csrf": "guess"}}}}))
  .then(() => document.title = "preflighted sent", () => document.title = "preflighted blocked");
</script></body>""".encode()
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OtherSite)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            with client.subscribe([f"turn.{turn_id}."]) as sub:
                page = page_of(browser, f"http://127.0.0.1:{server.server_address[1]}/")
                expect(page).to_have_title("preflighted blocked")
                page.evaluate("document.getElementById('f').submit()")
                sink = page.frame_locator("iframe[name=sink]").locator("body")
                expect(sink).to_contain_text("must come from this page's origin")
                # The supervisor heard nothing of it: ask ps through the bus's order.
                assert sub.recv(0.5) is None
            assert slot_of(client, turn_id)["state"] == "held"
        finally:
            server.shutdown()
            server.server_close()


def _get(url: str, headers: dict | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_off_loopback_the_token_is_required(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 1", f'[web]\ntoken = "{TOKEN}"\n')
    # 127.0.0.2 is reachable only from this machine, and the token rule is the same on every
    # listen once a token is set; an address that is not loopback without one never binds (below).
    w = web(d.config, "127.0.0.2:0")
    assert w.url.startswith("http://127.0.0.2:")
    status, body = _get(f"{w.url}api/state")
    assert (status, json.loads(body)["error"]) == (
        401,
        "this page needs the [web] token: a bearer token or a login",
    )
    assert _get(f"{w.url}api/state", {"Authorization": "Bearer wrong-token-wrong-token"})[0] == 401
    status, body = _get(f"{w.url}api/state", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(body)["state"]["connected"] in (True, False)
    # Another Host (a rebinding page) is refused even with the token.
    assert (
        _get(f"{w.url}api/state", {"Authorization": f"Bearer {TOKEN}", "Host": "evil.example"})[0]
        == 403
    )

    page = page_of(browser, w.url)
    expect(page.locator("input[name=token]")).to_be_visible()  # the login form, not the state
    page.goto(w.login_url)
    expect(page.locator("#conn")).to_have_text("live")
    assert page.url == w.url
    spent = page.context.browser.new_context().new_page()
    spent.goto(w.login_url)
    expect(spent.locator("body")).to_contain_text("that login code is spent")
    spent.goto(w.url)  # the login form, with the token
    spent.fill("input[name=token]", "wrong-" + TOKEN)
    spent.click("button[type=submit]")
    expect(spent.locator("body")).to_contain_text("wrong token")
    spent.goto(w.url)
    spent.fill("input[name=token]", TOKEN)
    spent.click("button[type=submit]")
    expect(spent.locator("#conn")).to_have_text("live")

    # A listen that is not loopback, without a token, is refused before anything binds.
    plain = config_file(state_dir, "codex = 1")
    refused = subprocess.run(
        [PYTHON, "-m", "supervisor", "--state-dir", str(state_dir), "--config", str(plain)]
        + ["web", "--listen", "192.0.2.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert refused.returncode == 2
    assert "192.0.2.1:0 is not a loopback address, so [web] token must be set" in refused.stderr


def test_a_page_started_later_shows_finished_turns_from_the_history(
    daemon, state_dir, web, browser
):
    pytest.importorskip("supervisor.history.db")
    d = start_supervisor(daemon, state_dir, "codex = 1")
    with d.client() as client:
        turn_id = uuid.uuid4().hex
        events = list(client.run_turn("codex", ["sh", "-c", "echo before; exit 4"], id=turn_id))
        assert events[-1][0] == f"turn.{turn_id}.released"
    from supervisor.history import db as history

    wait_until(
        lambda: any(r["id"] == turn_id for r in history.query(state_dir, limit=10)),
        what="the turn in the history",
    )
    w = web(d.config)  # it never saw the turn on the bus
    page = page_of(browser, w.url)
    bar = page.locator(f'#timeline .bar[data-turn="{turn_id}"]')
    expect(bar).to_have_attribute("data-outcome", "released")
    turn = page.context.new_page()
    turn.goto(f"{w.url}turn/{turn_id}")
    expect(turn.locator('[data-fact="exit"]')).to_contain_text("code 4")
    expect(turn.locator('#events tr[data-topic$=".released"]')).to_have_count(1)
    expect(turn.locator("#stdout")).to_have_text("before\n")
    expect(turn.locator("#cancel")).to_be_disabled()
    from supervisor.paths import StatePaths

    StatePaths(state_dir).output_log(turn_id, "stdout").unlink()  # as [logs] pruning would
    turn.reload()
    expect(turn.locator("#stdout-state")).to_have_text("(no log file: pruned, or never written)")


def test_a_paused_key_shows_until_when_and_its_waiters_why(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 2")
    w = web(d.config)
    page = page_of(browser, w.url)
    row = page.locator('#keys tr[data-key="codex"]')
    expect(row).to_be_visible()
    expect(page.locator("#keys th.pause")).to_be_hidden()  # no pause anywhere: no column
    with d.client() as client:
        paused = client.pause("codex", for_=600, reason="quota")
        waiter = hold(client, "codex", "s1", "alpha")
        expect(row.locator("td.pause")).to_contain_text("(quota)")
        expect(row.locator("td.pause")).to_contain_text(
            page.evaluate(f"ccsup.clock({paused['until']})")
        )
        why = page.locator(f'#queue tr[data-turn="{waiter}"] td.why')
        expect(why).to_contain_text("paused")
        client.resume("codex")
        expect(page.locator(f'#holders tr[data-turn="{waiter}"]')).to_be_visible()
        expect(page.locator("#keys th.pause")).to_be_hidden()


def test_a_rate_held_key_shows_when_it_may_start_again(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 2", slots='rates = { codex = "1/10m" }')
    w = web(d.config)
    page = page_of(browser, w.url)
    row = page.locator('#keys tr[data-key="codex"]')
    expect(row).to_be_visible()
    expect(page.locator("#keys th.rate")).to_be_hidden()
    with d.client() as client:
        first = hold(client, "codex", "s1", "alpha")
        expect(page.locator(f'#holders tr[data-turn="{first}"]')).to_be_visible()
        second = hold(client, "codex", "s2", "beta")  # a free slot, but the window is spent
        expect(page.locator(f'#queue tr[data-turn="{second}"]')).to_be_visible()
        expect(row.locator("td.rate")).to_contain_text("next start in 9 min")


def test_pause_and_resume_buttons_and_the_queues_one_word_why(daemon, state_dir, web, browser):
    d = start_supervisor(daemon, state_dir, "codex = 1")
    w = web(d.config)
    page = page_of(browser, w.url)
    row = page.locator('#keys tr[data-key="codex"]')
    expect(row).to_be_visible()
    with d.client() as client:
        holder = hold(client, "codex", "s1", "alpha")
        waiter = hold(client, "codex", "s2", "beta")
        # The queue says why in one word; the sentence is its title.
        why = page.locator(f'#queue tr[data-turn="{waiter}"] td.why')
        expect(why).to_have_text("key_full")
        holder_row = page.locator(f'#holders tr[data-turn="{holder}"]')
        expect(holder_row.locator("td.command")).to_have_text("sleep 300")
        page.once("dialog", lambda dialog: dialog.accept("5m"))
        row.locator("button.pause-key").click()
        expect(page.locator("#keys-result")).to_contain_text("codex paused until")
        keys = {k["key"]: k for k in client.status()["keys"]}
        assert keys["codex"]["paused"]["reason"] == "paused from the page"
        assert 280 < keys["codex"]["paused"]["until"] - time.time() <= 300
        expect(row.locator("td.pause")).to_contain_text("paused from the page")
        row.locator("button.resume-key").click()
        expect(page.locator("#keys-result")).to_have_text("codex resumed")
        expect(row.locator("button.resume-key")).to_have_count(0)
        assert not any(k.get("paused") for k in client.status()["keys"])


def test_an_adopted_turn_has_a_badge_in_the_running_list(daemon, state_dir, web, browser):
    """a supervisor SIGKILLed and started again adopts the running turn; the page
    marks it "adopted", with when and the gap on hover, and not the turn that started after."""
    d = daemon(caps="codex = 2", adopt_within="30s")
    w = web(d.config)
    with d.client() as client:
        adopted = hold(client, "codex", "s1", "alpha")
    guards = state_dir / "guards"

    def runs() -> bool:  # its command runs (granted but not started, it would be held instead)
        for path in guards.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_text())
                if record.get("turn") == adopted and record.get("own_group"):
                    return True
        return False

    wait_until(runs, what="it runs")
    d.kill()

    def waiting() -> bool:
        for path in guards.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                if json.loads(path.read_text()).get("waiting_since"):
                    return True
        return False

    wait_until(waiting, what="its guard waiting for adoption")
    d.start()
    with d.client() as client:
        later = hold(client, "codex", "s2", "beta")
        wait_until(lambda: slot_of(client, later), what="the later turn held")
    page = page_of(browser, w.url)
    badge = page.locator(f'#holders tr[data-turn="{adopted}"] .badge.adopted')
    expect(badge).to_have_text("adopted")
    expect(badge).to_have_attribute(
        "title", re.compile(r"^adopted at \S+ after a gap of \d+\.\d s$")
    )
    expect(page.locator(f'#holders tr[data-turn="{later}"]')).to_be_visible()
    expect(page.locator(f'#holders tr[data-turn="{later}"] .badge.adopted')).to_have_count(0)
    turn_page = page_of(browser, w.url + "turn/" + adopted)
    expect(turn_page.locator('[data-fact="adopted"]')).to_contain_text("after a gap of")


def test_a_turns_page_lists_its_leftovers_as_text_live_and_from_the_history(
    daemon, state_dir, web, browser
):
    d = start_supervisor(daemon, state_dir, "codex = 1")
    w = web(d.config)
    page = page_of(browser, w.url)
    expect(page.locator("#conn")).to_have_text("live")
    planted = "<i id=planted>left"  # no "/": argv[0] is named by its basename
    script = (
        'setsid bash -c \'trap "" TERM; exec -a "$0" sleep 300\' "$PLANT" '
        "</dev/null >/dev/null 2>&1 & "
        'while [ "$(cat /proc/$!/comm 2>/dev/null)" != sleep ]; do sleep 0.01; done'
    )
    turn_id = uuid.uuid4().hex
    turn = page.context.new_page()
    turn.goto(f"{w.url}turn/{turn_id}")
    with d.client() as client:
        events = list(
            client.run_turn("codex", ["bash", "-c", script], id=turn_id, env={"PLANT": planted})
        )
    (left,) = [b for t, b in events if t.endswith(".leftovers")]
    rows = turn.locator("#leftovers tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text(f"{planted} 300")  # the name, as text
    expect(rows.first).to_contain_text(str(left["names"][0]["pid"]))
    expect(turn.locator("#leftovers-count")).to_have_text("(1)")
    assert turn.locator("#planted").count() == 0  # never parsed as HTML
    w.stop()
    later = page_of(browser, web(d.config).url.rstrip("/") + f"/turn/{turn_id}")  # the history's
    expect(later.locator("#leftovers tbody tr")).to_have_count(1)
    expect(later.locator("#leftovers tbody tr").first).to_contain_text(f"{planted} 300")
    assert later.locator("#planted").count() == 0


def test_a_paused_key_never_run_shows_its_cap_and_a_stopped_supervisor_greys_the_page(
    daemon, state_dir, web, browser
):
    """A key paused before it ever ran (no slot files: no tally) shows its real cap, not 0; once
    the supervisor is stopped, the page says what it shows is the last seen, not live, and its
    pause and resume buttons are off (there is nobody to ask)."""
    d = start_supervisor(daemon, state_dir, "codex = 2", slots="default_cap = 3")
    w = web(d.config)
    page = page_of(browser, w.url)
    with d.client() as client:
        client.pause(
            "fresh", for_=600
        )  # the control command pauses any name (--force is the CLI's)
        hold(client, "fresh", "s1", "alpha")
    row = page.locator('#keys tr[data-key="fresh"]')
    expect(row.locator("td.n").first).to_have_text("3")
    expect(page.locator("#keys-stale")).to_be_hidden()
    expect(row.locator("button.pause-key")).to_be_enabled()
    d.stop()
    expect(page.locator("#holders-stale")).to_contain_text("not live since")
    expect(page.locator("#queue-stale")).to_be_visible()
    expect(row.locator("button.pause-key")).to_be_disabled()
    expect(row.locator("button.resume-key")).to_be_disabled()
