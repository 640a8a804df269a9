"""The benchmark is no place to misbehave: its checked calls' outputs are held to the end as verification's are, the
candidate's own threads may not work while the reference is timed, and some of its calls look like verified ones
(poisoned allocations, a pause before them) without being told apart from the checked ones."""

import pytest
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.bench import bench

RING = """
import torch
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp


class ModelNew(RMSNormCpp):
    ring = []

    def forward(self, x):
        y = super().forward(x)
        if len(self.ring) < 4:
            self.ring.append(torch.empty_like(y))
        self.ring.append(self.ring.pop(0))
        return self.ring[-1].copy_(y)
"""

# works only while no call of its own runs (the reference's turn, whose timings it would slow down), in hashing that
# lets go of the GIL
BUSY_BETWEEN_CALLS = """
import hashlib
import threading
import time
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp

LAST = [time.monotonic()]
BLOCK = bytes(1 << 20)


def _work():
    while True:
        if time.monotonic() - LAST[0] > 0.005:
            hashlib.sha256(BLOCK).digest()
        else:
            time.sleep(0.001)


threading.Thread(target=_work, daemon=True).start()


class ModelNew(RMSNormCpp):
    def forward(self, x):
        out = super().forward(x)
        LAST[0] = time.monotonic()
        return out
"""

# writes every element only while fresh memory holds one repeated byte, as verification's poisoned allocations (and
# the chunks freed while poisoned) do
WRITES_ALL_ONLY_WHILE_POISONED = """
import torch
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp


class ModelNew(RMSNormCpp):
    def forward(self, x):
        probe = torch.empty(64, dtype=torch.uint8)
        y = super().forward(x)
        if bool((probe == probe[0]).all()) and int(probe[0]) != 0:
            return y
        out = torch.empty_like(y)
        out[: y.shape[0] // 2] = y[: y.shape[0] // 2]
        return out
"""

HONEST = "from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp as ModelNew\n"


def _bench(tmp_path, source: str, rounds: int = 2):
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = write_module(tmp_path / "cand" / "candidate.py", source)
    return bench(RMS_TASK, ref, cand, tmp_path / "bench", rounds=rounds, device="cpu")


@pytest.mark.slow  # the quick cheat tier's rotates_three_output_buffers and cycles_through_sixty_four_output_buffers
def test_a_ring_of_output_buffers_is_refused_by_the_benchmark(tmp_path):
    # 2 rounds, 4 checked calls each: 8 held outputs from a ring of 4 must share memory
    with pytest.raises(RuntimeError, match="benchmark refused: .*reuses the memory of an earlier call's output"):
        _bench(tmp_path, RING)


def test_a_thread_that_works_while_the_reference_is_timed_is_refused_by_the_benchmark(tmp_path):
    with pytest.raises(RuntimeError, match="benchmark refused: .*the candidate's threads used"):
        _bench(tmp_path, BUSY_BETWEEN_CALLS)


@pytest.mark.slow  # the benchmark caught it before poison came to its calls too: a guard that it still does
def test_a_kernel_that_writes_every_element_only_while_memory_looks_poisoned_is_refused_by_the_benchmark(tmp_path):
    with pytest.raises(RuntimeError, match="timed call's output is wrong"):
        _bench(tmp_path, WRITES_ALL_ONLY_WHILE_POISONED)


def test_an_honest_library_kernel_is_timed_with_its_thread_pool_between_calls(tmp_path):
    # rows enough for the kernel's OpenMP pool to run (generated C++ whose pool spins longer after each call is
    # benchmarked in tests/test_open_world.py and test_llm.py: a pool's spin between its own calls is no finding)
    task = RMS_TASK.model_copy(update={"input_shapes": [[512, 1, 1024]], "init_args": [1024, 1e-6]})
    ref = write_module(tmp_path / "reference.py", reference_source(task))
    cand = write_module(tmp_path / "cand" / "candidate.py", HONEST)
    result = bench(task, ref, cand, tmp_path / "bench", rounds=2, device="cpu")
    assert result.rounds == 2 and result.candidate_us > 0 and result.reference_us > 0
    # 4 KB of weights: the most copies, which still fit the cache, and the result says it is a warm-cache figure
    assert result.weight_copies == 64 and result.cache_resident


def test_weights_are_cycled_over_copies_enough_to_stream_them_from_memory(monkeypatch):
    from kernelbot.agent.verify import bench as bench_module

    monkeypatch.setattr(bench_module.host, "last_level_cache_bytes", lambda: 32 << 20)
    mlp, lm_head = 3 * 896 * 4864 * 2, 151936 * 896 * 2  # a Qwen2.5-0.5B layer's MLP, its LM head (bf16)
    assert bench_module.weight_copies(mlp, "cpu") == 3  # 78 MB over 3 copies: past twice the 32 MiB cache
    assert bench_module.weight_copies(lm_head, "cpu") == 1  # streams from memory as it is
    assert bench_module.weight_copies(4096, "cpu") == 64  # the most copies
    assert bench_module.weight_copies(1 << 30, "cpu") == 1 and bench_module.weight_copies(mlp, "cuda:0") == 1


def test_a_kv_cache_input_is_rotated_over_enough_draws_to_leave_the_cache_and_activations_are_not(monkeypatch):
    import torch

    from kernelbot.agent.verify import bench as bench_module
    from kernelbot.records import Task

    monkeypatch.setattr(bench_module.host, "last_level_cache_bytes", lambda: 32 << 20)

    def task(family: str) -> Task:
        return Task(id="t", hotspot_id="h", family=family, module_class="M", dtype="bfloat16", input_shapes=[],
                    free_dims=[], init_args=[], share=0.1, floor_us=1.0)

    query, cache = torch.zeros(8, 14, 64, dtype=torch.bfloat16), torch.zeros(60, 2, 128, 128, dtype=torch.bfloat16)
    paged = [query, cache, torch.zeros(8, 5, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)]
    # a 3.9 MB cache: 18 draws fill twice the 32 MiB cache, as a model's 24 layers' caches do between one layer's calls
    assert bench_module.input_draws(bench_module.state_bytes(task("paged_attention"), paged), "cpu") == 18
    past = torch.zeros(8, 2, 512, 64, dtype=torch.bfloat16)  # decode attention's past keys and values, 1 MB each
    decode = bench_module.state_bytes(task("decode_attention"), [torch.zeros(8, 1, 896), None, None, past, past])
    assert decode == 2 << 20 and bench_module.input_draws(decode, "cpu") == 32
    # an activation comes warm from the op before it
    assert bench_module.state_bytes(task("rmsnorm"), [torch.zeros(8, 896, dtype=torch.bfloat16)]) == 0
    assert bench_module.input_draws(0, "cpu") == bench_module.POOL
    assert bench_module.input_draws(bench_module.state_bytes(task("paged_attention"), paged), "cuda:0") == \
        bench_module.POOL
