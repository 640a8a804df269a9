"""The linear family (nn.Linear): its C++ and Triton kernels against the reference in every dtype each backend takes,
with and without a bias, at output widths of whole panels and with a tail; and the C++ kernel repacking its weights
when they change in place."""

import pytest
import torch
from helpers import TOLERANCE, family_pair

from kernelbot.kernel_library import FAMILIES

FAMILY = FAMILIES["linear"]
LEADS = [[1, 1], [5, 1], [3, 7]]  # decode, a few tokens, a batch of odd length


@pytest.mark.parametrize(("backend", "dtype"), [(b, d) for b, ds in sorted(FAMILY.dtypes.items()) for d in ds])
@pytest.mark.parametrize(("in_features", "out_features", "bias"), [(64, 48, True), (72, 37, False)])
def test_linear_kernels_match_the_reference_in_every_dtype_they_take(backend: str, dtype: str, in_features: int,
                                                                     out_features: int, bias: bool,
                                                                     request: pytest.FixtureRequest) -> None:
    if backend == "triton" and dtype != "float32":
        request.getfixturevalue("bf16_dot_in_the_interpreter")  # half-precision tl.dot, as the verifier runs it
    torch.manual_seed(0)
    reference, kernel = family_pair("linear", backend, in_features, out_features, bias, dtype)
    for config in FAMILY.configs[backend]:
        kernel.CONFIG = config
        for lead in LEADS:
            x = torch.randn(*lead, in_features).to(getattr(torch, dtype))
            with torch.inference_mode():
                got, want = kernel(x), reference(x)
            assert got.dtype == want.dtype and got.shape == (*lead, out_features)
            torch.testing.assert_close(got, want, **TOLERANCE[dtype])


def test_the_cpp_linear_repacks_its_weights_when_they_change_in_place() -> None:
    from kernelbot.kernel_library.linear.cpp import LinearCpp

    layer = LinearCpp(16, 24, False)
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(2, 16)
    before = layer(x)
    with torch.no_grad():
        layer.weight.mul_(2)  # in place: same storage, new version
    torch.testing.assert_close(layer(x), 2 * before)


def test_the_cpp_kernels_run_without_the_gil_so_an_engines_other_python_threads_go_on() -> None:
    # vLLM's worker sends each step's output from another Python thread while the next step computes: a kernel that
    # held the GIL for its whole call (as an unguarded pybind binding does) would stall it
    import threading
    import time

    from kernelbot.kernel_library.linear.cpp import LinearCpp

    layer = LinearCpp(1024, 4096, False)
    x = torch.randn(1024, 1024)
    ticks, stop = [0], threading.Event()

    def count() -> None:
        while not stop.is_set():
            ticks[0] += 1

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel on one core, the counting thread free to take the other
    counter = threading.Thread(target=count)
    try:
        with torch.inference_mode():
            layer(x)  # packs the weights
            counter.start()
            start, before = time.perf_counter(), ticks[0]
            time.sleep(0.2)
            rate = (ticks[0] - before) / (time.perf_counter() - start)  # ticks a second beside an idle main thread
            start, before = time.perf_counter(), ticks[0]
            layer(x)
            during = (ticks[0] - before) / (time.perf_counter() - start)
    finally:
        stop.set()
        torch.set_num_threads(threads)
        if counter.is_alive():
            counter.join()
    assert during > 0.3 * rate, f"{during:.0f} ticks/s during the kernel's call against {rate:.0f} beside it"
