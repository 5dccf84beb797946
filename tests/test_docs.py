"""The documentation a reader follows: README.md, then docs/. Every relative link resolves to a
file or directory of the repository (and an anchor to a heading of the file it names); none
points outside it. A link to a docs/ page not written yet is no error while the page is absent:
the test checks the links to files that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
# Pages linked before they are written (none now): a missing page fails unless it is listed here.
PENDING: set[str] = set()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for link in _links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # http:, https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if REPO not in (target, *target.parents):
            broken.append(f"{link}: outside the repository")
        elif not target.exists():
            if str(target.relative_to(REPO)) not in PENDING:
                broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md":
            headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)}
            if anchor not in headings:
                broken.append(f"{link}: no heading #{anchor}")
    assert broken == [], f"{page.relative_to(REPO)}: {broken}"


def test_the_readme_leads_to_the_design_and_the_docs() -> None:
    links = set(_links(REPO / "README.md"))
    assert {"docs/design.md", "docs/deploy.md", "docs/model-accuracy.md", "docs/regression.md",
            "docs/faults.md"} <= {link.partition("#")[0] for link in links}
    assert "../" not in (REPO / "README.md").read_text()  # nothing outside the repository


def test_docs_hold_no_commit_hashes_or_dates() -> None:
    """A result's provenance lives in its MLflow run, not in the documentation."""
    for page in PAGES:
        text = page.read_text()
        assert not re.findall(r"\b20\d\d-\d\d-\d\d\b", text), page.name
        hashes = [h for h in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"[a-f]", h)
                  and re.search(r"\d", h)]
        assert hashes == [], (page.name, hashes)


def test_docs_hold_no_host_load_readings() -> None:
    """A figure's host load is part of its provenance (the run's MLflow run, the report's host-load
    line): the documentation states the current figures and their limits, not the conditions of
    one measurement."""
    reading = re.compile(r"load average|\bload \d|other work us(?:ed|ing) \d", re.IGNORECASE)
    found = {page.name: reading.findall(page.read_text()) for page in PAGES}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_the_codes_design_references_name_sections_of_docs_design() -> None:
    """Code cites the design as "DESIGN §N": each N is a numbered section of docs/design.md."""
    sections = set(re.findall(r"^## (\d+)\. ", (REPO / "docs" / "design.md").read_text(), flags=re.M))
    cited = {}
    for folder in ("dags", "pipelines", "training", "modelling", "infra"):
        for path in (REPO / folder).rglob("*.py"):
            for n in re.findall(r"DESIGN §(\d+)", path.read_text()):
                cited.setdefault(n, str(path.relative_to(REPO)))
    assert cited, "no design references found"
    assert {n: where for n, where in cited.items() if n not in sections} == {}
