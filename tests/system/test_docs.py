"""The docs a newcomer reads hold together: the site builds with ``mkdocs build
--strict`` (every page in the nav, every link and anchor between pages resolved, the
included RELIABILITY.md and bench/README.md found), the README stays a short front
page, and every relative link in the Markdown points at a file that exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
README_MAX_LINES = 300

#: The Markdown whose relative links must resolve: the front page, the site's pages
#: and the benchmark results.
PAGES = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (links there are examples)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slug(heading: str) -> str:
    """A heading's anchor as Python-Markdown's toc (and so MkDocs) makes it; GitHub's
    agrees for the plain headings these pages link to."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    return {_slug(h) for h in HEADING.findall(FENCE.sub("", page.read_text()))}


def _links(page: Path) -> list[str]:
    return LINK.findall(_prose(page.read_text()))


def test_the_site_builds_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        [str(MKDOCS), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,  # the snippets (RELIABILITY.md, bench/README.md) are relative to it
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in (
        "index.html",
        "invariants/index.html",
        "architecture/index.html",
        "user-guide/index.html",
        "scheduling/index.html",
        "operations/index.html",
        "testing/index.html",
        "decisions/index.html",
        "limits/index.html",
        "reliability/index.html",
        "benchmarks/index.html",
        "fragmentation.png",
    ):
        assert (site / page).is_file(), page
    # the included files arrived whole, not as the snippet markers
    benchmarks = (site / "benchmarks" / "index.html").read_text()
    assert "--8&lt;--" not in benchmarks and "--8<--" not in benchmarks
    assert "Steady cluster" in benchmarks and 'src="../fragmentation.png"' in benchmarks
    assert "Fault matrix" in (site / "reliability" / "index.html").read_text()


def test_the_readme_is_a_short_front_page() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move the detail "
        "to a page under docs/ and link it"
    )
    # the first screen: what Forge is and the two commands
    first = "\n".join(lines[:20])
    assert "one long-running Temporal workflow per cluster" in first
    assert re.search(r"^make run\b", first, re.M) and re.search(r"^make test\b", first, re.M)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT)}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_checker_sees_links_and_ignores_code() -> None:
    text = "A [page](docs/a.md#b-c), ![img](x.png), `[not](code.md)`\n```\n[no](z.md)\n```\n"
    assert LINK.findall(_prose(text)) == ["docs/a.md#b-c", "x.png"]
    assert _slug("Single machine and production") == "single-machine-and-production"
    assert _slug("Placement (`bench/placement.py`)") == "placement-benchplacementpy"
