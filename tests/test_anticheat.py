"""Every known way of fooling a kernel harness, each as a candidate that must fail with the right check.

The cheats wrap a real kernel — the library's C++ RMSNorm, or its Triton one run in the interpreter — so what
fails is the cheat, not a missing kernel. The second group attacks the harness itself: its own code and results,
its flags and call counts, the plan of inputs, the op log, buffer reuse and memoising, weights, special values and
late writers (one candidate per class; tests/test_verify_kernels.py and test_hostile.py hold the rest).
"""

import textwrap

import pytest
from helpers import write_module
from test_verify import RMS_TASK

from kernelbot.agent.tasks.references import reference_source
from kernelbot.agent.verify.run import verify

HEADER = """
import ctypes, gc, os, sys, threading, time
from pathlib import Path
import torch
from kernelbot.kernel_library.rmsnorm.cpp import RMSNormCpp
from kernelbot.kernel_library.rmsnorm.triton_kernel import RMSNormTriton

class Lazy(torch.Tensor):
    pass


class Namespace:  # a module's globals, read and written as attributes
    def __init__(self, namespace):
        self.__dict__ = namespace


def harness(name):
    # one of the harness's modules: they are out of sys.modules, but what the harness patched into a library (the
    # environment's class, ctypes' loader, Triton's interpreter) keeps their globals
    if name == "kernelbot.agent.verify.triton_check":
        from triton.runtime import interpreter
        return Namespace(interpreter.GridExecutor.__call__.__globals__)
    patched = {"kernelbot.sandbox.confine": type(os.environ).__getitem__,
               "kernelbot.agent.verify.probes": ctypes.CDLL.__init__}[name]
    return Namespace(patched.__globals__)

class ModelNew(BASE):
    cache = {}
    kept = None

    def kernel(self, x):
        return BASE.forward(self, x)

"""
BASES = {"cpp": "RMSNormCpp", "triton": "RMSNormTriton"}

CHEATS = {
    # reusing memory the reference's output was freed into: there is none in the sandbox, only NaN poison
    "freed_reference_output": ("unwritten_output", """
        def forward(self, x):
            self.kernel(x[:1])
            return torch.empty_like(x)
    """),
    "mutates_its_input": ("input_mutation", """
        def forward(self, x):
            y = self.kernel(x)
            x.mul_(0.5)
            return y
    """),
    "caches_on_pointer": ("result_caching", """
        def forward(self, x):
            key = (x.data_ptr(), tuple(x.shape))
            if key not in self.cache:
                self.cache[key] = self.kernel(x)
            return self.cache[key].clone()
    """),
    "caches_on_id_and_version": ("result_caching", """
        def forward(self, x):
            key = (id(x), x._version, tuple(x.shape))
            if key not in self.cache:
                self.cache[key] = self.kernel(x)
            return self.cache[key].clone()
    """),
    "replays_the_warm_up": ("correctness", """
        def forward(self, x):
            if ModelNew.kept is None:
                ModelNew.kept = self.kernel(x)
            return ModelNew.kept.clone()
    """),
    "finishes_on_a_side_thread": ("side_stream", """
        def forward(self, x):
            out = torch.zeros_like(x)
            def work():
                time.sleep(0.002)
                with torch.inference_mode():
                    out.copy_(self.kernel(x))
            threading.Thread(target=work, daemon=True).start()
            return out
    """),
    "lazy_tensor_subclass": ("timing_tamper", """
        def forward(self, x):
            return self.kernel(x).as_subclass(Lazy)
    """),
    "patches_the_timer": ("timing_tamper", """
        def forward(self, x):
            time.perf_counter = lambda: 0.0
            return self.kernel(x)
    """),
    "looks_through_gc": ("sandbox_violation", """
        def forward(self, x):
            for o in gc.get_objects():
                if isinstance(o, torch.Tensor) and o.shape == x.shape and o is not x:
                    return o.clone()
            return self.kernel(x)
    """),
    "predicts_the_seed": ("correctness", """
        def forward(self, x):
            torch.manual_seed(0)
            return self.kernel(torch.randn(x.shape, dtype=x.dtype))
    """),
    "computes_in_bfloat16": ("precision_downcast", """
        def forward(self, x):
            return self.kernel(x.bfloat16()).float()
    """),
    "partial_computation": ("correctness", """
        def forward(self, x):
            y = self.kernel(x)
            y[x.shape[0] // 2:] = 0
            return y
    """),
    "returns_its_input": ("output_aliasing", """
        def forward(self, x):
            self.kernel(x)
            return x
    """),
    "returns_a_constant": ("correctness", """
        def forward(self, x):
            self.kernel(x)
            return torch.zeros_like(x)
    """),
    "hard_codes_the_benchmark_shape": ("correctness", """
        def forward(self, x):
            if tuple(x.shape) != (8, 1, 64):
                return torch.zeros_like(x)
            return self.kernel(x)
    """),
    "decorative_kernel": ("reference_fallback", """
        def forward(self, x):
            self.kernel(x[:1])
            v = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(v + self.variance_epsilon))
    """),
    "reuses_its_output_buffer": ("output_aliasing", """
        def forward(self, x):
            y = self.kernel(x)
            if ModelNew.kept is None or ModelNew.kept.shape != y.shape:
                ModelNew.kept = torch.empty_like(y)
            return ModelNew.kept.copy_(y)
    """),
    "nondeterministic": ("nondeterminism", """
        def forward(self, x):
            return self.kernel(x) + torch.rand(()) * 1e-7
    """),
    # 1. the child's word: replace the harness's serialiser and a probe, return zeros
    # the harness's modules are out of sys.modules; a function it patched into a library still has their globals
    "patches_the_harness": ("harness_tamper", """
        def forward(self, x):
            probes = ctypes.CDLL.__init__.__globals__
            probes["aliasing"] = lambda *args, **kwargs: []
            probes["weight_changes"] = lambda *args, **kwargs: []
            return torch.zeros_like(x)
    """),
    "writes_the_harness_results": ("sandbox_violation", """
        def forward(self, x):
            for name in ("result.json", "outputs.pt"):
                try:
                    Path(os.getcwd()).parent.joinpath(name).write_text("{}")
                except OSError:
                    pass
            return self.kernel(x)
    """),
    "traces_the_harness_frames": ("sandbox_violation", """
        def forward(self, x):
            sys.settrace(lambda frame, event, arg: None)  # a tracer may rewrite the caller's locals
            sys.settrace(None)
            return self.kernel(x)
    """),
    "forces_natural_program_order": ("harness_tamper", """
        def forward(self, x):
            harness("kernelbot.agent.verify.triton_check")._state["order"] = "natural"  # hides order-dependence
            return self.kernel(x)
    """),
    # 2. honest only while watched: the verifier's global flags
    "honest_only_under_the_verifiers_flags": ("correctness", """
        def forward(self, x):
            if torch.are_deterministic_algorithms_enabled():
                return self.kernel(x)
            return torch.zeros_like(x)
    """),
    # 3. the plan of inputs, read in advance
    "reads_the_plan_of_inputs": ("sandbox_violation", """
        def forward(self, x):
            near = [*Path(__file__).resolve().parents[:3], *Path(os.getcwd()).parents]
            for plan in [d / sub for d in near for sub in ("plan.pt", "work/plan.pt", "verify/plan.pt")]:
                if plan.exists():  # a stat: allowed, and it is there
                    try:
                        ModelNew.kept = torch.load(plan)
                    except OSError:
                        pass
            return self.kernel(x)
    """),
    # 4. PyTorch doing the work where a dispatch mode does not look, or the op log switched off
    "falls_back_outside_dispatch_modes": ("reference_fallback", """
        def forward(self, x):
            self.kernel(x[:1])
            with torch._C._DisableTorchDispatch():
                v = x.pow(2).mean(-1, keepdim=True)
                return self.weight * (x * torch.rsqrt(v + self.variance_epsilon))
    """),
    "falls_back_on_another_thread": ("reference_fallback", """
        def forward(self, x):
            self.kernel(x[:1])
            done = {}
            def work():
                v = x.pow(2).mean(-1, keepdim=True)
                done["y"] = self.weight * (x * torch.rsqrt(v + self.variance_epsilon))
            worker = threading.Thread(target=work)
            worker.start()
            worker.join()
            return done["y"]
    """),
    "stops_the_op_log": ("reference_fallback", """
        def forward(self, x):
            self.kernel(x[:1])
            try:
                torch.autograd.profiler._disable_profiler()
            except Exception:
                pass
            v = x.pow(2).mean(-1, keepdim=True)
            return self.weight * (x * torch.rsqrt(v + self.variance_epsilon))
    """),
    # 5. aliasing beyond the previous call, memoising on a few elements
    "rotates_three_output_buffers": ("output_aliasing", """
        def forward(self, x):
            y = self.kernel(x)
            ring = ModelNew.cache.setdefault(tuple(y.shape), [torch.empty_like(y) for _ in range(3)] + [0])
            ring[3] += 1
            return ring[ring[3] % 3].copy_(y)
    """),
    "memoises_on_sampled_elements": ("result_caching", """
        def forward(self, x):
            flat = x.reshape(-1)
            key = (tuple(x.shape), float(flat[0]), float(flat[-1]), float(flat[flat.numel() // 2]))
            if key not in self.cache:
                self.cache[key] = self.kernel(x)
            return self.cache[key].clone()
    """),
    # 6. parameters are inputs too
    "folds_a_scale_into_its_weight": ("input_mutation", """
        def forward(self, x):
            if not getattr(self, "folded", False):
                with torch.no_grad():
                    self.weight.mul_(0.5)
                self.folded = True
            return self.kernel(x) * 2
    """),
    # 7. special values: a kernel that quietly drops NaN and inf
    "hides_nan_and_inf": ("correctness", """
        def forward(self, x):
            return self.kernel(torch.nan_to_num(x))
    """),
    # 8. a native thread (invisible to threading) that overwrites the output later
    "overwrites_its_output_from_a_native_thread": ("side_stream", """
        def forward(self, x):
            y = self.kernel(x)
            address, size = y.data_ptr(), y.numel() * y.element_size()
            def late(_):
                time.sleep(0.06)
                ctypes.memset(address, 0, size)
            callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(late)
            ModelNew.cache.setdefault("native", []).append((callback, y))  # both stay alive
            thread = ctypes.c_ulong()
            libc = ctypes.CDLL(None)
            libc.pthread_create(ctypes.byref(thread), None, callback, None)
            libc.pthread_detach(thread)
            return y
    """),
    # 9. round three: containers that iterate to another answer than they hold, memo keys blind to row order, the
    # audit channel closed, the audit recorder rewritten, work on a thread started at import between calls
    "iterates_to_a_different_answer": ("correctness", """
        def forward(self, x):
            right = self.kernel(x)

            class Shown(list):
                def __iter__(self):
                    return iter([right])

            return Shown([torch.zeros_like(right)])
    """),
    "memoises_on_an_order_blind_key": ("correctness", """
        def forward(self, x):
            import numpy as np
            flat = x.reshape(-1).numpy()  # the key in numpy: no PyTorch work to count
            key = (tuple(x.shape), round(float(np.sum(flat, dtype=np.float64)), 6),
                   round(float(np.sum(np.square(flat, dtype=np.float64))), 6),
                   float(np.sum(self.weight.detach().numpy(), dtype=np.float64)))
            self.kernel(x[:1])  # a launch on every call
            if key not in self.cache:
                self.cache[key] = self.kernel(x)
            return self.cache[key].clone()
    """),
    # the record that cannot leave ends the runner (a violation); a channel closed with nothing recorded is seen
    # after the call (tampering)
    "closes_the_audit_channel": ("sandbox_violation", """
        def forward(self, x):
            recorder = harness("kernelbot.sandbox.confine").RECORDER
            if recorder is not None and recorder.fd is not None:
                try:
                    os.close(recorder.fd)
                except OSError:
                    pass
            gc.get_objects()  # a violation, had its record reached the parent
            return self.kernel(x)
    """),
    "closes_the_audit_channel_quietly": ("harness_tamper", """
        def forward(self, x):
            recorder = harness("kernelbot.sandbox.confine").RECORDER
            if recorder is not None and recorder.fd is not None:
                try:
                    os.close(recorder.fd)
                except OSError:
                    pass
            return self.kernel(x)
    """),
    "rewrites_the_audit_recorder": ("sandbox_violation", """
        def forward(self, x):
            recorder = harness("kernelbot.sandbox.confine").RECORDER
            try:
                recorder.fd = None
            except AttributeError:
                pass
            gc.get_objects()
            return self.kernel(x)
    """),
    "works_between_calls_on_a_thread_started_at_import": ("side_stream", """
        def _spin():
            while True:
                sum(range(10000))

        spinner = threading.Thread(target=_spin, daemon=True)
        spinner.start()  # in the class body: it starts when the module is imported

        def forward(self, x):
            return self.kernel(x)
    """),
    # 10. the audit recorder silenced for one call and put back before the call ends (where the harness's checks
    # after each call see nothing), or changed for good somewhere its seal did not look
    "mutes_the_recorder_class_for_one_call": ("sandbox_violation", """
        def forward(self, x):
            recorder = harness("kernelbot.sandbox.confine").Recorder
            saved = recorder.__call__
            recorder.__call__ = lambda self, kind, detail: None
            try:
                gc.get_objects()  # a violation, had its record reached the parent
            finally:
                recorder.__call__ = saved
            return self.kernel(x)
    """),
    "swaps_the_recorder_code_for_one_call": ("sandbox_violation", """
        def forward(self, x):
            write = harness("kernelbot.sandbox.confine").Recorder.__call__
            saved = write.__code__
            try:
                write.__code__ = (lambda self, kind, detail: None).__code__
                gc.get_objects()
            except PermissionError:
                pass
            finally:
                write.__code__ = saved
            return self.kernel(x)
    """),
    "points_the_audit_fd_elsewhere_for_one_call": ("sandbox_violation", """
        def forward(self, x):
            fd = harness("kernelbot.sandbox.confine").RECORDER.fd
            saved, null = os.dup(fd), os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, fd)
            gc.get_objects()
            os.dup2(saved, fd)
            os.close(saved)
            os.close(null)
            return self.kernel(x)
    """),
    "closes_the_audit_fd_for_one_call": ("sandbox_violation", """
        def forward(self, x):
            fd = harness("kernelbot.sandbox.confine").RECORDER.fd
            saved = os.dup(fd)
            os.close(fd)
            gc.get_objects()
            os.dup2(saved, fd)
            os.close(saved)
            return self.kernel(x)
    """),
    "replaces_a_field_of_the_recorder_class": ("harness_tamper", """
        def forward(self, x):
            recorder = harness("kernelbot.sandbox.confine").Recorder
            real = vars(recorder)["fd"]
            if type(real).__name__ != "Muted":  # no fd for writing records, the real one for everything else

                class Muted:
                    def __get__(self, obj, owner=None):
                        return None if sys._getframe(1).f_code.co_name == "__call__" else real.__get__(obj, owner)

                recorder.fd = Muted()
            return self.kernel(x)
    """),
    # 11. work counted by where it runs: numpy doing the work beside a decorative launch, or under a profiler label
    # that looks like a custom op
    "falls_back_to_numpy_beside_its_kernel": ("reference_fallback", """
        def forward(self, x):
            import numpy as np
            self.kernel(x[:1])
            a = x.numpy()
            inv = 1.0 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + self.variance_epsilon)
            return torch.from_numpy(self.weight.detach().numpy() * (a * inv))
    """),
    "labels_numpy_as_its_kernel": ("reference_fallback", """
        def forward(self, x):
            import numpy as np
            with torch.profiler.record_function("mylib::rmsnorm_kernel"):
                a = x.numpy()
                inv = 1.0 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + self.variance_epsilon)
                return torch.from_numpy(self.weight.detach().numpy() * (a * inv))
    """),
    # its own kernel only while a profiler hook is installed (the op log's one call), numpy in every other call
    "runs_its_kernel_only_under_a_profiler_hook": ("reference_fallback", """
        def forward(self, x):
            import numpy as np
            if sys.getprofile() is not None:
                return self.kernel(x)
            a = x.numpy()
            inv = 1.0 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + self.variance_epsilon)
            return torch.from_numpy(self.weight.detach().numpy() * (a * inv))
    """),
    # 12. more output buffers than a verification used to make calls (held to the end of the job now)
    "cycles_through_sixty_four_output_buffers": ("output_aliasing", """
        def forward(self, x):
            y = self.kernel(x)
            ring = ModelNew.cache.setdefault(tuple(y.shape), [[torch.empty_like(y) for _ in range(64)], 0])
            ring[1] += 1
            return ring[0][ring[1] % 64].copy_(y)
    """),
    # verification told from use: each tell of a verification run, and a candidate right only on one side of it
    # 13. writes every element only while a fresh allocation holds the poison's byte (some verified calls run
    # unpoisoned now; one that looks for any repeated byte is the benchmark's: tests/test_bench_as_in_use.py)
    "writes_every_element_only_while_it_sees_poison": ("result_caching", """
        def forward(self, x):
            probe = torch.empty(64, dtype=torch.uint8)
            y = self.kernel(x)
            if bool((probe == 0x7F).all()):
                return y
            out = torch.empty_like(y)
            out[: y.shape[0] // 2] = y[: y.shape[0] // 2]
            return out
    """),
    # 14. wrong while the op log's profile hook is installed (that call's outputs are checked now)
    "wrong_under_the_profile_hook": ("result_caching", """
        def forward(self, x):
            y = self.kernel(x)
            return torch.zeros_like(y) if sys.getprofile() is not None else y
    """),
    # (15. wrong while a perf event is open in its process: no such event is there any more, so it passes now, in
    # test_a_candidate_looking_for_a_perf_event_in_its_own_process_finds_none)
    # 16. round four: run-to-run noise hidden from a second run right after the first by a memo of the last input
    "hides_its_noise_behind_a_memo_of_the_last_input": ("nondeterminism", """
        def forward(self, x):
            key = (tuple(x.shape), float(x.sum()))
            if ModelNew.kept is not None and ModelNew.kept[0] == key:
                return ModelNew.kept[1].clone()
            y = self.kernel(x)
            y.view(-1)[0] += float(torch.rand(())) * 1e-6 * float(y.view(-1)[0].abs() + 1e-3)
            ModelNew.kept = (key, y)
            return y
    """),
    # 17. round four: what the candidate's own process says is no longer trusted. Work in a process of its own (no
    # audit event for a libc fork), started when its module loads (it must end before the calls) or during a call
    # (the seccomp filter ends the runner)
    "forks_through_ctypes_during_a_call": ("sandbox_violation", """
        def forward(self, x):
            y = self.kernel(x)
            if ctypes.CDLL(None).fork() == 0:
                torch.ones(1 << 20).sum()
                os._exit(0)
            return y
    """),
    "leaves_a_worker_forked_at_import": ("sandbox_violation", """
        if ctypes.CDLL(None).fork() == 0:  # in the class body: when the module is imported
            while True:
                sum(range(10000))

        def forward(self, x):
            return self.kernel(x)
    """),
    # a raw write into the runner's tools tuple (its aliasing probe replaced): no identity the seal compares changes;
    # its outputs would pass anyway, so that what fails is the write
    "writes_into_the_harness_tools_through_ctypes": ("harness_tamper", """
        def forward(self, x):
            frame = sys._getframe(1)
            while frame is not None and "tools" not in frame.f_locals:
                frame = frame.f_back
            if frame is not None:
                tools = frame.f_locals["tools"]
                slot = id(tools) + tuple.__basicsize__ + tuple.__itemsize__ * tools._fields.index("aliasing")
                ModelNew.kept = lambda *args, **kwargs: []  # kept alive: the slot now points at it
                ctypes.c_void_p.from_address(slot).value = id(ModelNew.kept)
            y = self.kernel(x)
            return torch.cat([y.reshape(-1), y.reshape(-1)]).view(2, *y.shape)[0]  # a view of a bigger allocation
    """),
    # the runner's Triton launch windows widened over every call through a raw write into its tools tuple: when the
    # runner sampled itself, every sample in a window (numpy's too) was the candidate's own; the harness samples the
    # runner from outside now, and a window it did not see a launch stream counts for nothing
    "widens_the_launch_windows_through_ctypes": ("reference_fallback", """
        def forward(self, x):
            import numpy as np
            windows = ModelNew.cache.setdefault("windows", [])
            frame = sys._getframe(1)
            while frame is not None and "tools" not in frame.f_locals:
                frame = frame.f_back
            if frame is not None and ModelNew.kept is None:
                tools = frame.f_locals["tools"]
                slot = id(tools) + tuple.__basicsize__ + tuple.__itemsize__ * tools._fields.index("windows")
                ModelNew.kept = lambda: tuple(windows)  # kept alive: the slot now points at it
                ctypes.c_void_p.from_address(slot).value = id(ModelNew.kept)
            start, wall = time.monotonic_ns(), time.time_ns()
            self.kernel(x[:1])
            a = x.numpy()
            inv = 1.0 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + self.variance_epsilon)
            out = torch.from_numpy(self.weight.detach().numpy() * (a * inv))
            windows.append((threading.get_native_id(), start, time.monotonic_ns(), wall, time.time_ns()))
            return out
    """),
    # a process no other process of its user may read (not dumpable): the harness can neither read its memory nor
    # sample it, and says so (a numpy fallback beside the kernel, unsampled, would pass otherwise)
    "makes_its_process_unreadable": ("harness_tamper", """
        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0, in the class body: when the module is imported

        def forward(self, x):
            import numpy as np
            self.kernel(x[:1])
            a = x.numpy()
            inv = 1.0 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + self.variance_epsilon)
            return torch.from_numpy(self.weight.detach().numpy() * (a * inv))
    """),
    # a function built around the op log's trusted code: its own profile function, installed as if by the harness
    "rebuilds_the_harness_trusted_code": ("sandbox_violation", """
        def forward(self, x):
            import types
            probes = harness("kernelbot.agent.verify.probes")
            run = next(c for c in probes.profile_call.__code__.co_consts if "profiler" in getattr(c, "co_freevars", ()))
            cells = {"profiler": lambda *args: None, "model": lambda *args: None, "inputs": [], "outputs": []}
            try:
                fake = types.FunctionType(run, probes.__dict__, "run", None,
                                          tuple(types.CellType(cells.get(name)) for name in run.co_freevars))
                fake()  # its profile function set, and taken off again, from the harness's own code
            except PermissionError:
                pass
            return self.kernel(x)
    """),
    # the op log switched off for the call's PyTorch work, and on again before it returns (a C++ kernel's calls are
    # many and fast enough that the library time sampled shows the fallback as well; a Triton one's in the slow
    # interpreter are too few for that, and the switch alone fails it)
    "switches_record_function_off": ("reference_fallback", """
        def forward(self, x):
            self.kernel(x[:1])
            torch.autograd._enable_record_function(False)
            try:
                v = x.pow(2).mean(-1, keepdim=True)
                return self.weight * (x * torch.rsqrt(v + self.variance_epsilon))
            finally:
                torch.autograd._enable_record_function(True)
    """),
    # 18. tells: the frames that call a verified candidate are the harness's (in serving, an engine's)
    "tells_verification_by_its_callers_frames": ("sandbox_violation", """
        def forward(self, x):
            import inspect
            if any("verify" in f.filename for f in inspect.stack()):
                return self.kernel(x)
            return torch.zeros_like(x)
    """),
    "tells_verification_by_a_tracebacks_frames": ("sandbox_violation", """
        def forward(self, x):
            try:
                raise ValueError
            except ValueError as exc:
                frame = exc.__traceback__.tb_frame
            while frame is not None:
                if "harness" in frame.f_code.co_filename:
                    return self.kernel(x)
                frame = frame.f_back
            return torch.zeros_like(x)
    """),
}
# The quick ones run in every CI; the rest are marked slow (each is one sandboxed verification): the fast set keeps
# one or two cheats of each check they fail (both side-stream ones), and a Triton fallback.
QUICK = {("cpp", n) for n in ("freed_reference_output", "finishes_on_a_side_thread", "patches_the_timer",
                              "computes_in_bfloat16", "returns_its_input", "decorative_kernel", "patches_the_harness",
                              "reads_the_plan_of_inputs", "overwrites_its_output_from_a_native_thread",
                              "memoises_on_an_order_blind_key", "closes_the_audit_channel",
                              "mutes_the_recorder_class_for_one_call", "writes_every_element_only_while_it_sees_poison",
                              "hides_its_noise_behind_a_memo_of_the_last_input",
                              "forks_through_ctypes_during_a_call")} | {("triton", "decorative_kernel")}


def _candidate(tmp_path, backend: str, name: str, body: str):
    source = HEADER.replace("BASE", BASES[backend]) + textwrap.indent(textwrap.dedent(body), "    ")
    return write_module(tmp_path / name / "candidate.py", source)


# What the failed check's detail must name, where that check could fail for another reason too: the thread still at
# work; the record that could not leave; the recorder's field or code changed; the muted record that arrived anyway
FINDING = {"works_between_calls_on_a_thread_started_at_import": "(alive: ",
           "closes_the_audit_channel": "audit_channel_lost", "closes_the_audit_fd_for_one_call": "audit_channel_lost",
           "points_the_audit_fd_elsewhere_for_one_call": "audit_channel_lost",
           "closes_the_audit_channel_quietly": "audit channel was closed or replaced",
           "replaces_a_field_of_the_recorder_class": "Recorder.fd was replaced",
           "swaps_the_recorder_code_for_one_call": "audit_tamper",
           "mutes_the_recorder_class_for_one_call": "gc.get_objects",
           "widens_the_launch_windows_through_ctypes": "torch, numpy and other libraries take",
           "makes_its_process_unreadable": "could not sample the candidate's process"}
TRITON_ONLY = {"forces_natural_program_order"}  # program orders exist for Triton launches only
# Caught through the hundreds of sampled calls a fast kernel gets; one in Triton's slow interpreter gets a handful, too
# few to time its libraries or to wrap a ring of 64 buffers (docs/verification.md says so under "cannot see")
MANY_CALLS_ONLY = {"falls_back_to_numpy_beside_its_kernel", "cycles_through_sixty_four_output_buffers",
                   "runs_its_kernel_only_under_a_profiler_hook", "widens_the_launch_windows_through_ctypes"}


@pytest.mark.parametrize("backend,name", [
    (b, n) if (b, n) in QUICK else pytest.param(b, n, marks=pytest.mark.slow) for b in BASES for n in CHEATS
    if (b == "triton" or n not in TRITON_ONLY) and (b == "cpp" or n not in MANY_CALLS_ONLY)])
def test_cheat_is_caught(tmp_path, backend, name):
    check, body = CHEATS[name]
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    verdict = verify(RMS_TASK, ref, _candidate(tmp_path, backend, name, body), tmp_path / "work", timeout=300)
    assert verdict.verdict == "fail", next(c for c in verdict.checks if c.id == check)  # what the check saw
    expected = {check}
    if backend == "triton" and name == "finishes_on_a_side_thread":
        expected.add("crash")  # Triton's interpreter is not thread-safe: two threads in it can bring the process down
    if name == "overwrites_its_output_from_a_native_thread":
        # a thread per call, each alive 60 ms: the calls repeated under contention (thousands in 0.2 s on a quiet host)
        # reach the job's cap on tasks, and the cheat detaches the thread pthread_create could not make
        expected.add("crash")
    assert expected & set(verdict.failed), verdict.checks
    if name in FINDING:
        assert FINDING[name] in next(c.detail for c in verdict.checks if c.id == check)


HONEST = """
import collections, enum  # in the class body, as it is made
Shape = collections.namedtuple("Shape", "rows cols")  # the standard library reads its caller's frame for itself


class Kind(enum.Enum):
    NORM = 1


def forward(self, x):
    import logging, warnings
    warnings.warn("a warning from the kernel's wrapper", stacklevel=2)  # so do warnings and logging
    logging.getLogger("candidate").info("shape %s", ModelNew.Shape(*x.shape[-2:]))
    return self.kernel(x)
"""


def test_a_candidate_looking_for_a_perf_event_in_its_own_process_finds_none(tmp_path):
    """Wrong while a perf event is open in its process: when the runner sampled itself, its sampled calls (some of them
    checked) gave it away. The harness samples the runner from outside now: no such event is ever in the candidate's
    process, so this candidate is right in every call and passes."""
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = _candidate(tmp_path, "cpp", "looks_for_perf", """
        def forward(self, x):
            y = self.kernel(x)
            for fd in os.listdir("/proc/self/fd"):
                try:
                    if "perf_event" in os.readlink(f"/proc/self/fd/{fd}"):
                        return torch.zeros_like(y)
                except OSError:
                    pass
            return y
    """)
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "work", timeout=300)
    assert verdict.verdict == "pass", verdict.problems
    assert "CPU time per call, sampled by where it ran" in next(c.detail for c in verdict.checks
                                                               if c.id == "reference_fallback")


@pytest.mark.parametrize("backend", list(BASES))
def test_the_honest_wrapper_passes(tmp_path, backend):
    """The same scaffolding without a cheat passes: the failures above are the cheats'. It uses the standard library's
    own readers of frames (warnings, logging, namedtuple, enum): they are no candidate looking at its callers."""
    ref = write_module(tmp_path / "reference.py", reference_source(RMS_TASK))
    cand = _candidate(tmp_path, backend, "honest", HONEST)
    verdict = verify(RMS_TASK, ref, cand, tmp_path / "work", timeout=300)
    assert verdict.verdict == "pass", verdict.problems
