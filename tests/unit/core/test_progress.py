"""core.progress: log lines every `every` seconds with done / total, rate and ETA (fake clock)."""

import io
import logging

import pytest

from headatlas.core.progress import Progress, duration, progress


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def lines(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "headatlas.progress"]


def test_duration():
    assert duration(9) == "9s"
    assert duration(75) == "1m15s"
    assert duration(3725) == "1h02m"


def test_logs_every_30_seconds_with_rate_and_eta(caplog):
    caplog.set_level(logging.INFO, logger="headatlas.progress")
    clock = Clock()
    p = Progress(1000, "extract m", unit="tokens", clock=clock, stream=io.StringIO())
    for _ in range(10):  # 100 tokens every 10 s: 10 tokens/s
        clock.t += 10
        p.update(100)
    assert lines(caplog) == [
        "extract m: 300 / 1,000 tokens (30%), 10 tokens/s, elapsed 30s, ETA 1m10s",
        "extract m: 600 / 1,000 tokens (60%), 10 tokens/s, elapsed 1m00s, ETA 40s",
        "extract m: 900 / 1,000 tokens (90%), 10 tokens/s, elapsed 1m30s, ETA 10s",
        "extract m: 1,000 / 1,000 tokens (100%), 10 tokens/s, elapsed 1m40s (done)",  # total reached
    ]
    p.close()  # logs nothing more
    assert len(lines(caplog)) == 4


def test_progress_wraps_a_loop_with_weights(caplog):
    caplog.set_level(logging.INFO, logger="headatlas.progress")
    clock = Clock()
    seen = []
    for item in progress([1, 2, 3], "w", total=6, unit="tokens", weight=lambda x: x, clock=clock, every=1):
        clock.t += 1
        seen.append(item)
    assert seen == [1, 2, 3]
    assert lines(caplog) == [
        "w: 1 / 6 tokens (17%), 1.0 tokens/s, elapsed 1s, ETA 5s",
        "w: 3 / 6 tokens (50%), 1.5 tokens/s, elapsed 2s, ETA 2s",
        "w: 6 / 6 tokens (100%), 2.0 tokens/s, elapsed 3s",
        "w: 6 / 6 tokens (100%), 2.0 tokens/s, elapsed 3s (done)",
    ]


def test_total_defaults_to_len_and_unknown_total(caplog):
    caplog.set_level(logging.INFO, logger="headatlas.progress")
    list(progress(range(4), "a", clock=Clock()))
    assert lines(caplog)[-1].startswith("a: 4 / 4 items (100%)")
    list(progress(iter(range(3)), "b", clock=Clock()))
    assert lines(caplog)[-1].startswith("b: 3 items, ")


def test_no_done_line_when_the_loop_breaks(caplog):
    caplog.set_level(logging.INFO, logger="headatlas.progress")
    for _ in progress(range(10), "c", clock=Clock()):
        break
    assert not lines(caplog)


@pytest.mark.parametrize("tty", [True, False])
def test_bar_only_on_a_terminal(tty, caplog):
    caplog.set_level(logging.INFO, logger="headatlas.progress")

    class Stream(io.StringIO):
        def isatty(self):
            return tty

    s, clock = Stream(), Clock()
    p = Progress(4, "d", clock=clock, stream=s)
    for _ in range(4):
        clock.t += 1
        p.update()
    p.close()
    out = s.getvalue()
    if tty:
        assert "\r\033[K[" in out and "[########################] d: 4 / 4 items (100%)" in out
    else:
        assert out == ""
    assert lines(caplog)[-1].endswith("(done)")
