"""The documented swap-in script: a vLLM-style consumer on ctlplane.ec, the Python
reference producer against it unchanged."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "swap_in_consumer.py"


@pytest.mark.parametrize("tp", [1, 2])
def test_reference_producer_runs_against_swapped_in_consumer(tp):
    run = subprocess.run([sys.executable, str(SCRIPT), "--tp", str(tp)], capture_output=True, text=True,
                         timeout=150)
    assert run.returncode == 0, run.stdout + run.stderr
    assert '"ok": true' in run.stdout
