"""core.runner.setup: torch's thread count is pinned without importing torch up front."""

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = """
import sys, types
from headatlas.core.runner import setup
setup(types.SimpleNamespace(log=[], threads=2))
assert "torch" not in sys.modules, "setup imported torch"
import torch
print(torch.get_num_threads())
"""


def test_setup_pins_torch_threads_at_first_import():
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"), OMP_NUM_THREADS="3")
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "2"


def test_pin_torch_threads_when_already_imported():
    import torch

    from headatlas.core.runner import pin_torch_threads

    before = torch.get_num_threads()
    try:
        pin_torch_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


QUIET = """
import sys, types
from headatlas.core.runner import setup
setup(types.SimpleNamespace(log=[sys.argv[2]], threads=1))
from transformers import AutoModelForMaskedLM
AutoModelForMaskedLM.from_pretrained(sys.argv[1])  # no masked-LM head in the checkpoint: a load report
import logging
logging.getLogger("transformers.x").error("an error still shows")
"""


def test_transformers_reports_go_to_the_log_file_only(tmp_path):
    """The load report (missing weights) and the weight-loading bar stay out of the console (the workflow's
    output); the report is kept in the rule's log file, and transformers' errors still reach the console."""
    from transformers import BertConfig, BertModel

    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    BertModel(config).save_pretrained(tmp_path / "m")
    log = tmp_path / "rule.log"
    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    env.pop("TQDM_DISABLE", None)
    out = subprocess.run(
        [sys.executable, "-c", QUIET, str(tmp_path / "m"), str(log)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "LOAD REPORT" not in out.stderr and "Loading weights" not in out.stderr, out.stderr
    assert "an error still shows" in out.stderr
    text = log.read_text()
    assert "LOAD REPORT" in text and "MISSING" in text.upper(), text


def test_export_library_path_prepends_once(monkeypatch):
    """The Snakefile's route for jobs: scripts/ first on PYTHONPATH, earlier entries kept, never twice."""
    from headatlas.core.runner import export_library_path

    monkeypatch.delenv("PYTHONPATH", raising=False)
    export_library_path("/w/scripts")
    assert os.environ["PYTHONPATH"] == "/w/scripts"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/a", "/b"]))
    export_library_path("/w/scripts")
    export_library_path("/w/scripts")  # the Snakefile is parsed again in each job
    assert os.environ["PYTHONPATH"] == os.pathsep.join(["/w/scripts", "/a", "/b"])


COST = """
import sys, types
from headatlas.core.runner import setup
out = sys.argv[2]
setup(types.SimpleNamespace(log=[sys.argv[1]], threads=1, rule="demo", wildcards={"model": "m", "corpus": "c"},
                            input=[], output=[out]))
import numpy as np
a = np.ones((2000, 2000))  # about 32 MB resident
(a @ a).sum()
open(out, "wb").write(b"x" * 12345)
if len(sys.argv) > 3:
    raise ValueError("the job fails")
"""


def test_setup_writes_a_cost_record_at_exit(tmp_path):
    """Every job leaves ``<log>.cost.json``: rule, wildcards, threads, wall and CPU seconds, peak RSS and its
    outputs' bytes; a failing job's record says why it ended, and the job still fails as it would."""
    from headatlas.core.runner import cost_record_path

    env = dict(os.environ, PYTHONPATH=str(REPO / "scripts"))
    log, out = tmp_path / "logs" / "demo.log", tmp_path / "out.bin"
    subprocess.run([sys.executable, "-c", COST, str(log), str(out)], env=env, check=True, capture_output=True)
    record = json.loads(Path(cost_record_path(str(log))).read_text())
    assert record["rule"] == "demo" and record["wildcards"] == {"model": "m", "corpus": "c"}
    assert record["threads"] == 1 and record["output_bytes"] == 12345 and record["failed"] is None
    assert record["peak_rss_bytes"] > 32e6 and record["cpu_s"] > 0 and record["wall_s"] >= record["cpu_s"] * 0.5
    failed = subprocess.run([sys.executable, "-c", COST, str(log), str(out), "fail"], env=env, capture_output=True)
    assert failed.returncode == 1
    assert json.loads(Path(cost_record_path(str(log))).read_text())["failed"] == "ValueError"


def test_cost_record_failure_never_fails_the_job(tmp_path):
    """A record that cannot be written (its directory is a file) is a warning in the log, not an error."""
    import logging
    import types

    from headatlas.core.runner import write_cost_record

    (tmp_path / "blocked").write_text("")
    job = types.SimpleNamespace(log=[str(tmp_path / "j.log")], threads=1, rule="r", output=[], input=[])
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("test_cost")
    log.addHandler(handler)
    write_cost_record(job, str(tmp_path / "blocked" / "j.log.cost.json"), log)
    assert records and "no cost record" in records[0].getMessage()
