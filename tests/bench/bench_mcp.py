"""MCP at size: N concurrent `run` calls on one `ccsup mcp` session, every one
on a key whose only slot is held, so each waits the whole bound and answers "queued".

    .venv/bin/python tests/bench/bench_mcp.py [--calls 200] [--bound 25] [--before SOURCE_TREE]

A real daemon (cap 1 on `held`, its slot taken by a `sleep`), one MCP server (`python -m
supervisor mcp`, the SDK's stdio client), N `run` calls sent at once. Each call's answer time is
measured from the moment it was sent. The promise: every call answers within the bound (a
harness gives a call 60 s, OpenCode no more). Prints one JSON line: `calls`, `bound_s`,
`slowest_s`, `median_s`, `fastest_s`, `within_bound` (every call answered by the bound, as the
client measured it), `answered` (calls that answered "queued"), `errors`, the MCP
server's `threads_most` (its thread count, sampled from /proc every 100 ms) and `cpu_s`.
`--before DIR`: the same, in the same run, with the MCP server imported from another source
tree (a `git worktree` of the commit before), under "before".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_daemon import start_daemon, stop_daemon  # noqa: E402
from mcp import ClientSession, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

from supervisor.client import Client  # noqa: E402


def children_named(pid: int, word: bytes) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
            try:
                if word in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(int(child))
            except OSError:
                pass
    return found


def sample(pid_box: list[int], stop: threading.Event, most: list[int], cpu: list[float]):
    tick = os.sysconf("SC_CLK_TCK")
    while not stop.wait(0.1):
        if not pid_box:
            continue
        try:
            most[0] = max(most[0], len(os.listdir(f"/proc/{pid_box[0]}/task")))
            fields = Path(f"/proc/{pid_box[0]}/stat").read_text().rsplit(")", 1)[1].split()
            cpu[0] = (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass


def measure(calls: int, bound: float, source: str | None) -> dict:
    state = Path(tempfile.mkdtemp(prefix="ccsup-mcp-", dir="/tmp"))
    proc = start_daemon(state, "held = 1")
    env = {**os.environ, "CCSUP_STATE_DIR": str(state), "CCSUP_MCP_BOUND": f"{bound:g}"}
    if source is not None:
        env["PYTHONPATH"] = source
    times: list[float] = []
    states: list[str] = []
    errors: list[str] = []
    most, cpu, pid_box = [0], [0.0], []
    stop = threading.Event()
    sampler = threading.Thread(target=sample, args=(pid_box, stop, most, cpu), daemon=True)
    try:
        with Client(state) as client:
            client.turn("held", ["sleep", "600"])

        async def main():
            params = StdioServerParameters(
                command=sys.executable,
                args=os.environ.get("BENCH_MCP_PREFIX", "").split() + ["-m", "supervisor", "mcp"],
                env=env,
                cwd=source or os.getcwd(),
            )
            async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
                await s.initialize()
                await s.list_tools()  # the client's cache of output schemas, filled once
                pid_box.extend(children_named(os.getpid(), b"mcp"))
                sampler.start()

                async def one():
                    sent = time.monotonic()
                    answer = await s.call_tool("run", {"command": "true", "key": "held"})
                    times.append(time.monotonic() - sent)
                    if answer.is_error:
                        states.append("error")
                        errors.append(" ".join(getattr(c, "text", "") for c in answer.content))
                    else:
                        body = answer.structured_content or json.loads(answer.content[0].text)
                        states.append(body.get("state"))

                async with anyio.create_task_group() as tg:
                    for _ in range(calls):
                        tg.start_soon(one)

        anyio.run(main)
    finally:
        stop.set()
        stop_daemon(proc, state)
        shutil.rmtree(state, ignore_errors=True)
    return {
        "calls": calls,
        "bound_s": bound,
        "slowest_s": round(max(times), 2),
        "median_s": round(statistics.median(times), 2),
        "fastest_s": round(min(times), 2),
        "within_bound": max(times) <= bound,
        "answered": states.count("queued"),
        "errors": sorted(set(errors))[:3],
        "threads_most": most[0],
        "cpu_s": round(cpu[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--bound", type=float, default=25.0)
    parser.add_argument("--before", help="another source tree, measured the same way")
    args = parser.parse_args()
    result = {"bench": "mcp", "after": measure(args.calls, args.bound, None)}
    if args.before:
        result["before"] = measure(args.calls, args.bound, os.path.abspath(args.before))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
