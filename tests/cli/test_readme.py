"""The README's set-up commands are the ones CI runs."""

from conftest import ROOT


def _fenced_commands(text: str) -> list[str]:
    blocks, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        if inside and line.startswith("python3 -m venv"):
            blocks.append(line.strip())
    return blocks


def test_readme_starts_with_run_and_test_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    commands = _fenced_commands(readme[:800])
    assert len(commands) == 2, commands
    run, test = commands
    assert run.endswith("ccsup start")
    assert test.endswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci
