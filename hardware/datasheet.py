"""Published dense peaks of common accelerators, keyed on the trace's deviceProperties.

Half precision is the dense bf16/fp16 tensor-core peak; fp32 is the non-tensor-core peak; bandwidth is
the HBM bandwidth of the SKU most traces come from. AMD MI250 traces show one GCD per device (half the
package), so its row is per GCD.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peaks:
    name: str
    tflops_half: float
    tflops_fp32: float
    gbps: float
    source: str

    def tflops(self, dtype: str) -> float:
        return self.tflops_half if dtype in ("bfloat16", "float16", "float8") else self.tflops_fp32


# (substring of the device name, peaks); the first match wins, so longer names come first.
TABLE: list[tuple[str, Peaks]] = [
    ("H100 PCIe", Peaks("H100 PCIe", 756.0, 51.0, 2000.0, "NVIDIA H100 PCIe datasheet")),
    ("H100", Peaks("H100 SXM", 989.0, 67.0, 3350.0, "NVIDIA H100 SXM datasheet")),
    ("H200", Peaks("H200 SXM", 989.0, 67.0, 4800.0, "NVIDIA H200 SXM datasheet")),
    ("B200", Peaks("B200", 2250.0, 75.0, 8000.0, "NVIDIA B200 datasheet (HGX)")),
    ("A100-SXM4-80GB", Peaks("A100 SXM 80GB", 312.0, 19.5, 2039.0, "NVIDIA A100 datasheet")),
    ("A100", Peaks("A100 40GB", 312.0, 19.5, 1555.0, "NVIDIA A100 datasheet (40 GB HBM2)")),
    ("V100", Peaks("V100 SXM2", 125.0, 15.7, 900.0, "NVIDIA V100 datasheet")),
    ("MI300X", Peaks("MI300X", 1307.0, 163.4, 5300.0, "AMD Instinct MI300X datasheet")),
    ("MI250", Peaks("MI250 (one GCD)", 181.0, 23.9, 1638.0, "AMD Instinct MI250 datasheet, halved per GCD")),
]


def lookup(device_properties: list[dict]) -> Peaks | None:
    """Peaks for the trace's first device, or None when the device is not in the table."""
    if not device_properties:
        return None
    props = device_properties[0]
    name = str(props.get("name", ""))
    for key, peaks in TABLE:
        if key.lower() in name.lower():
            return peaks
    # ROCm reports MI250 GCDs as "AMD Radeon Graphics": recognise gfx90a (9.0) with 104 CUs.
    if "AMD" in name and (props.get("computeMajor"), props.get("computeMinor"), props.get("numSms")) == (9, 0, 104):
        return dict(TABLE)["MI250"]
    return None
