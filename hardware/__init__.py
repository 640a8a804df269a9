"""The hardware every stage measures on, below profiler and engine: the device a run computes on (device.py), how
busy the host is (host.py), GPU telemetry (telemetry.py), and the roofline's peaks, measured (peaks.py) and
published (datasheet.py)."""
