"""`ccsup mcp` driven by the MCP SDK's own client over stdio, against a real supervisor: every tool,
the answer bound, progress notifications, resume by id after a reconnect, bad arguments."""

from __future__ import annotations

import json
import os
import time
from contextlib import asynccontextmanager

import anyio
import pytest
from conftest import PYTHON

pytest.importorskip("mcp", reason="the MCP SDK (ccsup[mcp]) is not installed")
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402


@pytest.fixture
def env(daemon, state_dir):
    d = daemon(caps="default = 1")
    return {
        **os.environ,
        "CCSUP_STATE_DIR": str(state_dir),
        "CCSUP_CONFIG": str(d.config),
        "CCSUP_MCP_BOUND": "2",
        "CCSUP_MCP_PROGRESS": "0.4",
        "CCSUP_SESSION": "sess-1",
    }


@asynccontextmanager
async def connected(env):
    params = StdioServerParameters(command=PYTHON, args=["-m", "supervisor", "mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def result(answer) -> dict:
    assert not answer.is_error, answer.content
    if answer.structured_content is not None:
        return answer.structured_content
    return json.loads(answer.content[0].text)


def error_text(answer) -> str:
    assert answer.is_error, answer
    return " ".join(getattr(c, "text", "") for c in answer.content)


def go(coro_fn, *args):
    return anyio.run(coro_fn, *args)


def test_every_tool_is_listed_with_a_description_that_says_to_queue(env):
    async def main(env):
        async with connected(env) as s:
            return (await s.list_tools()).tools

    tools = {t.name: t for t in go(main, env)}
    assert set(tools) == {"run", "wait", "reserve", "status", "ps", "why", "logs", "cancel"}
    assert "never refuses" in tools["run"].description
    assert all(t.description for t in tools.values())


def test_run_answers_the_end_with_code_and_tail_and_history_has_the_session(
    env, state_dir, tmp_path
):
    async def main(env):
        async with connected(env) as s:
            return result(
                await s.call_tool(
                    "run", {"command": "echo out; echo err >&2; pwd; exit 3", "cwd": str(tmp_path)}
                )
            )

    answer = go(main, env)
    assert (answer["state"], answer["exit_code"], answer["outcome"]) == ("ended", 3, "exit")
    assert answer["stdout_tail"] == f"out\n{tmp_path}\n" and answer["stderr_tail"] == "err\n"
    assert answer["session"] == "sess-1"
    from supervisor.history import db

    assert db.show(state_dir, answer["id"])["holder"]["session"] == "sess-1"


def test_a_busy_key_queues_within_the_bound_with_progress_then_wait_resumes_by_id_after_reconnect(
    env, tmp_path
):
    go_file = tmp_path / "go"
    progress: list[tuple[float, str | None]] = []

    async def first(env):
        async with connected(env) as s:
            holder = result(
                await s.call_tool(
                    "run",
                    {
                        "argv": [
                            "sh",
                            "-c",
                            f"while [ ! -e {go_file} ]; do sleep 0.05; done; echo held",
                        ]
                    },
                )
            )

            async def on_progress(p, total, message):
                progress.append((p, message))

            started = time.monotonic()
            queued = result(
                await s.call_tool("run", {"command": "echo second"}, progress_callback=on_progress)
            )
            took = time.monotonic() - started
            why = result(await s.call_tool("why", {"id": queued["id"]}))
            return holder, queued, took, why

    holder, queued, took, why = go(first, env)
    assert holder["state"] == "running" and "call `wait`" in holder["next"]
    assert queued["state"] == "queued" and queued["position"] == 1
    # Within the bound (2 s here): it waits bound - bound/5, then looks and answers.
    assert 1.6 <= took < 4.0, took
    assert len(progress) >= 3 and "queued" in (progress[0][1] or "")
    assert why["state"] == "queued" and why["why"]

    go_file.write_text("")  # the holder ends, the queued one runs; a new connection waits for it

    async def second(env):
        async with connected(env) as s:
            a = result(await s.call_tool("wait", {"id": holder["id"]}))
            b = result(await s.call_tool("wait", {"id": queued["id"]}))
            if b["state"] != "ended":
                b = result(await s.call_tool("wait", {"id": queued["id"]}))
            again = result(await s.call_tool("wait", {"id": queued["id"]}))
            return a, b, again

    a, b, again = go(second, env)
    assert (a["exit_code"], a["stdout_tail"]) == (0, "held\n")
    assert (b["exit_code"], b["stdout_tail"]) == (0, "second\n")
    assert again["id"] == b["id"] and again["stdout_tail"] == "second\n"  # run once, not twice


def test_reserve_status_ps_logs_and_cancel(env):
    async def main(env):
        async with connected(env) as s:
            r1 = result(await s.call_tool("reserve", {"key": "other"}))
            r2 = result(await s.call_tool("reserve", {"key": "other"}))
            st = result(await s.call_tool("status", {}))
            ps = result(await s.call_tool("ps", {}))
            ran = result(await s.call_tool("run", {"command": "printf 0123456789"}))
            part = result(await s.call_tool("logs", {"id": ran["id"], "offset": 3, "limit": 4}))
            long = result(await s.call_tool("run", {"command": "sleep 30", "key": "other2"}))
            result(await s.call_tool("cancel", {"id": long["id"]}))
            ended = result(await s.call_tool("wait", {"id": long["id"]}))
            return r1, r2, st, ps, part, ended

    r1, r2, st, ps, part, ended = go(main, env)
    assert r1["state"] == "held" and r1["next"] == "run now"
    assert r2["reservation"] == r1["reservation"]  # one hold per session and key
    assert "version" in st and "pid" in st
    assert any(slot["key"] == "other" and slot["state"] == "reserved" for slot in ps["slots"])
    assert (part["data"], part["next_offset"], part["size"]) == ("3456", 7, 10)
    assert ended["state"] == "ended" and ended["outcome"] == "cancelled"


def test_bad_arguments_get_a_clear_error_and_nothing_runs(env, state_dir, tmp_path):
    marker = tmp_path / "ran"

    async def main(env):
        async with connected(env) as s:
            errors = []
            for args in (
                {},
                {"command": f"touch {marker}", "argv": ["touch", str(marker)]},
                {"argv": "touch x"},
                {"argv": []},
                {"command": f"touch {marker}", "key": "_machine"},
                {"command": f"touch {marker}", "key": "bad key"},
                {"command": f"touch {marker}", "timeout": "soon"},
                {"command": f"touch {marker}", "cwd": str(tmp_path / "missing")},
            ):
                errors.append(error_text(await s.call_tool("run", args)))
            errors.append(error_text(await s.call_tool("wait", {"id": "nosuchturn"})))
            errors.append(error_text(await s.call_tool("wait", {})))
            errors.append(error_text(await s.call_tool("cancel", {"id": "nosuchturn"})))
            errors.append(error_text(await s.call_tool("logs", {"id": "nosuchturn"})))
            errors.append(error_text(await s.call_tool("wait", {"id": "../../etc"})))
            return errors

    errors = go(main, env)
    assert "exactly one of `command`" in errors[0] and "exactly one" in errors[1]
    assert "argv" in errors[2] and "non-empty" in errors[3]
    assert "reserved" in errors[4] and "bad key" in errors[5]
    assert "timeout" in errors[6] and "not a directory" in errors[7]
    assert all("no turn nosuchturn on " in e for e in (errors[8], errors[10], errors[11]))
    assert "id" in errors[9] and "bad id" in errors[12]
    assert not marker.exists()
    from supervisor.history import db

    try:
        assert db.query(state_dir) == []
    except db.HistoryError:
        pass  # no history at all: nothing ran


def test_the_default_bound_is_25_seconds_and_a_call_answers_within_it(env, tmp_path):
    go_file = tmp_path / "go"
    default = {k: v for k, v in env.items() if k != "CCSUP_MCP_BOUND"}

    async def main(env):
        async with connected(env) as s:  # the holder, asked with the tests' 2 s bound
            holder = result(
                await s.call_tool(
                    "run", {"command": f"while [ ! -e {go_file} ]; do sleep 0.05; done"}
                )
            )
        async with connected(default) as s:
            started = time.monotonic()
            queued = result(await s.call_tool("run", {"command": "true"}))
            took = time.monotonic() - started
        go_file.write_text("")  # the rest ends with the supervisor, at the fixture's stop
        return holder, queued, took

    holder, queued, took = go(main, env)
    assert holder["state"] == "running" and queued["state"] == "queued"
    assert 20.0 <= took < 25.0, took  # it waits 25 - 5 s, then looks and answers


@pytest.mark.timeout(120)
def test_60_calls_in_flight_each_answer_within_the_bound(env):
    """Past the 40 worker threads a call used to hold while it waited: the 41st answered after
    two bounds. Waiting holds no thread now, so every call answers by the bound."""
    bound = 5.0
    many = {**env, "CCSUP_MCP_BOUND": f"{bound:g}", "CCSUP_MCP_PROGRESS": "60"}
    took: list[float] = []
    states: list[str] = []

    async def main(env):
        async with connected(env) as s:
            held = result(await s.call_tool("run", {"command": "sleep 600", "key": "held"}))
            assert held["state"] == "running"
            await s.list_tools()

            async def one():
                sent = time.monotonic()
                answer = result(await s.call_tool("run", {"command": "true", "key": "held"}))
                took.append(time.monotonic() - sent)
                states.append(answer["state"])

            async with anyio.create_task_group() as tg:
                for _ in range(60):
                    tg.start_soon(one)

    go(main, many)
    assert states == ["queued"] * 60
    assert max(took) <= bound + 2.0, sorted(took)[-5:]  # the answer's trip on a loaded machine


def test_bad_numbers_are_refused_naming_the_argument(env):
    async def main(env):
        async with connected(env) as s:
            ran = result(await s.call_tool("run", {"command": "echo hi"}))
            return ran, [
                error_text(await s.call_tool("logs", {"id": ran["id"], "offset": 2**70})),
                error_text(await s.call_tool("logs", {"id": ran["id"], "offset": -1})),
                error_text(await s.call_tool("logs", {"id": ran["id"], "limit": 0})),
                error_text(await s.call_tool("logs", {"id": ran["id"], "limit": 10**9})),
                error_text(await s.call_tool("run", {"command": "true", "timeout": -1})),
                error_text(await s.call_tool("run", {"command": "true", "timeout": 1e300})),
            ]

    ran, errors = go(main, env)
    assert ran["state"] == "ended"
    names = ["offset", "offset", "limit", "limit", "timeout", "timeout"]
    for name, text in zip(names, errors, strict=True):
        assert name in text, text
