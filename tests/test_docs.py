"""Everything a user of a clone needs is in the clone: README.md and docs/*.md link only to
files inside the repository (that exist, with anchors that exist), and no document or
docstring points at the design folders outside it."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CODE_DIRS = ["sw", "hdl", "sim", "boards", "tests", "firmware", "tools"]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: spellings of the out-of-repo design documents this project grew from: the shared folders,
#: the architecture document, the per-algorithm design notes (``notes/zen.md``, "notes §3.3",
#: "notes A19", "the notes' examples") and the paper seeds ("seed 004", "seeds/002"). Cite
#: docs/*.md (for the sparse models, docs/sparse-models.md) and papers by author and venue.
OUTSIDE = re.compile(r"\.\./shared|shared/(design|notes|seeds)|ARCHITECTURE\.md|ARCHITECTURE §"
                     r"|\bnotes/[\w-]+\.md|\bnotes'? (§|A\d|#\d|on hashing)|\bthe notes\b"
                     r"|\bseeds?[ /]?0\d\d\b")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {github_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


def links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)   # code is not a link
    return [m.group(1) for m in LINK.finditer(text)]


def check_link(doc: Path, target: str) -> str | None:
    """None if ``target`` (a link in ``doc``) stays inside the repository and resolves, else
    why not."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, flags=re.I):
        return f"{target}: a link outside the repository (URL)"
    file_part, _, anchor = target.partition("#")
    dest = (doc.parent / file_part).resolve() if file_part else doc
    if dest != REPO and REPO not in dest.parents:
        return f"{target}: resolves outside the repository ({dest})"
    if not dest.exists():
        return f"{target}: {dest.relative_to(REPO)} does not exist"
    if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
        return f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}"
    return None


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_links_stay_inside_the_repository(doc):
    bad = [why for t in links(doc) if (why := check_link(doc, t))]
    assert not bad, f"{doc.relative_to(REPO)}: " + "; ".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_docs_name_no_outside_design_documents(doc):
    hits = [line for line in doc.read_text().splitlines() if OUTSIDE.search(line)]
    assert not hits, f"{doc.relative_to(REPO)} points outside the repository: {hits[:3]}"


def test_code_names_no_outside_design_documents():
    me = Path(__file__).resolve()
    hits = []
    for d in CODE_DIRS:
        for f in sorted((REPO / d).rglob("*")):
            if f.is_file() and f.suffix in (".py", ".sh", ".md") and f.resolve() != me:
                for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    if OUTSIDE.search(line):
                        hits.append(f"{f.relative_to(REPO)}:{n}")
    assert not hits, f"references to design documents outside the repository: {hits[:10]}"


@pytest.mark.parametrize("target, ok", [
    ("docs/architecture.md", True),
    ("docs/architecture.md#5-numeric-contract-what-bit-exact-means", True),
    ("../shared/design/ARCHITECTURE.md", False), ("docs/nope.md", False),
    ("docs/architecture.md#no-such-heading", False), ("https://example.org/", False),
    ("/etc/passwd", False)])
def test_link_checker_itself(target, ok):
    assert (check_link(REPO / "README.md", target) is None) == ok


@pytest.mark.parametrize("line, outside", [
    ("(notes/redsync.md §7.4)", True), ("see notes/zen.md A19", True), ("notes §12 #3", True),
    ("(notes A1/A18)", True), ("the notes' worked examples", True), ("seed 004 Def. 7", True),
    ("Huang et al., ISCA'21 — seeds/002", True), ("../shared/notes/zen.md", True),
    ("docs/sparse-models.md, RedSync R-A9", False), ("the paper notes that trees", False),
    ("seed 0 of the generator", False), ("hash_seed (default: the model seed)", False)])
def test_outside_pattern_itself(line, outside):
    assert bool(OUTSIDE.search(line)) == outside
