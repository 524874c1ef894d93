"""What every command shares: the global options resolved on first use, and JSON output.

`Where` knows the --state-dir and --config the user gave; it reads the configuration only when a
command asks (so --help and --version read none) and makes the client that talks to the
supervisor.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from pathlib import Path

    from .. import config as cfg
    from ..client.control import Client


class Where:
    """The global options, resolved on first use (so --help and --version read no config)."""

    def __init__(self, state_dir_option: str | None, config_option: str | None):
        self.state_dir_option = state_dir_option
        self.config_option = config_option
        self._config: cfg.Config | None = None

    def set_option(self, name: str, value: str) -> None:
        """--state-dir or --config given after the subcommand (supervisor.cli: either place)."""
        if name == "state_dir":
            self.state_dir_option = value
        elif name == "config":
            self.config_option = value
            self._config = None

    def config(self, path: str | None = None) -> cfg.Config:
        from .. import config as cfg

        if path is not None:
            return cfg.load(path, os.environ)
        if self._config is None:
            self._config = cfg.load(self.config_option, os.environ)
        return self._config

    def state_dir(self, config: cfg.Config | None = None) -> Path:
        from .. import config as cfg

        return cfg.resolve_state_dir(self.state_dir_option, os.environ, config or self.config())

    def client(self, timeout: float = 5.0) -> Client:
        from ..client.control import Client

        config = self.config()
        state_dir = self.state_dir(config)
        return Client(state_dir, endpoints=config.endpoints.resolve(state_dir), timeout=timeout)


def where(ctx: click.Context) -> Where:
    """The global options of the `ccsup` group a command runs under."""
    found = ctx.find_object(Where)
    if found is None:  # a bug: every command runs under `main`, which makes the Where
        raise RuntimeError("a ccsup command was invoked outside the ccsup group")
    return found


def emit_json(obj: object) -> None:
    import json

    click.echo(json.dumps(obj, ensure_ascii=False))
