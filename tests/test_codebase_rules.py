"""The house rules the code base keeps: imports flow one way, and docs cite only files in the repo.

Imports are read from the source (every `import` statement, at module level or inside a
function, since a lazy import is still a dependency), not by importing anything.

Every `something.md` named in code, help text, tutorials, tests or docs must be a file in the
repo, and every `file.md#anchor` must name a heading of that file (GitHub's slugs).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cel_numpy"
CLI_MODULES = {"cel_numpy.cli", "cel_numpy.demo"}  # plus every `<package>.cli`


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_cli(module: str) -> bool:
    return module in CLI_MODULES or module.endswith(".cli")


def import_graph() -> dict[str, set[str]]:
    """module -> the cel_numpy modules it imports (a package stands for its __init__)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            else:
                continue
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = finished
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_sees_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_package_imports_have_no_cycle():
    graph = import_graph()
    # a package's __init__ re-exports its children: children must never import their package
    assert len(graph) > 30 and any(graph.values()), "the import graph came out empty"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_library_modules_never_import_the_command_line():
    offenders = [
        f"{name} imports {dep}"
        for name, deps in import_graph().items()
        if not is_cli(name)
        for dep in deps
        if is_cli(dep)
    ]
    assert not offenders, "; ".join(offenders)


# --------------------------------------------------------------------------- doc references

DOC_REFERENCE = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.md)(?:#([\w-]+))?")
# Markdown files that runs write (not repo files): a localization run directory's report.
WRITTEN_BY_RUNS = {"report.md"}


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    suffixes = {".py", ".md", ".toml", ".cfg", ".txt", ".sh"}
    names = {"Makefile", "run"}  # .ci/run
    this = Path(__file__).resolve()  # its planted examples are not references
    paths = [ROOT / f for f in out if Path(f).suffix in suffixes or Path(f).name in names]
    return [p for p in paths if p.resolve() != this]


def markdown_anchors(path: Path) -> set[str]:
    """GitHub's heading slugs: lower case, punctuation dropped, spaces to hyphens."""
    slugs = set()
    for line in path.read_text().splitlines():
        if m := re.match(r"#+\s+(.*)", line):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            slugs.add(text.replace(" ", "-"))
    return slugs


def broken_references(paths: list[Path], root: Path) -> list[str]:
    """`file:line: ref` for each reference to a missing .md file or to a missing heading.

    A reference resolves against the repo root or the citing file's folder.
    """
    broken = []
    # a bare `name.md` (e.g. built as ROOT / "docs" / "name.md") may be any of the files given
    by_name = {p.name: p for p in paths if p.suffix == ".md"}
    for path in paths:
        for line_no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for ref, anchor in DOC_REFERENCE.findall(line):
                if Path(ref).name in WRITTEN_BY_RUNS:
                    continue
                places = [root / ref, path.parent / ref]
                target = next((c for c in places if c.is_file()), None)
                if target is None and "/" not in ref:
                    target = by_name.get(ref)
                where = f"{path.relative_to(root)}:{line_no}"
                if target is None:
                    broken.append(f"{where}: {ref} is not a file in the repo")
                elif anchor and anchor not in markdown_anchors(target):
                    broken.append(f"{where}: {ref} has no heading #{anchor}")
    return broken


def test_reference_check_sees_planted_breakage(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## The theory world\n")
    src = tmp_path / "mod.py"
    src.write_text(
        "# see docs/guide.md#the-theory-world and docs/guide.md\n"  # fine
        "# see NOTES.md section 3\n"  # no such file
        "# see docs/guide.md#protocol\n"  # no such heading
        "# a run writes report.md\n"  # allowed: written by runs
    )
    assert broken_references([src], tmp_path) == [
        "mod.py:2: NOTES.md is not a file in the repo",
        "mod.py:3: docs/guide.md has no heading #protocol",
    ]


def test_every_cited_markdown_file_and_section_exists():
    """`docs/design.md#section` references in code, help text, tutorials and docs resolve."""
    files = tracked_text_files()
    assert any(p.name == "design.md" for p in files), "docs/design.md is not tracked"
    broken = broken_references(files, ROOT)
    assert not broken, "references to files or sections not in the repo:\n" + "\n".join(broken)


def test_help_text_points_to_the_design_document():
    from cel_numpy.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.choices and "localize" in a.choices)
    for command, section in (("localize", "protocol"), ("theory", "theory-world")):
        text = sub.choices[command].format_help()
        assert f"docs/design.md#{section}" in text.replace("\n", " "), command


def test_test_modules_share_helpers_not_each_other():
    """Shared test code lives in tests/helpers.py; a test module never imports another one."""
    offenders = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path.name} imports {n}" for n in names if n.startswith("test_")]
    assert not offenders, "; ".join(offenders)


MARKDOWN_LINK = re.compile(r"\]\(([^)\s]*)\)")


def broken_markdown_links(paths: list[Path]) -> list[str]:
    """`file:line: link` for each relative Markdown link whose file, folder or heading is missing.

    A link resolves against the citing file's folder; `#anchor` alone means the citing file.
    Absolute URLs are not checked (no network).
    """
    broken = []
    for path in (p for p in paths if p.suffix == ".md"):
        for line_no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for link in MARKDOWN_LINK.findall(line):
                if not link or re.match(r"[a-z]+:", link):
                    continue
                ref, _, anchor = link.partition("#")
                target = (path.parent / ref) if ref else path
                where = f"{path.name}:{line_no}"
                if not target.exists():
                    broken.append(f"{where}: {link} (no such file or folder)")
                elif anchor and target.suffix == ".md" and anchor not in markdown_anchors(target):
                    broken.append(f"{where}: {link} (no such heading)")
    return broken


def test_markdown_link_check_sees_planted_breakage(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Speed notes\n")
    page = tmp_path / "README.md"
    page.write_text(
        "[ok](docs/guide.md#speed-notes) [ok](docs/) [ok](#intro) [web](https://x.org/y)\n"
        "# Intro\n[gone](docs/speed.md) [bad](docs/guide.md#speed) [here](#nowhere)\n"
    )
    assert broken_markdown_links([page]) == [
        "README.md:3: docs/speed.md (no such file or folder)",
        "README.md:3: docs/guide.md#speed (no such heading)",
        "README.md:3: #nowhere (no such heading)",
    ]


def test_every_markdown_link_resolves():
    """README and docs link to files, folders and headings that exist (docs move; links follow).

    Archived run reports are kept exactly as their runs wrote them, so they are not checked.
    """
    archive = ROOT / "docs" / "results" / "archive"
    broken = broken_markdown_links([p for p in tracked_text_files() if archive not in p.parents])
    assert not broken, "broken Markdown links:\n" + "\n".join(broken)
