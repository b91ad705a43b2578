"""The GPU check script also runs on a CPU-only machine, saying what it skips."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import torch

from grader import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
    )


def test_gpu_check_runs_on_this_machine(tmp_path):
    proc = run("--lessons", "01-number-formats", "--quick", "--save", str(tmp_path / "kept"))
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "[PASS] 01-number-formats autograde" in out
    kept = nbformat.read(tmp_path / "kept" / "01-number-formats.ipynb", as_version=4)
    outputs = [o for c in kept.cells if c.cell_type == "code" for o in c.outputs]
    assert any("Running on" in o.get("text", "") for o in outputs), (
        "the executed notebook was not kept"
    )
    assert "fp32" in out and "bf16-amp" in out, "the benchmark table was not printed"
    if not torch.cuda.is_available():
        assert "[SKIP] CUDA autocast op lists: needs a CUDA GPU" in out
        assert "torch sees no GPU" in out
    assert "[PASS] CPU autocast op lists (bfloat16)" in out
    assert "[PASS] lesson 03 documented CPU layer table (bfloat16)" in out


def test_gpu_check_can_insist_on_a_gpu():
    if torch.cuda.is_available():
        return
    proc = run("--require-gpu", "--lessons", "01-number-formats")
    assert proc.returncode == 1
    assert "[FAIL] CUDA" in proc.stdout
