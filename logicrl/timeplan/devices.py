"""Per GPU model: dense bf16 tensor-core peak and memory bandwidth (vendor data sheets, no sparsity).

The first name found in torch.cuda.get_device_name() wins, so the longer names come first.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    bf16_tflops: float
    bandwidth_gbs: float  # HBM/GDDR, GB/s


DEVICES = (
    Device("H100 PCIe", 756.0, 2000.0), Device("H100 NVL", 835.0, 3900.0), Device("H100", 989.4, 3350.0),
    Device("H200", 989.4, 4800.0), Device("H800", 989.4, 3350.0), Device("H20", 148.0, 4000.0),
    Device("B200", 2250.0, 8000.0), Device("A100-SXM4-80GB", 312.0, 2039.0), Device("A100 80GB PCIe", 312.0, 1935.0),
    Device("A100", 312.0, 1555.0), Device("A800", 312.0, 2039.0), Device("L40S", 362.1, 864.0),
    Device("L40", 181.0, 864.0), Device("L4", 121.0, 300.0), Device("A10", 125.0, 600.0),
    Device("RTX 4090", 165.2, 1008.0), Device("RTX 3090", 71.0, 936.0),
)


def device(device_name: str | None) -> Device | None:
    """The row for a torch.cuda.get_device_name(); None for a device the table does not know (or none)."""
    for row in DEVICES:
        if device_name and row.name in device_name:
            return row
    return None
