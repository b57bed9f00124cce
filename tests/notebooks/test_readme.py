"""The README works as written: every `make` target it shows is one the Makefile defines, every
`python -m` module it shows can be found, every path and link in it exists (or lies under a folder
the course generates), its layout table names what is there, and it stays short.

Nothing is launched: the Makefile and the README are read as text, and modules are found with
importlib.util.find_spec, which imports only their parent packages."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from conftest import ROOT

README = ROOT / "README.md"
MAX_LINES = 150
# Files that count as paths when they stand in code without a slash.
SUFFIXES = (".py", ".md", ".ipynb", ".yml", ".txt", ".sbatch", ".png", ".json", ".ini")


def code(text: str) -> list[str]:
    """What the README shows as code: the lines of its fenced blocks and its inline code spans."""
    shown: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            shown.append(line)
        else:
            shown += re.findall(r"`([^`]+)`", line)
    return shown


def make_targets(path: Path = ROOT / "Makefile") -> set[str]:
    """The targets the Makefile's rule lines define (a variable's `:=` or `?=` is no rule)."""
    targets: set[str] = set()
    for line in path.read_text().splitlines():
        rule = re.match(r"^([A-Za-z0-9_.\- ]+):(?![=:])", line)
        if rule:
            targets |= set(rule.group(1).split())
    return targets - {".PHONY"}


def make_calls(shown: list[str]) -> set[str]:
    """The targets of every `make ...` in the code shown: the first word after make that is not
    a variable's assignment."""
    found: set[str] = set()
    for snippet in shown:
        for words in re.findall(r"(?:^|[\s;&|(])make((?:\s+[^\s#;&|)]+)+)", snippet):
            target = next((w for w in words.split() if "=" not in w and not w.startswith("-")), None)
            if target:
                found.add(target.strip("\"'"))
    return found


def modules(shown: list[str]) -> set[str]:
    return {m for snippet in shown for m in re.findall(r"python3?\s+-m\s+([A-Za-z_][\w.]*)", snippet)}


def module_found(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package that is not there
        return False


def links(text: str) -> set[str]:
    """Markdown link targets and image sources that point into the repository."""
    found = set(re.findall(r"\]\(([^)\s]+)\)", text)) | set(re.findall(r"<img[^>]*\ssrc=\"([^\"]+)\"", text))
    return {f for f in found if not re.match(r"^[a-z]+:", f) and not f.startswith("#")}


def paths(shown: list[str]) -> set[str]:
    """Every word of the code shown that names a file or folder of the repository: a file name with a
    known suffix, or a word with a slash that starts at a top-level entry (`n/a` and `send/recv` are
    no paths, nor are URLs, options and placeholders like <student>)."""
    top = {p.name for p in ROOT.iterdir()} | generated()
    found: set[str] = set()
    for snippet in shown:
        for word in snippet.split():
            word = word.split("=")[-1].strip("\"'`,;:()")
            if not word or "://" in word or "<" in word or word.startswith(("-", "$", "#", "/", "~")):
                continue
            if word.endswith(SUFFIXES) or ("/" in word and word.split("/")[0] in top):
                found.add(word)
    return found


def generated() -> set[str]:
    """The top-level folders .gitignore names: made by the course (data/, grading/, .venv), absent
    from a fresh clone."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return {line.strip().strip("/") for line in lines if line.strip() and not line.startswith("#")
            and "*" not in line and "/" not in line.strip().strip("/")}


def exists(path: str) -> bool:
    relative = path.split("#")[0]
    return (ROOT / relative).exists() or relative.strip("/").split("/")[0] in generated()


def layout_paths(text: str) -> list[str]:
    """The paths in the first column of the Layout table."""
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [p for row in rows for p in re.findall(r"`([^`]+)`", row.split("|")[1])]


def problems(text: str) -> list[str]:
    """Everything in `text` (a README) that would not work as written."""
    shown = code(text)
    found = [f"{len(text.splitlines())} lines: more than {MAX_LINES}"] if len(text.splitlines()) > MAX_LINES else []
    defined = make_targets()
    found += [f"`make {t}`: no such target in the Makefile" for t in sorted(make_calls(shown) - defined)]
    found += [f"`python -m {m}`: no such module" for m in sorted(modules(shown)) if not module_found(m)]
    found += [f"link {f}: no such file" for f in sorted(links(text)) if not exists(f)]
    found += [f"path {p}: no such file or folder" for p in sorted(paths(shown)) if not exists(p)]
    return found


def test_the_readme_works_as_written() -> None:
    assert problems(README.read_text()) == []


@pytest.mark.parametrize("added, complaint", [
    ("Run `make no-such-target` first.", "`make no-such-target`: no such target"),
    ("```bash\nmake lab && make frobnicate STEP=4\n```", "`make frobnicate`: no such target"),
    ("Or `python -m autograde.no_such_tool --help`.", "`python -m autograde.no_such_tool`: no such module"),
    ("See [the guide](docs/no-such-guide.md).", "link docs/no-such-guide.md: no such file"),
    ("Edit `exercises/no_such_exercise.py`.", "path exercises/no_such_exercise.py: no such file"),
    ("x\n" * MAX_LINES, "more than 150"),
])
def test_a_readme_that_does_not_work_as_written_is_caught(added: str, complaint: str) -> None:
    found = problems(README.read_text() + "\n" + added + "\n")
    assert any(complaint in p for p in found), found


def test_generated_folders_pass_and_variables_are_not_targets() -> None:
    shown = code("`make check STEP=4`, `make lab LAB_ARGS=\"--ip 0.0.0.0\"`, `data/synthetic/`, `grading/`")
    assert make_calls(shown) == {"check", "lab"}
    assert all(exists(p) for p in paths(shown))


def test_every_doc_is_linked_from_the_readme() -> None:
    linked = {Path(f.split("#")[0]) for f in links(README.read_text())}
    docs = {p.relative_to(ROOT) for p in (ROOT / "docs").glob("*.md")}
    assert docs - linked == set(), "docs the README does not link"


def test_the_layout_table_names_every_folder_and_module_there_is() -> None:
    listed = set(layout_paths(README.read_text()))
    assert all(exists(p) for p in listed), sorted(p for p in listed if not exists(p))
    top = {p.name + "/" for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".")
           and p.name not in generated() and p.name != "__pycache__"}
    package = {f"autograde/{p.name}" + ("/" if p.is_dir() else "") for p in (ROOT / "autograde").iterdir()
               if not p.name.startswith(("_", "."))}
    assert (top | package) - listed == set(), "in the tree, not in the README's layout"


def anchors(path: Path) -> set[str]:
    """The anchors GitHub makes for a markdown file's headings."""
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)}


@pytest.mark.parametrize("doc", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_the_docs_links_lead_somewhere(doc: str) -> None:
    path = ROOT / "docs" / doc
    for target in links(path.read_text()):
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        assert where.exists(), f"{doc}: link {target}: no such file"
        if anchor and where.suffix == ".md":
            assert anchor in anchors(where), f"{doc}: link {target}: no such heading"
