"""The README stays a front page and the docs/ pages hold the rest: the README's length, every
relative link and anchor in README.md and docs/*.md, the set-up commands CI really runs, the
shipped stacks it names, and the minimal stack file it shows (rendered, as the README says it is)."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT, STACKS

README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 260

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*#*[ \t]*$", re.MULTILINE)


def _prose(text: str) -> str:
    """Markdown without its fenced code blocks: a `](` in code is not a link, a `#` not a heading."""
    return _FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (links become their text, code marks go),
    lower case, every character but letters, digits, '-', '_' and spaces dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor in a Markdown file, repeats numbered as GitHub numbers them (-1, -2)."""
    seen: dict[str, int] = {}
    found = set()
    for _, title in _HEADING.findall(_prose(text)):
        base = slug(title)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> list[str]:
    """The targets of a Markdown file's links, outside code."""
    return _LINK.findall(_INLINE_CODE.sub("", _prose(text)))


def dead_links(path: Path) -> list[str]:
    """`file: target (why)` for each relative link of a Markdown file whose file or #anchor is missing."""
    problems = []
    for target in links(path.read_text()):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:|^//", target):
            continue  # a URL: not this repository's to check
        file_part, _, anchor = target.partition("#")
        goal = (path.parent / file_part).resolve() if file_part else path
        if not goal.exists():
            problems.append(f"{path.name}: {target} (no such file)")
        elif anchor and (goal.suffix != ".md" or anchor not in anchors(goal.read_text())):
            problems.append(f"{path.name}: {target} (no heading #{anchor} in {goal.name})")
    return problems


def _section(text: str, title: str) -> str:
    """A `## title` section's body, up to the next `## ` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def setup_problems(readme: str, ci_run: str, makefile: str) -> list[str]:
    """What is wrong with the README's Quick start: it must show exactly two commands, rendering
    `homelab` and the test command `.ci/run` runs, both targets the Makefile has."""
    shown = re.findall(r"^    (\S.*)$", _section(readme, "Quick start"), re.MULTILINE)
    ci = [line.strip() for line in ci_run.splitlines() if re.match(r"\s*make\b", line)]
    problems = []
    if len(ci) != 1:
        problems.append(f".ci/run: expected one make command, found {ci}")
    wanted = ["make render STACK=homelab", *ci[:1]]
    if shown != wanted:
        problems.append(f"README.md Quick start shows {shown}, not {wanted}")
    for command in wanted:
        target = command.split()[1]
        if not re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE):
            problems.append(f"Makefile: no target {target!r} for `{command}`")
    return problems


# (a) the front page stays short


def length_problem(text: str) -> str | None:
    lines = text.count("\n")
    if lines > MAX_README_LINES:
        return f"README.md is {lines} lines; move sections into docs/ (at most {MAX_README_LINES})"
    return None


def test_the_readme_is_at_most_260_lines():
    assert length_problem(README.read_text()) is None


def test_a_readme_of_261_lines_is_caught():
    assert length_problem("line\n" * MAX_README_LINES) is None
    assert length_problem("line\n" * (MAX_README_LINES + 1)) == "README.md is 261 lines; move sections into docs/ (at most 260)"


def test_the_readme_sections_come_in_order():
    titles = re.findall(r"^## (.*)$", _prose(README.read_text()), re.MULTILINE)
    assert titles == ["Quick start", "Your own cluster in fifteen minutes", "What it deploys", "More"]


def test_the_readme_lists_every_shipped_stack_once():
    lines = README.read_text().splitlines()
    for stack in STACKS:
        assert sum(line.startswith(f"- `{stack}`: ") for line in lines) == 1, stack


# (b) every relative link and anchor resolves


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_every_relative_link_and_anchor_resolves():
    problems = [problem for page in _pages() for problem in dead_links(page)]
    assert problems == []


def test_every_docs_page_has_a_title_and_a_way_back_and_is_linked_from_the_readme():
    readme_links = {target.partition("#")[0] for target in links(README.read_text())}
    for page in sorted(DOCS.glob("*.md")):
        first, _, third = page.read_text().splitlines()[:3]
        assert re.fullmatch(r"# \S.*", first), page.name
        assert "](../README.md)" in third, page.name
        assert f"docs/{page.name}" in readme_links, f"README.md does not link docs/{page.name}"


def test_the_link_checker_finds_a_dead_file_and_a_dead_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Decode speed: predicted and measured\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Models on demand (`models.<key>.on_demand`)\n\n"
        "[ok](other.md) [ok](other.md#decode-speed-predicted-and-measured) [ok](other.md#twice-1)\n"
        "[ok](#models-on-demand-modelskeyon_demand) [url](https://example.com/x.md#nowhere)\n"
        "`[in code](missing.md)`\n\n```\n[in a fence](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#decode-speed) [bad here](#nowhere) [third](other.md#twice-2)\n"
    )
    assert dead_links(page) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#decode-speed (no heading #decode-speed in other.md)",
        "page.md: #nowhere (no heading #nowhere in page.md)",
        "page.md: other.md#twice-2 (no heading #twice-2 in other.md)",
    ]


def test_slugs_follow_githubs_rules():
    assert slug("Decode speed: predicted and measured") == "decode-speed-predicted-and-measured"
    assert slug("Models on demand (`models.<key>.on_demand`)") == "models-on-demand-modelskeyon_demand"
    assert slug("Hardware: unified memory, discrete GPUs, CPUs") == "hardware-unified-memory-discrete-gpus-cpus"
    assert slug("StackConfig") == "stackconfig"
    assert slug("Memory, checked against llama.cpp itself") == "memory-checked-against-llamacpp-itself"


# (c) the set-up commands are the ones CI runs


def test_the_readme_shows_the_setup_commands_ci_runs():
    problems = setup_problems(README.read_text(), (ROOT / ".ci" / "run").read_text(), (ROOT / "Makefile").read_text())
    assert problems == []


def test_a_readme_whose_test_command_is_not_cis_is_caught():
    readme, ci_run, makefile = README.read_text(), (ROOT / ".ci" / "run").read_text(), (ROOT / "Makefile").read_text()
    assert setup_problems(readme, ci_run.replace("make test", "make check"), makefile)
    assert setup_problems(readme.replace("    make test\n", "    make tests\n"), ci_run, makefile)
    assert setup_problems(readme.replace("    make test\n", "    make test\n\n    make lint\n"), ci_run, makefile)
    assert setup_problems(readme, ci_run, makefile.replace("\ntest:", "\ncheck:"))


# The minimal stack file the README shows renders as it is, and with its secrets snippet.


def _yaml_blocks() -> list[str]:
    return re.findall(r"^```yaml\n(.*?)^```$", _section(README.read_text(), "Your own cluster in fifteen minutes"),
                      re.MULTILINE | re.DOTALL)


def _render(tmp_path: Path, stack_text: str):
    from render.output import render_stack

    (tmp_path / "Pulumi.mybox.yaml").write_text(stack_text)
    return render_stack("mybox", tmp_path / "out", project_dir=tmp_path)


def test_the_readmes_minimal_stack_file_renders(tmp_path):
    minimal, _ = _yaml_blocks()
    _render(tmp_path, minimal)
    assert not (tmp_path / "out" / "SECRETS.md").exists()


def test_the_readmes_secret_snippet_renders_with_a_secret_to_create(tmp_path):
    minimal, snippet = _yaml_blocks()
    text = minimal.replace("    storage: null", "    cert_manager_issuer: letsencrypt\n    storage: null", 1)
    text = text.replace("cors_origins: localhost", "cors_origins: https://llm.example.com", 1) + snippet
    _render(tmp_path, text)
    assert "llama-chat-api-key" in (tmp_path / "out" / "SECRETS.md").read_text()


# Top-level folders of this project: a path under one of them, written in a page, names a file or folder here.
PROJECT_FOLDERS = ("components", "config", "engines", "planning", "render", "changes", "incluster", "lab", "tools",
                   "tests", "bench", "common", "policy", "docs", "schemas")
# Written in pages but not project paths: llama.cpp's own source (its common/, docs/ and tools/, llama-quantize's
# tools/quantize among them, are not ours), folders that runs create (ignored by git), the "render/video" groups
# of a GPU node, Kubernetes API groups.
NOT_PROJECT_PATHS = re.compile(r"\.(cpp|h|in)$|^tools/server/|^tools/quantize|^docs/build\.md$|^policy/venv|"
                               r"^bench/results/|^render/video$|^policy/v1")


def _names_project_file(path: str) -> bool:
    """A file or folder, a module's attribute (components/security.SCRATCH_VOLUME), or the stem of files
    a glob names (bench/results-vram-*.json)."""
    module, _, attribute = path.rpartition(".")
    return ((ROOT / path).exists() or (attribute.isidentifier() and (ROOT / f"{module}.py").exists())
            or any(ROOT.glob(path.rstrip("-") + "*")))


def stale_paths(pages: dict[str, str]) -> list[str]:
    found = []
    pattern = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*[\w/])" % "|".join(PROJECT_FOLDERS))
    for page, text in pages.items():
        for match in pattern.finditer(text):
            path = match.group(1).rstrip(".")
            if not NOT_PROJECT_PATHS.search(path) and not _names_project_file(path):
                found.append(f"{page}: {path}")
    return found


def test_every_project_path_a_page_names_exists():
    """Issue #46 item 4: prose that names moved code misleads (tests/contract/ became lab/contract/). Every
    path under a project folder in the README, docs/ and the lab's notes is a file or folder of the project."""
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in
             [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "lab").rglob("*.md"))]}
    assert stale_paths(pages) == []
    assert stale_paths({"x.md": "see tests/contract/server.py and common/arg.cpp"}) == ["x.md: tests/contract/server.py"]


def test_every_project_path_the_code_names_exists():
    """The same for the program's, the lab's and the tools' own comments and docstrings (the tests hold
    deliberate examples of wrong paths, and are left out): a comment naming moved code is caught."""
    files = [p for top in PROJECT_FOLDERS if top != "tests" for p in sorted((ROOT / top).rglob("*.py"))
             if not any("venv" in part or part == "__pycache__" for part in p.parts)]
    files += [ROOT / "__main__.py", ROOT / "plane.py", ROOT / "Makefile"]
    assert stale_paths({str(p.relative_to(ROOT)): p.read_text() for p in files}) == []
    assert stale_paths({"x.py": "# components/security.SCRATCH_VOLUME, components/prefetch/hub_download.py"}) == [
        "x.py: components/prefetch/hub_download.py"]
