"""Student code in the sandbox gets a writable /dev/shm: libraries that probe for POSIX
semaphores (joblib, at import, through scikit-learn) do not warn with the grader's paths."""

from __future__ import annotations

import subprocess

from grader.sandbox import Limits, Settings, bwrap_command, real_interpreter
from grader.tests.conftest import need_bwrap

PROBE = """
import multiprocessing, os, warnings
warnings.simplefilter("error")
multiprocessing.Semaphore()
import joblib._multiprocessing_helpers as helpers
print("shm", oct(os.stat("/dev/shm").st_mode & 0o7777), helpers.mp is not None)
"""


def test_dev_shm_is_a_private_writable_tmpfs():
    need_bwrap()
    cmd = bwrap_command(Settings(limits=Limits()), ["PYTHON", "-I", "-c", PROBE])
    assert cmd[-4:] == ["PYTHON", "-I", "-c", PROBE]
    cmd[-4] = real_interpreter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "shm 0o1777 True"
