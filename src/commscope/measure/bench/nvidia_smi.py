"""nvidia-smi beside a sustained run: which query this driver answers, and a sampler of SM clock and power.

:func:`_smi_query` finds the device name and field names the installed nvidia-smi answers (the UUID first, since
``CUDA_VISIBLE_DEVICES`` renumbers indices; the throttle reasons under their old or new name); :class:`_SmiSampler`
runs one query every interval from a thread while the sustained layers run; :func:`smi_rows` turns its lines into
rows of :data:`~commscope.measure.bench.kernel_files.SMI_COLUMNS`. Where nvidia-smi is absent, nothing is sampled.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from typing import Any, Self

from commscope.measure.bench.kernel_files import SMI_COLUMNS

__all__ = ["SMI_QUERY", "smi_rows"]

#: nvidia-smi's names of :data:`SMI_COLUMNS` (``clocks_event_reasons`` is the newer drivers' name of the last).
SMI_QUERY = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
_SMI_QUERY_NEW = (*SMI_QUERY[:-1], "clocks_event_reasons.active")


def _smi_command(device_id: str, fields: Sequence[str]) -> list[str]:
    """One nvidia-smi query of ``fields`` for ``device_id``, one CSV line without header."""
    return [shutil.which("nvidia-smi") or "nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader",
            "-i", device_id]


def _smi_devices(torch: Any, device: Any) -> list[str]:
    """nvidia-smi's names of ``device`` to try: its UUID (CUDA_VISIBLE_DEVICES renumbers the indices), then the
    index CUDA_VISIBLE_DEVICES maps it to, then its own index."""
    import os

    out = []
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        out.append(text if text.startswith("GPU-") else f"GPU-{text}")
    index = device.index or 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible):
        out.append(visible[index])
    out.append(str(index))
    return list(dict.fromkeys(out))


def _smi_query(devices: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """(device name, query fields) that this nvidia-smi answers (the old or the new name of the throttle reasons,
    or none), or None: no nvidia-smi, or it does not answer."""
    if shutil.which("nvidia-smi") is None:
        return None
    for device_id in devices:
        for fields in (SMI_QUERY, _SMI_QUERY_NEW, SMI_QUERY[:-1]):
            try:
                done = subprocess.run(_smi_command(device_id, fields), check=False, capture_output=True, text=True,
                                      timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                return None
            if done.returncode == 0 and len(done.stdout.strip().split(",")) == len(fields):
                return device_id, fields
    return None


class _SmiSampler:
    """nvidia-smi queried every ``interval_s`` from a thread while the sustained run lasts: one complete process
    per sample, so no line is lost to a pipe's buffer when sampling stops."""

    def __init__(self, device_id: str, fields: Sequence[str], interval_s: float) -> None:
        import threading

        self.command = _smi_command(device_id, fields)
        self.interval_s = interval_s
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvidia-smi sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                done = subprocess.run(self.command, check=False, capture_output=True, text=True, timeout=10)
                if done.returncode == 0:
                    self.lines += [line for line in done.stdout.splitlines() if line.strip()]
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def smi_rows(text: str) -> list[dict[str, str]]:
    """nvidia-smi's ``--format=csv,noheader`` lines as rows of :data:`SMI_COLUMNS` (values as it prints them,
    ``" 1575 MHz"``; the fit reads the number before the unit)."""
    rows = []
    for line in text.splitlines():
        cells = line.split(",")
        if len(cells) >= 3:
            rows.append(dict(zip(SMI_COLUMNS, cells)))
    return rows
