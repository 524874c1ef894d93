"""A tmux pane of a test's own (its own tmux server, `-L name`), 80x24 unless told: a command
run in a real terminal, its screen read with capture-pane and keys sent with send-keys."""

from __future__ import annotations

import subprocess


class Pane:
    def __init__(self, name: str, command: str, env: dict, width: int = 80, height: int = 24):
        self.name = name
        self.socket = ["-L", name]  # a tmux server of the test's own
        subprocess.run(
            [
                "tmux",
                *self.socket,
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                str(width),
                "-y",
                str(height),
                command,
            ],
            env=env,
            check=True,
        )

    def screen(self, escapes: bool = False) -> str:
        """The pane's text; with `escapes`, its colours and attributes as escape sequences."""
        done = subprocess.run(
            [
                "tmux",
                *self.socket,
                "capture-pane",
                "-p",
                *(["-e"] if escapes else []),
                "-t",
                self.name,
            ],
            capture_output=True,
            text=True,
        )
        return done.stdout

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", *self.socket, "send-keys", "-t", self.name, *keys], check=True)

    def resize(self, width: int, height: int) -> None:
        """Resize the pane's window (the program in it gets SIGWINCH)."""
        subprocess.run(
            [
                "tmux",
                *self.socket,
                "resize-window",
                "-t",
                self.name,
                "-x",
                str(width),
                "-y",
                str(height),
            ],
            check=True,
        )

    def alive(self) -> bool:
        done = subprocess.run(
            ["tmux", *self.socket, "has-session", "-t", self.name], capture_output=True
        )
        return done.returncode == 0

    def close(self) -> None:
        subprocess.run(["tmux", *self.socket, "kill-server"], capture_output=True)
