"""Where the configuration file and the state directory are: --config, the environment, XDG.

It reads only the environment mapping it is given and whether the XDG file exists; `read_text`
is the one function that reads a configuration file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from ..errors import ConfigError
from .values import expand_home

EMBEDDED_SOURCE = "<embedded defaults>"


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _xdg(env: Mapping[str, str], variable: str, fallback: str) -> Path:
    value = env.get(variable, "")
    # The XDG spec: a relative value is invalid and is ignored.
    return Path(value) if value and os.path.isabs(value) else _home(env) / fallback


def xdg_config_path(env: Mapping[str, str]) -> Path:
    """$XDG_CONFIG_HOME/ccsup/ccsup.toml (default ~/.config), whether it exists or not."""
    return _xdg(env, "XDG_CONFIG_HOME", ".config") / "ccsup" / "ccsup.toml"


def find_config_path(cli_path: str | None, env: Mapping[str, str]) -> Path | None:
    """--config, else $CCSUP_CONFIG, else the XDG file if it exists, else None (embedded defaults)."""
    if cli_path:
        return expand_home(cli_path, env)
    if env.get("CCSUP_CONFIG"):
        return expand_home(env["CCSUP_CONFIG"], env)
    path = xdg_config_path(env)
    return path if path.is_file() else None


def embedded_text() -> str:
    """The text of the embedded supervisor/config/default.toml."""
    import pkgutil  # its loader's get_data: importlib.resources imported 5 ms more (tempfile...)

    data = pkgutil.get_data("supervisor.config", "default.toml")
    if data is None:  # a loader that cannot read its package's files
        raise ConfigError(
            "unable to read the embedded default configuration supervisor/config/default.toml"
        )
    return data.decode("utf-8")


def read_text(path: Path) -> str:
    """A configuration file's text; a ConfigError naming the file when it cannot be read."""
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"unable to read config {path}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"unable to read config {path}: not UTF-8 text ({err.reason} at byte {err.start})"
        ) from None


class _WithStateDir(Protocol):
    """What resolve_state_dir reads of a Config (this module is below the package's __init__)."""

    @property
    def state_dir(self) -> Path | None: ...


def resolve_state_dir(cli_value: str | None, env: Mapping[str, str], config: _WithStateDir) -> Path:
    """--state-dir > $CCSUP_STATE_DIR > config.state_dir > $XDG_STATE_HOME/ccsup > ~/.local/state/ccsup.

    Always absolute: the daemon's ipc:// endpoints are paths inside it.
    """
    for value in (cli_value, env.get("CCSUP_STATE_DIR")):
        if value:
            return Path(os.path.abspath(expand_home(value, env)))
    if config.state_dir is not None:
        return config.state_dir
    return _xdg(env, "XDG_STATE_HOME", ".local/state") / "ccsup"
