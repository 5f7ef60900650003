"""core.runner.setup: torch's thread count is pinned without importing torch up front."""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import sys, types
from headatlas.core.runner import setup
setup(types.SimpleNamespace(log=[], threads=2))
assert "torch" not in sys.modules, "setup imported torch"
import torch
print(torch.get_num_threads())
"""


def test_setup_pins_torch_threads_at_first_import():
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1] / "scripts"), OMP_NUM_THREADS="3")
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
