"""Notebook 23's claims about PyTorch and Python, checked against the installed ones: the process
group's default time-outs, faulthandler's watchdog, and the flight recorder's settings and reader."""
from __future__ import annotations

import datetime
import mmap
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.timeout(120)


def test_the_default_timeouts_are_30_minutes_for_gloo_and_10_for_nccl() -> None:
    """Notebook 23: "by default 30 minutes with gloo and 10 minutes with NCCL"."""
    from torch.distributed import constants, distributed_c10d

    assert constants.default_pg_timeout == datetime.timedelta(minutes=30)
    assert constants.default_pg_nccl_timeout == datetime.timedelta(minutes=10)
    # what init_process_group uses when it is given no timeout=
    assert distributed_c10d._get_default_timeout("gloo") == datetime.timedelta(minutes=30)
    assert distributed_c10d._get_default_timeout("nccl") == datetime.timedelta(minutes=10)


@pytest.mark.launch
def test_a_watchdog_re_armed_every_step_fires_only_on_a_stuck_one() -> None:
    """Notebook 23: dump_traceback_later prints every thread's stack once its time has passed, unless
    cancelled; a second call replaces the first and starts the clock again; exit=True ends the process."""
    program = textwrap.dedent("""
        import faulthandler, time
        def stuck():
            time.sleep(30)
        for step in range(4):
            faulthandler.dump_traceback_later(2, exit=True)  # re-armed: 4 steps of 1 s never reach it
            time.sleep(1.0)
        print("four steps", flush=True)
        faulthandler.cancel_dump_traceback_later()
        time.sleep(2)  # cancelled: no dump
        print("cancelled", flush=True)
        faulthandler.dump_traceback_later(1, exit=True)
        stuck()
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert result.stdout.split() == ["four", "steps", "cancelled"], result
    assert result.stderr.startswith("Timeout (0:00:01)!") and 'line 4 in stuck' in result.stderr, result.stderr
    assert result.returncode == 1, result  # exit=True: the watchdog ended the stuck process


def test_the_flight_recorder_s_settings_and_reader_are_this_torch_s() -> None:
    """Notebook 23: TORCH_FR_BUFFER_SIZE (older name TORCH_NCCL_TRACE_BUFFER_SIZE) turns the recorder on,
    TORCH_NCCL_DUMP_ON_TIMEOUT dumps it when a collective times out, TORCH_FR_DUMP_TEMP_FILE names the
    files, and torchfrtrace (torch.distributed.flight_recorder.fr_trace) reads them."""
    from torch.distributed import distributed_c10d
    from torch.distributed.flight_recorder import fr_trace

    source = Path(distributed_c10d.__file__).read_text()
    assert '"TORCH_FR_BUFFER_SIZE",\n' in source and 'os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE", "0")' in source
    assert callable(fr_trace.main) and (Path(sys.executable).parent / "torchfrtrace").exists()
    libraries = Path(torch.__file__).parent / "lib"
    wanted = {b"TORCH_NCCL_DUMP_ON_TIMEOUT", b"TORCH_FR_DUMP_TEMP_FILE"}
    found = set()
    for library in libraries.glob("libtorch_c*.so"):
        with open(library, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            found |= {name for name in wanted if data.find(name + b"\0") >= 0}
    assert found == wanted, found
