"""The README is the front door: short, its quick-start commands real, its links resolving.

Every command of the README's "Quick start" blocks must name things that exist: the scripts it runs, the `.venv`
programs (this test runs in that environment), the modules of `python -m`, the `--configfile` files, and
Snakemake options that this Snakemake knows; a `--report` command must use the same `--configfile` as the run
before it (without it, the report plans another DAG and fails). Every relative link (docs/, config/,
benchmarks/, ...) must resolve, anchors included."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

README = REPO / "README.md"
MAX_LINES = 250


def section(text: str, title: str) -> str:
    """The body of the `## title` section."""
    parts = re.split(r"^## ", text, flags=re.M)
    for part in parts[1:]:
        head, _, body = part.partition("\n")
        if head.strip() == title:
            return body
    raise AssertionError(f"README has no '## {title}' section")


def commands(markdown: str) -> list[list[str]]:
    """Every command (split at `&&`, comments dropped) of the ```bash blocks, as argument lists."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", markdown, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            cmd: list[str] = []
            for w in [*words, "&&"]:
                if w == "&&":
                    if cmd:
                        out.append(cmd)
                    cmd = []
                else:
                    cmd.append(w)
    return out


def snakemake_options() -> set[str]:
    """Long options of this Snakemake (from its --help)."""
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "--help"], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(re.findall(r"(--[a-z][a-z0-9-]*)", proc.stdout))


def command_problems(cmds: list[list[str]], root: Path, options: set[str]) -> list[str]:
    """What in these commands does not exist (empty when all is well)."""
    problems = []
    venv_bin = Path(sys.executable).parent
    run_configfile = None
    for cmd in cmds:
        prog, args = cmd[0], cmd[1:]
        text = " ".join(cmd)
        if prog == "bash":
            if not args or not (root / args[0]).is_file():
                problems.append(f"{text}: no script {args[:1]}")
            continue
        if not prog.startswith(".venv/bin/"):
            problems.append(f"{text}: {prog} is not a program of .venv/bin (created by scripts/setup.sh)")
            continue
        name = prog.removeprefix(".venv/bin/")
        if not (venv_bin / name).exists():
            problems.append(f"{text}: {name} is not installed in the environment scripts/setup.sh builds")
        if name == "python" and args[:1] == ["-m"]:
            if len(args) < 2 or importlib.util.find_spec(args[1]) is None:
                problems.append(f"{text}: no module {args[1:2]}")
        if name != "snakemake":
            continue
        configfile = None
        for i, a in enumerate(args):
            if a.startswith("--"):
                flag = a.split("=", 1)[0]
                if flag not in options:
                    problems.append(f"{text}: snakemake has no option {flag}")
            if a == "--configfile":
                configfile = args[i + 1] if i + 1 < len(args) else None
                if configfile is None or not (root / configfile).is_file():
                    problems.append(f"{text}: no config file {configfile}")
            if a == "--cores" and not (i + 1 < len(args) and args[i + 1].isdigit()):
                problems.append(f"{text}: --cores needs a number")
        if "--report" in args:
            if configfile != run_configfile:
                problems.append(f"{text}: the report needs the run's --configfile ({run_configfile})")
        else:
            run_configfile = configfile
    return problems


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def link_problems(text: str, base: Path) -> list[str]:
    """Relative links of a Markdown text (from directory ``base``) whose file or anchor does not exist."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (base / path).resolve() if path else None
        if file is not None and not file.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor and file is not None and file.suffix == ".md":
            heads = re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), flags=re.M)
            if anchor not in {slug(h) for h in heads}:
                problems.append(f"{target}: no heading with anchor #{anchor} in {path}")
    return problems


@pytest.fixture(scope="module")
def text() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_is_short(text):
    n = len(text.splitlines())
    assert n < MAX_LINES, f"README.md has {n} lines; move reference to docs/ (at most {MAX_LINES - 1})"


def test_quick_start_commands_exist(text):
    quick = section(text, "Quick start")
    cmds = commands(quick)
    names = [" ".join(c) for c in cmds]
    assert "bash scripts/setup.sh" in names and len(cmds) >= 5, names
    assert any("--configfile" in c and "--report" not in c for c in cmds), "the quick run is missing"
    assert any("--report" in c for c in cmds), "the report command is missing"
    assert command_problems(cmds, REPO, snakemake_options()) == []


def test_the_checks_catch_broken_commands():
    """A missing script, config or option, or a report without the run's config, is reported."""
    broken = commands(
        "```bash\n"
        "bash scripts/nosuch.sh && .venv/bin/snakemake --cores 2 --configfile config/nosuch.yaml\n"
        ".venv/bin/snakemake --cores 2 --configfile config/quick.yaml\n"
        ".venv/bin/snakemake --report results/report.html --no-such-flag\n"
        ".venv/bin/python -m no_such_module_here\n"
        "```\n"
    )
    problems = command_problems(broken, REPO, {"--cores", "--configfile", "--report"})
    for what in (
        "no script",
        "no config file config/nosuch.yaml",
        "no option --no-such-flag",
        "run's --configfile",
        "no module",
    ):
        assert any(what in p for p in problems), (what, problems)


def test_readme_links_resolve(text):
    links = re.findall(r"\]\(((?:docs|config|benchmarks)/[^)]*)\)", text)
    assert len(links) >= 10, links
    assert link_problems(text, REPO) == []


def test_docs_links_resolve():
    """The pages the README points to link to each other and back correctly too."""
    problems = []
    for page in [*sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks" / "README.md", REPO / "CHANGELOG.md"]:
        problems += [
            f"{page.relative_to(REPO)}: {p}" for p in link_problems(page.read_text(encoding="utf-8"), page.parent)
        ]
    assert problems == []


def test_link_check_catches_a_bad_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Some `code` here\n", encoding="utf-8")
    assert link_problems("[x](a.md#some-code-here) [y](a.md#title)", tmp_path) == []
    assert link_problems("[x](a.md#nope) [y](b.md)", tmp_path) == [
        "a.md#nope: no heading with anchor #nope in a.md",
        "b.md: no such file",
    ]


def test_no_history_in_user_docs():
    """User docs say what is, not what changed: history (commit ids, "this round") is in CHANGELOG.md."""
    pages = [README, REPO / "config" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found = []
    for page in pages:
        for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"this round|before this round|\bcommit [0-9a-f]{7,}\b|\(commit [0-9a-f]{7}", line):
                found.append(f"{page.relative_to(REPO)}:{i}: {line.strip()[:80]}")
    assert found == []
