"""What the GPU was doing at each step (NVML): SM clock, power, temperature and why its clocks
were held down. A GPU that throttles for heat or a power brake runs slower for reasons that
have nothing to do with the strategy; collect flags runs where that happened."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the results layer reads DISTURBING_REASONS without paying torch's import
    import torch

log = logging.getLogger(__name__)

# NVML's clock event reasons that mean the hardware slowed itself (not idle, not an
# application clock setting, not the usual software power cap under full load).
HW_SLOWDOWN = 0x08
SW_THERMAL = 0x20
HW_THERMAL = 0x40
HW_POWER_BRAKE = 0x80
DISTURBING_REASONS = HW_SLOWDOWN | SW_THERMAL | HW_THERMAL | HW_POWER_BRAKE


class GpuTelemetry:
    """NVML readings for one CUDA device; `sample()` is {} on CPU or where nvidia-ml-py cannot
    read the device (the run still trains; run.json says why telemetry is missing)."""

    def __init__(self, device: torch.device):
        self.handle = None
        self.unavailable: str | None = None
        if device.type != "cuda":
            self.unavailable = "not a CUDA device"
            return
        try:
            import pynvml
            import torch

            pynvml.nvmlInit()
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            self.handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
            self._nvml = pynvml
        except Exception as exc:  # ImportError, NVMLError_*: telemetry is optional, the run is not
            self.unavailable = f"NVML unavailable: {exc}"
            log.warning("GPU telemetry off: %s", self.unavailable)

    def sample(self) -> dict:
        if self.handle is None:
            return {}
        nvml, handle = self._nvml, self.handle
        try:
            return {
                "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                "temperature_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                "clock_event_reasons": int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle)),
            }
        except nvml.NVMLError as exc:
            self.handle, self.unavailable = None, f"NVML stopped answering: {exc}"
            log.warning("GPU telemetry off: %s", self.unavailable)
            return {}
