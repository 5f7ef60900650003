"""What the workflow prints on the terminal: job names, progress and problems.

Snakemake writes every job it starts as a block (input list, output, log, reason, resources); for a
rule whose inputs are a model's files or a dozen treebanks one input line runs to thousands of
characters. :func:`one_line_jobs` gives the terminal a one-line start and end per job (time, rule,
wildcards, job id) and drops the host banner and the scheduler's "Select jobs to execute..." /
"Execute N jobs..." lines; the log file of the run (``.snakemake/log/*.snakemake.log``) keeps
Snakemake's full output, and a failed job's error (with its log, ``show-failed-logs``) is printed in
full. A dry run keeps Snakemake's job blocks: what would run, on which inputs and why is what it is for.
Snakemake's own ``--quiet rules`` is no substitute: it also hides failed jobs.
"""

from __future__ import annotations

import logging
import re
import time

TERMINAL = "DefaultStreamHandler"  # the name of Snakemake's terminal handler


SCHEDULER = re.compile(r"Select jobs to execute\.\.\.|Execute \d+ jobs\.\.\.")  # said before every job


def job_line(record: logging.LogRecord) -> str:
    """A started job as one line: ``[HH:MM:SS] rule NAME (wildcard=value, ...): jobid N`` (``localrule`` for a
    job that runs in Snakemake's own process, as Snakemake's job block says)."""
    wc = ", ".join(f"{k}={v}" for k, v in dict(getattr(record, "wildcards", None) or {}).items())
    kind = "localrule" if getattr(record, "local", False) else "rule"
    return (
        f"[{time.strftime('%H:%M:%S')}] {kind} {record.rule_name}"
        + (f" ({wc})" if wc else "")
        + f": jobid {record.jobid}"
    )


class OneLineJobs(logging.Formatter):
    """Snakemake's formatter, but a started job (without a ``message:``) is one line (:func:`job_line`),
    and so is a finished one (``[HH:MM:SS] Finished jobid: N (Rule: NAME)``)."""

    def __init__(self, inner: logging.Formatter | None):
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        from snakemake.logging import LogEvent, get_event

        event = get_event(record)
        if event == LogEvent.JOB_INFO and not getattr(record, "rule_msg", None):
            return job_line(record)
        if event == LogEvent.JOB_FINISHED:
            return f"[{time.strftime('%H:%M:%S')}] {record.getMessage()}"
        return self.inner.format(record)


def no_banner(record: logging.LogRecord) -> bool:
    """False for Snakemake's host banner (date, platform, host, paths) and the scheduler's lines before every
    job (:data:`SCHEDULER`): the log file keeps them."""
    from snakemake.settings.enums import Quietness

    if getattr(record, "quietness", None) == Quietness.HOST:
        return False
    return not (isinstance(record.msg, str) and SCHEDULER.fullmatch(record.msg))


def one_line_jobs(logger: logging.Logger | None = None) -> bool:
    """Give Snakemake's terminal handler :class:`OneLineJobs` and :func:`no_banner` (once) in a run; a dry run
    (``-n``) keeps every job's details on the terminal, since they are what it is asked for. True when the
    handler was changed (a logger plugin that writes to the terminal replaces it: then nothing changes)."""
    if logger is None:
        from snakemake.logging import logger
    found = False
    for h in logger.handlers:
        if h.name == TERMINAL and not any(getattr(f, "dryrun", False) for f in h.filters):
            found = True
            if not isinstance(h.formatter, OneLineJobs):
                h.setFormatter(OneLineJobs(h.formatter))
                h.addFilter(no_banner)
    return found
