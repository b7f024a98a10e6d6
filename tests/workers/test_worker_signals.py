"""A worker's SIGTERM never lands inside an import: it waits for the import to end, then exits.

An exception raised inside an import can cross a C++ extension's module init (nanobind,
pybind11), which ends the process by std::terminate instead of a clean exit. The worker's
real handler runs here in a real interpreter that signals itself from inside a module body.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXIT_TIMEOUT_S = 30.0

SELF_SIGNALLING = '''
import os, signal, time
print("import started", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.3)  # the handler has run by now: it must not have raised
print("import finished", flush=True)
'''

MAIN = '''
import signal, sys, threading
from omni_actors.workers import main
signal.signal(signal.SIGTERM, main._on_sigterm)
signal.signal(signal.SIGALRM, main._on_sigterm)
sys.path.insert(0, sys.argv[1])
try:
    import self_signalling
    print("after import", flush=True)
    threading.Event().wait(10)  # the deferred SIGTERM ends this wait
    print("not stopped", flush=True)
except SystemExit:
    print("stopped; stop set:", main.SIGNALS.stop, flush=True)
    raise
'''


def test_sigterm_inside_an_import_waits_for_its_end(tmp_path: Path) -> None:
    (tmp_path / "self_signalling.py").write_text(SELF_SIGNALLING)
    done = subprocess.run([sys.executable, "-c", MAIN, str(tmp_path)], capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "import started", "import finished", "after import", "stopped; stop set: True",
    ], done.stdout + done.stderr


def test_sigterm_outside_an_import_stops_at_once(tmp_path: Path) -> None:
    code = MAIN.replace("import self_signalling", "import os; os.kill(os.getpid(), signal.SIGTERM)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True,
                          timeout=EXIT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["stopped; stop set: True"], done.stdout + done.stderr
