"""How a profiler trace names a dtype (its `Input type` strings), and how records name it: one table for the
library's op matching and the profiler's roofline, importable without torch."""

DTYPE_NAMES = {"float": "float32", "c10::Half": "float16", "c10::BFloat16": "bfloat16", "double": "float64",
               "c10::Float8_e4m3fn": "float8", "c10::Float8_e5m2": "float8"}

# bytes an element of each dtype takes, by the records' names
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8, "float8": 1}
