"""What a run prints on the terminal: job names, progress and problems; the details go to the log files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPTS = REPO / "scripts"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"

WORKFLOW = f"""
import sys
sys.path.insert(0, {str(SCRIPTS)!r})
from headatlas.core.terminal import one_line_jobs
one_line_jobs()

rule all:
    input: "b.txt"

rule a:
    input: {", ".join(repr(f"in/{i:03d}_" + "x" * 60 + ".txt") for i in range(40))}
    output: "a.txt"
    log: "logs/a.log"
    shell: "echo making a > {{log}}; echo x > {{output}}"

rule b:
    input: "a.txt"
    output: "b.txt"
    log: "logs/b.log"
    shell: "echo the reason it failed > {{log}}; exit 3"
"""


def test_a_started_job_is_one_line_a_failed_one_in_full_and_the_log_file_keeps_the_details(tmp_path):
    (tmp_path / "Snakefile").write_text(WORKFLOW)
    (tmp_path / "in").mkdir()
    for i in range(40):
        (tmp_path / "in" / (f"{i:03d}_" + "x" * 60 + ".txt")).write_text("x")
    out = subprocess.run(
        [str(SNAKEMAKE), "--cores", "1", "--show-failed-logs", "--nocolor"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    term = out.stderr + out.stdout
    lines = term.splitlines()
    started = [
        re.sub(r"^\[\d\d:\d\d:\d\d\] ", "", x) for x in lines if re.match(r"\[\d\d:\d\d:\d\d\] (local)?rule ", x)
    ]
    assert started == ["localrule a: jobid 2", "localrule b: jobid 1"], term  # a local run, as Snakemake says
    assert any(re.fullmatch(r"\[\d\d:\d\d:\d\d\] Finished jobid: 2 \(Rule: a\)", x) for x in lines), term
    assert "Select jobs to execute" not in term and "1 of 3 steps (33%) done" in term
    assert max(map(len, lines)) < 200, max(lines, key=len)  # no input list of 40 files on one line
    assert "Platform:" not in term  # the host banner stays in the log file
    # the failed job: its error block, its log named and shown
    assert "Error in rule b:" in term and "logs/b.log" in term and "the reason it failed" in term
    dry = subprocess.run(
        [str(SNAKEMAKE), "-n", "--cores", "1", "--nocolor", "--forceall"], cwd=tmp_path, capture_output=True, text=True
    )
    assert "    input: in/000_" in dry.stdout + dry.stderr  # a dry run shows what would run, on which inputs
    log = next((tmp_path / ".snakemake" / "log").glob("*.snakemake.log")).read_text()
    assert "input: in/000_" in log and "Platform:" in log and "Select jobs to execute" in log  # all in the log file


RULE = """
import logging, sys, types
from headatlas.core.runner import setup
log = setup(types.SimpleNamespace(log=[sys.argv[1]], threads=1))
log.info("a detail for the log file")
logging.getLogger("headatlas.progress").info("extract: 10 / 20 sequences (50%)")
log.warning("a problem for the terminal")
"""


def test_a_jobs_terminal_gets_problems_and_progress_its_log_file_everything(tmp_path):
    log = tmp_path / "rule.log"
    env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    out = subprocess.run([sys.executable, "-c", RULE, str(log)], env=env, capture_output=True, text=True, check=True)
    assert "a problem for the terminal" in out.stderr and "10 / 20 sequences" in out.stderr
    assert "a detail" not in out.stderr
    text = log.read_text()
    assert "a detail for the log file" in text and "a problem for the terminal" in text and "10 / 20" in text
