"""The README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

import pytest
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
    # the whole suite, six tests at a time (pytest-xdist; `-n 0` runs one at a time)
    assert test.endswith("pytest -n 6")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert test in ci


DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors, inside = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside and line.startswith("#"):
            anchor = _anchor(line.lstrip("#"))
            count = seen.get(anchor, 0)
            seen[anchor] = count + 1
            anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return anchors


def test_the_readme_is_the_contract_and_links_every_doc():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 350  # the rest goes to docs/
    linked = {target.split("#")[0] for target in LINK.findall(readme)}
    for doc in sorted(DOCS.glob("*.md")):
        assert f"docs/{doc.name}" in linked, f"{doc.name} is not linked from the README"


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", *sorted(DOCS.glob("*.md"))], ids=lambda page: page.name
)
def test_every_relative_link_of_the_docs_leads_somewhere(page):
    for target in LINK.findall(page.read_text()):
        if "://" in target:
            continue
        name, _, anchor = target.partition("#")
        goal = (page.parent / name).resolve() if name else page
        assert goal.exists(), f"{page.name}: {target} leads nowhere"
        if anchor:
            assert anchor in _anchors(goal), f"{page.name}: no heading {anchor!r} in {goal.name}"
