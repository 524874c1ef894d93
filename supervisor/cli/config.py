"""`ccsup config check|init`: explain a configuration, or write the commented default.

`check` reads the configuration the daemon would read (same discovery: --config, $CCSUP_CONFIG,
the XDG file, the embedded defaults) and either prints "ok: <source>" with the effective caps, or
every problem it found, each with file, key and line, and exits 2. It starts nothing and writes
nothing (with --json, a file that cannot serve prints `{"ok": false, "problems": [...]}` on
stdout too). `init` writes `default_config_text()` to the XDG path (or --path; `--path -`
prints it on stdout, the one way to pipe it): the file appears whole
or not at all (temporary file, fsync, then link or rename), and an existing file is never replaced
without --force, even by a racing second `init` (an empty one is: it holds nothing, and a
shell's `ccsup config init > file` leaves one). Run again, it refuses (exit 1) or, with --force,
replaces the file with a fresh default; stopped half-way it leaves at most a `.ccsup-init-*`
temporary file beside the target, never a partial config.

Listed in supervisor.cli.COMMANDS. A `--config` or `--state-dir` given to the parent
group is honoured when the subcommand does not give its own.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path

import click

from .. import config as cfg
from .. import paths
from ..caps import MACHINE_KEY
from ..errors import CcsupError, ConfigError, os_failure
from ..guards import containment


def _parent_param(ctx: click.Context, name: str):
    """A value the enclosing `ccsup` group took as a global option (e.g. --config), or None."""
    parent = ctx.parent
    while parent is not None:
        value = parent.params.get(name)
        if value is not None:
            return value
        parent = parent.parent
    return None


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _bytes(size: int) -> str:
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= factor:
            return f"{size} bytes ({size / factor:.4g} {unit})"
    return f"{size} bytes"


def _summary(config: cfg.Config, state_dir: Path) -> dict:
    caps = config.caps
    return {
        "source": config.source,
        "state_dir": str(state_dir),
        "state_dir_mode_fixed_at_start": paths.loose_but_empty(state_dir),
        "default_cap": caps.default_cap,
        "caps": dict(caps.caps),
        "harness_default_caps": dict(caps.harness_default),
        "machine_cap": caps.machine_cap,
        "min_free_memory": caps.min_free_memory,
        "reservation_ttl": config.reservation_ttl,
        "grace": config.grace,
        "adopt_within": config.adopt_within,
        "scan": config.scan,
        "endpoints": {
            name: getattr(config.endpoints.resolve(state_dir), name)
            for name in ("control", "bus_in", "bus_out")
        },
        "curve": config.endpoints.curve is not None,
        "cgroup": config.guard_cgroup,
        "containment": containment.describe_setting(config.guard_cgroup),
        "limits_not_enforced": containment.limits_not_enforced(config),
        "pools": {name: list(members) for name, members in config.pools.pools.items()},
        # the variables' names only: their values may be secrets
        "env": {key: sorted(names) for key, names in config.pools.env.items()},
    }


def _print_summary(s: dict) -> None:
    caps = ", ".join(f"{k}={v}" for k, v in sorted(s["caps"].items())) or "none"
    harness = ", ".join(f"{k}:*={v}" for k, v in sorted(s["harness_default_caps"].items()))
    click.echo(f"ok: {s['source']}")
    loose = ""
    if s["state_dir_mode_fixed_at_start"]:
        mode = stat.S_IMODE(os.stat(s["state_dir"]).st_mode)
        loose = f" (mode {mode:o}: start makes it 700)"
    click.echo(f"  state_dir        {s['state_dir']}{loose}")
    click.echo(f"  default_cap      {s['default_cap']}")
    click.echo(f"  caps             {caps}")
    if harness:
        click.echo(f"  harness caps     {harness}")
    for name, members in s["pools"].items():
        click.echo(f"  pool             {name} = {', '.join(members)}")
    for key, names in s["env"].items():
        click.echo(f"  env              {key}: {', '.join(names)}")
    machine = s["machine_cap"] if s["machine_cap"] is not None else "none"
    memory = _bytes(s["min_free_memory"]) if s["min_free_memory"] is not None else "none"
    click.echo(f"  machine_cap      {machine} ({MACHINE_KEY})")
    click.echo(f"  min_free_memory  {memory}")
    click.echo(f"  reservation_ttl  {_seconds(s['reservation_ttl'])}")
    click.echo(f"  guard            grace {_seconds(s['grace'])}, scan {_seconds(s['scan'])}")
    click.echo(f"  adopt_within     {_seconds(s['adopt_within'])}")
    click.echo(f"  cgroup           {s['containment']}")
    for sentence in s["limits_not_enforced"]:
        click.echo(f"warning: {sentence}")
    click.echo(f"  control          {s['endpoints']['control']}{' (CURVE)' if s['curve'] else ''}")


@click.group("config")
def config_group() -> None:
    """Check the configuration or write a commented default."""


@config_group.command("check")
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    default=None,
    help="The file to check (default: $CCSUP_CONFIG, then $XDG_CONFIG_HOME/ccsup/ccsup.toml).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the effective settings as JSON.")
@click.pass_context
def check(ctx: click.Context, config_path: str | None, as_json: bool) -> None:
    """Validate the configuration; name the file, key and line of every problem (exit 2)."""
    env = os.environ
    try:
        config = cfg.load(config_path or _parent_param(ctx, "config"), env)
        state_dir = cfg.resolve_state_dir(_parent_param(ctx, "state_dir"), env, config)
        unusable = containment.check_setting(config.guard_cgroup)
        if unusable is not None:
            raise ConfigError(f"{config.source}: {unusable}")
        refusal = paths.state_dir_refusal(state_dir)
        if refusal is not None:
            raise ConfigError(refusal)
        summary = _summary(config, state_dir)
    except cfg.ConfigProblems as err:
        for problem in err.problems:
            click.echo(f"error: {problem}", err=True)
        noun = "problem" if len(err.problems) == 1 else "problems"
        click.echo(f"{len(err.problems)} {noun} in {err.problems[0].source}", err=True)
        if as_json:
            _emit_problems([str(p) for p in err.problems])
        ctx.exit(err.exit_code)
    except ConfigError as err:  # a file that cannot be read, an unbindable socket path
        click.echo(f"error: {err.message}", err=True)
        if as_json:
            _emit_problems([err.message])
        ctx.exit(err.exit_code)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        _print_summary(summary)


def _emit_problems(problems: list[str]) -> None:
    """`check --json` of a configuration that cannot serve: what a script reads on stdout (the
    same sentences as stderr's), besides the exit code 2."""
    click.echo(json.dumps({"ok": False, "problems": problems}, indent=2))


@config_group.command("init")
@click.option(
    "--path",
    "target",
    metavar="FILE",
    default=None,
    help="Where to write (default: $XDG_CONFIG_HOME/ccsup/ccsup.toml; its folders are made); "
    "- prints it on stdout.",
)
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.pass_context
def init(ctx: click.Context, target: str | None, force: bool) -> None:
    """Write the commented default configuration (to the file `ccsup` reads by default)."""
    if target == "-":
        click.echo(cfg.default_config_text(), nl=False)
        return
    path = Path(target) if target else cfg.xdg_config_path(os.environ)
    try:
        written = write_default(path, force=force)
    except CcsupError as err:
        click.echo(f"error: {err.message}", err=True)
        ctx.exit(err.exit_code)
    click.echo(f"wrote {written}")


def _empty_file(path: Path) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False

    return stat.S_ISREG(st.st_mode) and st.st_size == 0


def write_default(path: Path, *, force: bool = False) -> Path:
    """Write the commented default to `path` atomically; CcsupError (exit 1) if it exists and not
    force, or if it cannot be written.

    The file is 0600 (mkstemp's mode): a config may come to hold a CURVE secret key.
    """
    path = Path(os.path.abspath(path))
    refused = CcsupError(f"{path} already exists; not replacing it (use --force to overwrite)")
    if not force and os.path.lexists(path):
        if not _empty_file(path):
            raise refused
        force = True  # an empty file (a shell's `> file` before `init`) holds nothing to keep
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".ccsup-init-", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(cfg.default_config_text())
            f.flush()
            os.fsync(f.fileno())
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if a racer created it meanwhile: never overwrite unasked
            except FileExistsError:
                raise refused from None
    except OSError as err:
        raise os_failure("write config", path, err) from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)  # after a link or a failure; gone already after a replace
            except FileNotFoundError:
                pass
    return path
