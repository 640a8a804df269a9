"""Image build, push, pull-back and promotion against a real Docker engine and a real registry, both started
here (dockerd on a private socket with vfs storage, Debian's docker-registry on 127.0.0.1); skipped with the
reason when their binaries are absent. `.ci/run` installs them."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from kernelbot import KernelbotError
from kernelbot.cli import main
from kernelbot.engine import image
from kernelbot.kernel_library import FAMILIES
from kernelbot.records import Pack, PackEntry


def _run_dir(root: Path, verification: str = "pass: allclose on 9 input sets", greedy: bool = True) -> Path:
    run = root / "run1"
    (run / "pack" / "kernels").mkdir(parents=True)
    entry = PackEntry(task_id="t0", candidate_id="t0__rmsnorm_cpp", family="rmsnorm", module_class="LlamaRMSNorm",
                      input_shapes=[[8, 32, 512]], init_args=[512, 1e-6, "float32"], dtype="float32", backend="cpp",
                      config={"grain": 8}, source_file="kernels/t0__rmsnorm_cpp.py", source_hash="abc",
                      verification=verification, speedup=1.3)
    (run / "pack" / entry.source_file).write_text(FAMILIES["rmsnorm"].candidate_source("cpp", {"grain": 8}))
    pack = Pack(version="0.1.0+abc", run_id="run1", device="cpu", entries=[entry])
    (run / "pack" / "manifest.json").write_text(pack.model_dump_json(indent=2))
    (run / "model.json").write_text(json.dumps({"name": "llama-tiny"}))
    (run / "report.json").write_text(json.dumps({"fidelity": {"max_abs_logit_diff": 0.0, "greedy_match": greedy,
                                                              "token_agreement": 1.0}}))
    return run


# ---- without Docker: what may be promoted, and the Dockerfile ----

def test_promote_refuses_unverified_kernels_and_failed_fidelity(tmp_path):
    bad = _run_dir(tmp_path / "a", verification="fail: nan_positions")
    with pytest.raises(KernelbotError, match="not verified"):
        image.promote(bad, "base:1", "x:1", index=tmp_path / "idx.jsonl", client=object())
    unfaithful = _run_dir(tmp_path / "b", greedy=False)
    with pytest.raises(KernelbotError, match="fidelity check failed"):
        image.promote(unfaithful, "base:1", "x:1", index=tmp_path / "idx.jsonl", client=object())
    (unfaithful / "report.json").unlink()
    assert "no report.json: fidelity was never checked" in image.read_run(unfaithful).problems
    assert not (tmp_path / "idx.jsonl").exists()
    assert image.read_run(_run_dir(tmp_path / "c")).problems == []


def test_cli_promote_bad_input_is_one_line(tmp_path, capsys):
    assert main(["promote", str(tmp_path), "--base", "b:1", "--tag", "x:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no pack/manifest.json" in err


def test_dockerfile_has_pack_activation_and_labels(tmp_path):
    info = image.read_run(_run_dir(tmp_path))
    text = image.dockerfile("lmsysorg/sglang:v0.5.23", info, "kernelbot-0.1.0-py3-none-any.whl", install=True)
    assert text.startswith("FROM lmsysorg/sglang:v0.5.23\n")
    assert f"COPY pack/ {image.PACK_PATH}/" in text
    assert "COPY install.sh /opt/kernelbot/install.sh\nARG KERNELBOT_PYTHON=\n" in text
    assert "ENV KERNELBOT_ENGINE_MODULE=sglang\nRUN sh /opt/kernelbot/install.sh " in text  # not a vLLM run's pack
    assert "RUN sh /opt/kernelbot/install.sh /opt/kernelbot/kernelbot-0.1.0-py3-none-any.whl\n" in text
    assert "install.sh" not in image.dockerfile("b:1", info, "kernelbot-0.1.0-py3-none-any.whl", install=False)
    assert f"ENV SGLANG_PLUGINS=kernelbot_pack VLLM_PLUGINS=kernelbot_pack KERNELBOT_PACK_DIR={image.PACK_PATH}" in text
    assert f'LABEL org.kernelbot.pack-digest="{info.digest}"' in text
    assert 'org.kernelbot.verification="1/1 kernels verified; greedy_match=True' in text


def test_a_vllm_runs_image_installs_kernelbot_into_the_python_that_imports_vllm(tmp_path):
    run = _run_dir(tmp_path)
    report = json.loads((run / "report.json").read_text())
    (run / "report.json").write_text(json.dumps({**report, "engine": "vllm"}))
    text = image.dockerfile("vllm/vllm-openai:v0.32.0", image.read_run(run), "kernelbot.whl", install=True)
    assert "ENV KERNELBOT_ENGINE_MODULE=vllm\nRUN sh /opt/kernelbot/install.sh " in text


# ---- with a real Docker engine and registry ----

# docker_env (tests/conftest.py): a real dockerd and registry, started by tests/docker_helpers.py


def test_promote_builds_pushes_and_the_pulled_image_holds_pack_and_labels(docker_env, tmp_path, monkeypatch):
    client, registry, tmp = docker_env
    run = _run_dir(tmp_path)
    tag = f"{registry}/kernelbot/llama-tiny:run1"
    index = tmp_path / "promotions.jsonl"
    record = image.promote(run, "kb-base:1", tag, index=index, install=False, client=client)
    assert record["digest"].startswith("sha256:") and record["run_id"] == "run1"
    assert image.list_promotions(index) == [record]

    client.images.remove(tag, force=True)  # pull back from the registry, not the local store
    pulled = client.images.pull(tag.rsplit(":", 1)[0], tag="run1")
    assert f"{tag.rsplit(':', 1)[0]}@{record['digest']}" in pulled.attrs["RepoDigests"]
    info = image.read_run(run)
    assert pulled.labels == {**pulled.labels, **image.labels(info)}
    assert pulled.labels["org.kernelbot.pack-digest"] == info.digest
    env = pulled.attrs["Config"]["Env"]
    assert "SGLANG_PLUGINS=kernelbot_pack" in env and f"KERNELBOT_PACK_DIR={image.PACK_PATH}" in env

    container = client.containers.create(pulled.id, command=["/bin/sh"])
    try:
        stream, _ = container.get_archive(image.PACK_PATH)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}
        wheel_stream, _ = container.get_archive("/opt/kernelbot")
        with tarfile.open(fileobj=io.BytesIO(b"".join(wheel_stream))) as tar:
            assert any(n.endswith(".whl") and "kernelbot-" in n for n in tar.getnames())
    finally:
        container.remove(force=True)
    assert files["pack/manifest.json"] == (run / "pack" / "manifest.json").read_bytes()
    assert files["pack/kernels/t0__rmsnorm_cpp.py"] == (run / "pack" / "kernels" / "t0__rmsnorm_cpp.py").read_bytes()

    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp}/docker.sock")
    assert main(["image", "list", "--index", str(index)]) == 0


@pytest.mark.slow  # the CLI over what test_promote_builds_pushes_and_the_pulled_image_holds_pack_and_labels runs
def test_cli_image_build_and_push(docker_env, tmp_path, capsys, monkeypatch):
    client, registry, tmp = docker_env
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp}/docker.sock")
    run = _run_dir(tmp_path)
    tag = f"{registry}/kernelbot/cli:1"
    assert main(["image", "build", str(run), "--base", "kb-base:1", "--tag", tag, "--no-install"]) == 0
    assert main(["image", "push", tag]) == 0
    out = capsys.readouterr().out
    assert "sha256:" in out
    digest = client.images.get_registry_data(tag).id
    assert digest in out


@pytest.mark.slow
def test_pip_install_in_a_python_base_registers_the_plugin(docker_env, tmp_path):
    """The image's activation end to end: kernelbot's wheel pip-installed inside a base image with Python (this
    machine's interpreter and standard library), so SGLang's load_plugins() would find the entry point."""
    from docker_helpers import python_rootfs

    client, registry, _ = docker_env
    client.api.import_image_from_data(python_rootfs(), repository="kb-python", tag="1")
    run = _run_dir(tmp_path)
    tag = f"{registry}/kernelbot/python:run1"
    image.promote(run, "kb-python:1", tag, index=tmp_path / "promotions.jsonl", install=True, client=client)
    client.images.remove(tag, force=True)
    pulled = client.images.pull(tag.rsplit(":", 1)[0], tag="run1")
    probe = ("import importlib.metadata as m, os; "
             "print([e.value for e in m.entry_points(group='sglang.srt.plugins')]); "
             "print(os.environ['SGLANG_PLUGINS'], sorted(os.listdir(os.environ['KERNELBOT_PACK_DIR'])))")
    out = client.containers.run(pulled.id, ["python3", "-c", probe], network_mode="none", remove=True).decode()
    assert "['kernelbot.engine.sglang_plugin:register']" in out
    assert "kernelbot_pack ['kernels', 'manifest.json']" in out


def test_a_served_run_whose_pack_never_ran_in_the_engine_is_not_promoted(tmp_path):
    run = _run_dir(tmp_path)
    report = json.loads((run / "report.json").read_text())
    (run / "report.json").write_text(json.dumps({**report, "engine": "vllm", "serving": {"engaged": False}}))
    assert any("did not run in every process" in p for p in image.read_run(run).problems)
    (run / "report.json").write_text(json.dumps({**report, "engine": "vllm", "serving": {"engaged": True}}))
    assert image.read_run(run).problems == []
