"""kernelbot rank on hand-made traces whose answers are known, on nsys inputs, and on the real traces."""

import gzip
import json
import sqlite3
import subprocess
import sys

import pytest

from kernelbot import KernelbotError
from kernelbot.profiler.rank import rank

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "computeMajor": 8, "computeMinor": 0, "numSms": 108}]
MM_DIMS = [[64, 128], [128, 256]]


def op(name, ts, dur, ext, dims=(), types=(), tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"External id": ext, "Input Dims": list(dims), "Input type": list(types)}}


def launch(ts, corr, ext, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts, "dur": 3,
            "args": {"correlation": corr, "External id": ext}}


def kernel(name, ts, dur, corr, ext):
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "External id": ext, "device": 0, "stream": 7}}


def small_trace(consistent: bool = True, device=A100) -> dict:
    """mm (64x128 @ 128x256, fp32) → gemm 40 us; add → elementwise 10 us; an NCCL all-reduce 100 us.
    GPU activity: [1000,1040], [1100,1110], [1200,1300]: busy 150 of a 300 us span."""
    bad = 1000 if not consistent else 0  # External ids that name no op at all
    events = [
        op("aten::linear", 0, 120, 4, MM_DIMS, ["float", "float"]),
        op("aten::mm", 5, 100, 5, MM_DIMS, ["float", "float"]),
        launch(10, corr=1, ext=5 + bad),
        op("aten::add", 200, 50, 6, [[64, 256], [64, 256], []], ["float", "float", "Scalar"]),
        launch(210, corr=2, ext=6 + bad),
        op("record_param_comms", 300, 30, 7),
        launch(305, corr=3, ext=7 + bad),
        kernel("ampere_sgemm_64x64_nn", 1000, 40, 1, 5 + bad),
        kernel("vectorized_elementwise_kernel<add>", 1100, 10, 2, 6 + bad),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float", 1200, 100, 3, 7 + bad),
    ]
    return {"deviceProperties": device, "traceEvents": events}


def write(path, data, gz=True):
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def by_name(report):
    return {k.name: k for k in report.kernels}


@pytest.mark.parametrize("consistent", [True, False])
def test_kernels_link_to_the_innermost_op(tmp_path, consistent):
    report = rank(write(tmp_path / "t.json.gz", small_trace(consistent)))
    assert report.linking.startswith("external id" if consistent else "time containment")
    k = by_name(report)
    assert k["ampere_sgemm_64x64_nn"].op == "aten::mm"  # not the enclosing aten::linear
    assert k["ampere_sgemm_64x64_nn"].shapes == MM_DIMS
    assert k["vectorized_elementwise_kernel<add>"].op == "aten::add"
    assert k["ncclKernel_AllReduce_RING_LL_Sum_float"].op == "record_param_comms"


def test_totals_shares_idle_and_floors(tmp_path):
    report = rank(write(tmp_path / "t.json", small_trace(), gz=False))
    assert report.gpu_busy_us == 150 and report.gpu_idle_share == pytest.approx(0.5)
    assert report.launches == 3
    k = by_name(report)
    gemm = k["ampere_sgemm_64x64_nn"]
    assert (gemm.total_us, gemm.count, gemm.share) == (40, 1, pytest.approx(40 / 150))
    flops, nbytes = 2 * 64 * 128 * 256, (64 * 128 + 128 * 256 + 64 * 256) * 4
    floor = max(flops / 19.5e6, nbytes / 2039e3)  # A100 80GB: 19.5 fp32 TFLOP/s, 2039 GB/s
    assert gemm.floor_us == pytest.approx(floor, rel=1e-3) and gemm.floor_known
    assert gemm.score == pytest.approx(40 - floor, rel=1e-3)
    nccl = k["ncclKernel_AllReduce_RING_LL_Sum_float"]
    assert nccl.communication and nccl.score == 0
    assert [s.name for s in report.kernels][0] == "ampere_sgemm_64x64_nn"  # the NCCL kernel is longer, not a target
    assert rank(tmp_path / "t.json", sort="time").kernels[0].name == nccl.name


def test_peak_overrides_and_unknown_devices(tmp_path):
    unknown = rank(write(tmp_path / "u.json.gz", small_trace(device=[{"name": "Mystery GPU 9000"}])))
    assert "not in the peaks table" in unknown.peaks and "--peak-tflops" in unknown.peaks
    assert not by_name(unknown)["ampere_sgemm_64x64_nn"].floor_known
    given = rank(tmp_path / "u.json.gz", tflops=100.0, gbps=1000.0)
    gemm = by_name(given)["ampere_sgemm_64x64_nn"]
    bytes_moved = (64 * 128 + 128 * 256 + 64 * 256) * 4
    expected = max(2 * 64 * 128 * 256 / 100e6, bytes_moved / 1e6)
    assert gemm.floor_known and gemm.floor_us == pytest.approx(expected, abs=1e-3)


def test_directory_aggregates_ranks_and_flags_stragglers(tmp_path):
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    for r in range(3):
        trace = small_trace()
        if r == 2:
            trace["traceEvents"][7]["dur"] = 90  # rank 2's gemm runs 50 us longer
        write(ranks / f"rank{r}.json.gz", trace)
    report = rank(ranks)
    gemm = by_name(report)["ampere_sgemm_64x64_nn"]
    assert (gemm.count, gemm.total_us) == (3, 40 + 40 + 90)
    assert [r.straggler for r in report.ranks] == [False, False, True]
    assert "rank2.json.gz" in report.notes[0]


NSYS_NEW = """Generating SQLite file report.sqlite from report.nsys-rep
Processing [report.sqlite] with [cuda_gpu_kern_sum.py]...
"Time (%)","Total Time (ns)","Instances","Avg (ns)","Med (ns)","Min (ns)","Max (ns)","StdDev (ns)","Name"
"61.5","4000000","200","20000.0","20000.0","19000","21000","100.0","ampere_sgemm_128x64_tn"
"38.5","2500000","1000","2500.0","2500.0","2000","3000","50.0","void at::native::vectorized_elementwise_kernel<4>"
"""
NSYS_OLD = """Time(%),Total Time (ns),Calls,Average,Minimum,Maximum,Name
61.5,4000000,200,20000.0,19000,21000,ampere_sgemm_128x64_tn
38.5,2500000,1000,2500.0,2000,3000,void at::native::vectorized_elementwise_kernel<4>
"""


@pytest.mark.parametrize("text", [NSYS_NEW, NSYS_OLD])
def test_nsys_csv_columns_are_found_from_the_header(tmp_path, text):
    (tmp_path / "kern.csv").write_text(text)
    report = rank(tmp_path / "kern.csv")
    k = by_name(report)
    assert (k["ampere_sgemm_128x64_tn"].total_us, k["ampere_sgemm_128x64_tn"].count) == (4000.0, 200)
    assert k["void at::native::vectorized_elementwise_kernel<4>"].count == 1000
    assert report.gpu_busy_us == 6500.0


def test_nsys_sqlite_links_kernels_to_nvtx_ranges(tmp_path):
    path = tmp_path / "report.sqlite"
    db = sqlite3.connect(path)
    db.executescript("""
        create table StringIds (id integer primary key, value text);
        create table CUPTI_ACTIVITY_KIND_KERNEL (start int, end int, deviceId int, streamId int,
            correlationId int, shortName int, demangledName int);
        create table CUPTI_ACTIVITY_KIND_RUNTIME (start int, end int, globalTid int, correlationId int, nameId int);
        create table NVTX_EVENTS (start int, end int, globalTid int, text text, textId int, eventType int);
        create table TARGET_INFO_GPU (name text);
        insert into StringIds values (1, 'gemm_kernel'), (2, 'softmax_kernel'), (3, 'cudaLaunchKernel');
        insert into CUPTI_ACTIVITY_KIND_KERNEL values (100000, 140000, 0, 7, 11, 1, 1),
                                                      (150000, 160000, 0, 7, 12, 2, 2);
        insert into CUPTI_ACTIVITY_KIND_RUNTIME values (1000, 2000, 42, 11, 3), (5000, 6000, 42, 12, 3);
        insert into NVTX_EVENTS values (500, 3000, 42, 'aten::mm', null, 59),
                                       (4000, 9000, 42, 'aten::softmax', null, 59),
                                       (0, 10000, 42, 'forward', null, 59);
        insert into TARGET_INFO_GPU values ('NVIDIA H100 80GB HBM3');
    """)
    db.commit()
    db.close()
    report = rank(path)
    k = by_name(report)
    assert (k["gemm_kernel"].op, k["gemm_kernel"].total_us) == ("aten::mm", 40.0)
    assert k["softmax_kernel"].op == "aten::softmax"
    assert report.device == "NVIDIA H100 80GB HBM3" and report.launches == 2


def test_bad_inputs_are_one_line_errors(tmp_path):
    cpu_only = write(tmp_path / "cpu.json.gz", {"traceEvents": [op("aten::mm", 0, 10, 1)]})
    with pytest.raises(KernelbotError, match="cpu.json.gz: no GPU kernel events"):
        rank(cpu_only)
    (tmp_path / "empty").mkdir()
    with pytest.raises(KernelbotError, match="empty: no trace files"):
        rank(tmp_path / "empty")
    with pytest.raises(KernelbotError, match="no such file"):
        rank(tmp_path / "missing.json")
    (tmp_path / "bad.csv").write_text("just,some\nnumbers,here\n")
    with pytest.raises(KernelbotError, match="bad.csv"):
        rank(tmp_path / "bad.csv")
    (tmp_path / "bad.sqlite").write_text("not a database")
    with pytest.raises(KernelbotError, match="bad.sqlite"):
        rank(tmp_path / "bad.sqlite")
    missing = small_trace()
    del missing["traceEvents"][7]["ts"]
    with pytest.raises(KernelbotError, match="malformed event"):
        rank(write(tmp_path / "missing_field.json.gz", missing))


def test_cli_json_lists_every_kernel_and_csv_and_plot(tmp_path):
    trace = write(tmp_path / "t.json.gz", small_trace())
    cli = [sys.executable, "-m", "kernelbot.cli", "rank", str(trace)]
    out = subprocess.run([*cli, "--format", "json", "--top", "1"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert len(data["kernels"]) == 3
    for k in data["kernels"]:
        assert {"name", "total_us", "count", "share", "op", "shapes", "floor_us", "score"} <= set(k)
    csv_out = subprocess.run([*cli, "--format", "csv"], capture_output=True, text=True, check=True).stdout
    assert csv_out.splitlines()[0].startswith("name,total_us,count") and len(csv_out.splitlines()) == 4
    png = tmp_path / "breakdown.png"
    table = subprocess.run([*cli, "--plot", str(png)], capture_output=True, text=True, check=True).stdout
    assert "ampere_sgemm_64x64_nn" in table and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = subprocess.run([sys.executable, "-m", "kernelbot.cli", "rank", str(tmp_path / "nope")],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def _independent_totals(path):
    events = json.load(gzip.open(path))["traceEvents"]
    totals = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            totals[e["name"]] = totals.get(e["name"], 0) + e["dur"]
    return totals


@pytest.mark.parametrize("name", ["a100x8_train_control.json.gz", "a100_recsys_rank0.json.gz",
                                  "encdec_train_sampled_rank0.json.gz", "mi250_minitoy_train.json.gz",
                                  "a100_inductor_triton.json.gz", "a100_alexnet.json.gz"])
def test_real_traces_match_an_independent_count(shared_data, name):
    path = shared_data / "traces" / name
    report = rank(path)
    expected = _independent_totals(path)
    got = {k.name: k.total_us for k in report.kernels}
    assert got.keys() == expected.keys()
    for kname, total in expected.items():
        assert got[kname] == pytest.approx(total, abs=1e-3)
    linked = sum(k.total_us for k in report.kernels if k.op) / sum(got.values())
    assert linked > 0.8, f"only {linked:.0%} of kernel time linked to an op"


def test_real_trace_linking_falls_back_where_external_ids_do_not_match(shared_data):
    report = rank(shared_data / "traces" / "a100x8_train_control.json.gz")
    assert report.linking.startswith("time containment")
    assert report.device == "NVIDIA A100-PG509-200" and report.peaks.startswith("A100 40GB")
    mi250 = rank(shared_data / "traces" / "mi250_minitoy_train.json.gz")
    assert mi250.peaks.startswith("MI250")


def _both_scans(path, monkeypatch):
    """rank() with the compiled scanner and with the pure-Python one (KERNELBOT_PURE_PYTHON)."""
    from kernelbot.profiler import cscan

    if cscan.library() is None:
        pytest.skip("no C compiler: only the pure-Python scan exists here")
    compiled = rank(path).model_dump()
    monkeypatch.setenv("KERNELBOT_PURE_PYTHON", "1")
    return compiled, rank(path).model_dump()


@pytest.mark.parametrize("name", ["a100x8_train_control.json.gz", "encdec_train_sampled_rank0.json.gz",
                                  "a100_alexnet.json.gz", "mi250_minitoy_train.json.gz"])
def test_compiled_and_pure_python_scans_agree_on_real_traces(shared_data, monkeypatch, name):
    compiled, pure = _both_scans(shared_data / "traces" / name, monkeypatch)
    assert compiled == pure


def _odd_traces():
    """Traces the compiled scanner hands to the pure-Python scan, and ones it reads itself."""
    base = small_trace()
    string_tid = json.loads(json.dumps(base))
    string_tid["traceEvents"][0]["tid"] = "main"
    escaped = json.dumps(base).replace('"aten::add"', '"aten::\\u0061dd"').replace('"dur"', '"d\\u0075r"', 1)
    repeated = json.dumps(base).replace('"ph": "X",', '"ph": "X", "ph": "i",', 1)
    null_ids = json.loads(json.dumps(base))
    null_ids["traceEvents"][2]["args"]["External id"] = None
    null_ids["traceEvents"][7]["args"]["device"] = None
    top_array = json.dumps(base["traceEvents"])
    pack = json.loads(json.dumps(base))
    pack["traceEvents"].insert(0, {"ph": "X", "cat": "user_annotation", "name": "kernelbot::mm1 float [[64, 128]]",
                                   "pid": 1, "tid": 1, "ts": 4, "dur": 102})
    unicode_name = json.dumps(base, ensure_ascii=False).replace("ampere_sgemm", "ampère_sgemm")
    return [json.dumps(string_tid), escaped, repeated, json.dumps(null_ids), top_array, json.dumps(pack),
            unicode_name, '{"traceEvents": [1, "x", [], {}], "deviceProperties": []}', '{"traceEvents": [}']


@pytest.mark.parametrize("case", range(9))
def test_compiled_scan_falls_back_or_agrees_on_odd_traces(tmp_path, monkeypatch, case):
    path = tmp_path / "odd.json"
    path.write_text(_odd_traces()[case])
    try:
        compiled, pure = _both_scans(path, monkeypatch)
    except KernelbotError as exc:  # then the pure-Python scan must report the same
        monkeypatch.setenv("KERNELBOT_PURE_PYTHON", "1")
        with pytest.raises(KernelbotError, match="no GPU kernel events|not valid JSON"):
            rank(path)
        assert "no GPU kernel events" in str(exc) or "not valid JSON" in str(exc)
        return
    assert compiled == pure


def _stack_sweep(starts, ends, tids, at, at_tids):
    """innermost_active's definition, one event at a time."""
    import numpy as np

    result = [-1] * len(at)
    keys = list(starts) + list(at)
    order = sorted(range(len(keys)), key=lambda i: (keys[i], i >= len(starts),
                                                    -(ends[i] - starts[i]) if i < len(starts) else 0, i))
    all_tids, stacks = list(tids) + list(at_tids), {}
    for i in order:
        stack = stacks.setdefault(all_tids[i], [])
        while stack and ends[stack[-1]] < keys[i]:
            stack.pop()
        if i < len(starts):
            stack.append(i)
        elif stack:
            result[i - len(starts)] = stack[-1]
    return np.array(result)


def test_innermost_active_matches_a_stack_sweep_even_on_overlaps():
    import numpy as np

    from kernelbot.profiler.kernels import innermost_active

    rng = np.random.default_rng(0)
    for _ in range(200):
        n, m = rng.integers(0, 40), rng.integers(0, 30)
        starts = rng.integers(0, 50, n).astype(float)
        ends = starts + rng.integers(0, 20, n)
        tids, at, at_tids = rng.integers(0, 3, n), rng.integers(0, 70, m).astype(float), rng.integers(0, 4, m)
        got = innermost_active(starts, ends, tids, at, at_tids)
        assert (got == _stack_sweep(starts, ends, tids, at, at_tids)).all()


def test_rank_imports_neither_pandas_nor_torch():
    code = "import sys; from kernelbot.profiler.rank import rank; print(sorted({'pandas', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_peaks_measured_low_on_a_busy_host_are_raised_to_what_the_profiled_work_attained():
    from kernelbot.hardware.peaks import with_attained
    from kernelbot.records import Device, Hotspot

    busy = Device(kind="cpu", name="x", threads=2, peak_gflops=400.0, peak_gbps=12.2, peaks_source="measured")
    mlp = Hotspot(id="h0", module_class="Qwen2MLP", module_paths=["m"], family="gated_mlp", input_dims=[[8, 1, 896]],
                  dtype="bfloat16", calls=3072, total_us=5.28e6, share=0.2, flops=2.1e8, bytes=2.6e7)
    glue = mlp.model_copy(update={"family": None, "bytes": 1e12})  # no family: its bytes are not understood
    raised = with_attained(busy, [mlp, glue])
    assert raised.peak_gbps == 15.2 > 2.6e7 * 3072 / 5.28e9 > busy.peak_gbps  # 15.13 GB/s attained, rounded up
    assert raised.peak_gflops == busy.peak_gflops and "peaks raised" in raised.notes[-1]
    assert busy.floor_us(mlp.flops, mlp.bytes) * mlp.calls > mlp.total_us  # the busy floor hid the headroom
    assert raised.floor_us(mlp.flops, mlp.bytes) * mlp.calls <= mlp.total_us
    assert with_attained(raised, [mlp]) is raised  # nothing attained more: the record as it is
