"""`ccsup web`: a live page of the supervisor (keys, holders, queue, timeline, a turn's output).

A client of the supervisor like the CLI (control socket, bus; the history when it is there), run
as its own process so the daemon stays small: `ccsup web`, or beside the daemon with
`[web] listen`. Modules: access (who may do what), live (what
the page shows, from `ps` and events: pure), timeline (where the bars come from), usage (CPU and
memory of running turns from /proc), link (the Client in threads), hub (the live model kept
fresh and fed to the open streams), log_reader (a turn's log file as UTF-8 chunks), app (aiohttp
routes, server-sent events, cancel, login); the daemon runs it for `[web] listen`
(supervisor.daemon.page); static/ holds the page (no build step). The click command is supervisor/cli/web.py; the settings (listen, token: pure) are the config
section's, supervisor/config/web.py.
"""
