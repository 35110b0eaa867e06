"""MIG devices beyond NVML's MIG calls: the full-GPU getters on a MIG device
handle, the capability files and nodes, Mokka's CDI spec, and a reset that
destroys the instances.

One daemon (h100, the real nvidia-smi 535 staged) serves every check in
order, as a person would configure the node; the root must be empty after
it stops.  nvidia-smi and nvidia-ml-py run as in ``test_nvml_setters``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from mokka import layout
from mokka.simulators.gpudriver import mig_caps
from mokka.state import mig_profiles
from tests.support import real_nvidia_smi
from tests.test_nvml_mig import _with_daemon
from tests.test_nvml_setters import SMI_TIMEOUT, Node, field, ok, open_dir

__all__ = ["open_dir"]  # the fixture, shared with the setters' test

#: How long a change may take to reach the node's files (a reconcile pass or two).
PASS_WAIT = 20


@pytest.mark.timeout(220)
async def test_mig_devices_on_the_node(tmp_path: Path, open_dir: Path) -> None:
    await _with_daemon(open_dir, tmp_path, "h100",
                       [_make_layout, _check_getters, _check_query, _check_capabilities,
                        _check_cdi_spec, _check_reset_destroys_instances])


def _wait_for(what: str, predicate) -> None:
    deadline = time.monotonic() + PASS_WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.1)


def _make_layout(node: Node, _cwd: Path) -> None:
    """GPU 0: a 3g GPU instance and a 1g one, each with one compute instance."""
    ok(node.smi("-mig", "1", "-i", "0"))
    out = ok(node.smi("mig", "-cgi", "9,19", "-C", "-i", "0"))
    assert out.count("Successfully created compute instance") == 2, out


GETTERS_SCRIPT = """
import json, pynvml
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
def code(call):
    try:
        call()
        return 0
    except pynvml.NVMLError as exc:
        return exc.value
out = []
for index in range(2):
    mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, index)
    memory = pynvml.nvmlDeviceGetMemoryInfo(mig)
    bar1 = pynvml.nvmlDeviceGetBAR1MemoryInfo(mig)
    out.append({
        "gi": pynvml.nvmlDeviceGetGpuInstanceId(mig),
        "memory": [memory.total, memory.used, memory.free],
        "bar1": bar1.bar1Total,
        "processes": len(pynvml.nvmlDeviceGetComputeRunningProcesses(mig)),
        "utilization": code(lambda: pynvml.nvmlDeviceGetUtilizationRates(mig)),
        "ecc": pynvml.nvmlDeviceGetTotalEccErrors(mig, 1, 0),
        "index": pynvml.nvmlDeviceGetIndex(mig),
        # looked up again by its UUID, as nvidia-ctk and nvidia-smi -q do
        "by_uuid_gi": pynvml.nvmlDeviceGetGpuInstanceId(
            pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(mig))),
    })
print(json.dumps({"migs": out, "gpu_bar1": pynvml.nvmlDeviceGetBAR1MemoryInfo(gpu).bar1Total,
                  "gpu_utilization": code(lambda: pynvml.nvmlDeviceGetUtilizationRates(gpu))}))
"""


def _check_getters(node: Node, _cwd: Path) -> None:
    """nvidia-ml-py on MIG device handles: the instance's memory and BAR1 share,
    no processes, and utilization NOT_SUPPORTED, as a real MIG device answers."""
    table = mig_profiles.board(field(ok(node.smi("-q", "-i", "0")), "Product Name"))
    assert table is not None
    by_id = {p.smi_id: p for p in table.profiles}
    probe = node.python(GETTERS_SCRIPT)
    out, err = probe.communicate(timeout=SMI_TIMEOUT)
    assert probe.returncode == 0, err
    answers = json.loads(out)
    assert answers["gpu_utilization"] == 0
    # NVML's MIG device order: GPU instance 1 (3g at 0), then 11 (1g at 4)
    for mig, (gi, smi_id) in zip(answers["migs"], [(1, 9), (11, 19)], strict=True):
        profile = by_id[smi_id]
        total = profile.memory_mib << 20
        assert mig["gi"] == gi
        assert mig["memory"] == [total, 0, total]
        assert mig["bar1"] == answers["gpu_bar1"] // 8 * profile.size
        assert mig["processes"] == 0
        assert mig["utilization"] == 3  # NVML_ERROR_NOT_SUPPORTED
        assert mig["ecc"] == 0
        assert mig["by_uuid_gi"] == gi
    assert [mig["index"] for mig in answers["migs"]] == [0, 1]


def _check_query(node: Node, _cwd: Path) -> None:
    """``nvidia-smi -q`` has a MIG device section per instance, with its GPU and
    compute instance ids, as on a real MIG node."""
    out = ok(node.smi("-q", "-i", "0"))
    assert out.count("MIG Device") >= 2, out
    assert re.findall(r"^\s+GPU Instance ID\s+: (\d+)$", out, re.M)[-2:] == ["1", "11"], out


def _uuid(node: Node) -> str:
    return field(ok(node.smi("-q", "-i", "0")), "GPU UUID")


def _check_capabilities(node: Node, _cwd: Path) -> None:
    """Each instance's procfs descriptor and ``nvidia-cap`` node, numbered as the driver does."""
    proc = node.driver / "proc/driver/nvidia/capabilities/gpu0/mig"
    caps = node.driver / "dev/nvidia-caps"
    expected = {"gi1/access": 3 + 9, "gi1/ci0/access": 3 + 9 + 1,
                "gi11/access": 3 + 99, "gi11/ci0/access": 3 + 99 + 1}
    _wait_for("the capability files", lambda: (proc / "gi11/ci0/access").exists())
    for name, minor in expected.items():
        assert (proc / name).read_text() == (
            f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        node_stat = (caps / f"nvidia-cap{minor}").stat()
        assert stat.S_ISCHR(node_stat.st_mode), f"nvidia-cap{minor} is no character device"
        assert os.major(node_stat.st_rdev) == layout.NVIDIA_CAPS_MAJOR
        assert os.minor(node_stat.st_rdev) == minor
        assert stat.S_IMODE(node_stat.st_mode) == 0o444
    assert sorted(p.relative_to(proc).as_posix() for p in proc.rglob("access")) == sorted(expected)
    # the table the toolkit and the device plugin look minors up in
    minors = (node.driver / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    assert minors[:3] == ["config 1", "monitor 2", "gpu0/gi0/access 3"]
    assert "gpu3/gi3/ci3/access 439" in minors  # as on a real host
    assert len(minors) == 2 + 8 * mig_caps.GI_IDS * mig_caps.MINORS_PER_GI


def _cdi_devices(node: Node) -> dict[str, list[str]]:
    spec = yaml.safe_load((node.root / layout.CDI_DIR.lstrip("/") / "nvidia.yaml").read_text())
    return {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]]
            for d in spec["devices"]}


def _check_cdi_spec(node: Node, _cwd: Path) -> None:
    """MIG devices in the CDI spec as ``nvidia-ctk cdi generate`` names them, with
    the UUIDs ``nvidia-smi -L`` shows."""
    _wait_for("the MIG devices in the CDI spec", lambda: "0:1" in _cdi_devices(node))
    devices = _cdi_devices(node)
    listing = ok(node.smi("-L"))
    uuids = re.findall(r"^  MIG \S+\s+Device\s+\d: \(UUID: (MIG-[0-9a-f-]{36})\)$", listing, re.M)
    assert len(uuids) == 2, listing
    for index, (uuid, (gi_minor, ci_minor)) in enumerate(zip(uuids, [(12, 13), (102, 103)],
                                                            strict=True)):
        nodes = ["/dev/nvidia0", f"/dev/nvidia-caps/nvidia-cap{gi_minor}",
                 f"/dev/nvidia-caps/nvidia-cap{ci_minor}"]
        assert devices[f"0:{index}"] == nodes
        assert devices[uuid] == nodes
        assert set(nodes) <= set(devices["all"])
    assert mig_caps.mig_uuid(_uuid(node), 1, 0) == uuids[0]


def _check_reset_destroys_instances(node: Node, _cwd: Path) -> None:
    """``nvidia-smi -r`` destroys the GPU and compute instances, as a reset does;
    their files go with them."""
    assert "was successfully reset" in ok(node.smi("-r", "-i", "0"))
    assert "MIG" not in ok(node.smi("-L")).split("GPU 1:")[0]
    assert "No GPU instances found" in node.smi("mig", "-lgi", "-i", "0").stdout
    proc = node.driver / "proc/driver/nvidia/capabilities/gpu0"
    _wait_for("the capability files to go", lambda: not proc.exists())
    _wait_for("the CDI entries to go", lambda: "0:0" not in _cdi_devices(node))
    assert not (node.driver / "dev/nvidia-caps/nvidia-cap12").exists()


def _declaring_profile(tmp_path: Path, declared: object, *, gpus: int = 4) -> Path:
    """The built-in h100 profile with its first ``gpus`` GPUs declaring
    ``mig.layout: declared``."""
    doc = yaml.safe_load((Path(mig_profiles.__file__).parent / "profiles/h100.yaml").read_text())
    for device in doc["devices"][:gpus]:
        device["mig"] = {"mode_current": "enabled", "mode_pending": "enabled",
                         "layout": declared}
    path = tmp_path / "h100-mig.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(220)
async def test_a_profile_declares_the_layout(tmp_path: Path, open_dir: Path) -> None:
    """GPUs 0-3 boot with seven 1g MIG devices each, as the profile says; the
    runtime may change it (``-r`` destroys it) and teardown brings it back."""
    profile = _declaring_profile(tmp_path, ["7x1g.10gb"])
    await _with_daemon(open_dir, tmp_path, str(profile), [_check_declared_layout])


def _check_declared_layout(node: Node, _cwd: Path) -> None:
    listing = ok(node.smi("-L"))
    per_gpu = re.split(r"^GPU \d+: ", listing, flags=re.M)[1:]
    assert [part.count("MIG 1g.10gb") for part in per_gpu] == [7, 7, 7, 7, 0, 0, 0, 0], listing
    assert len(set(re.findall(r"MIG-[0-9a-f-]{36}", listing))) == 28
    _wait_for("the declared MIG devices in the CDI spec", lambda: "3:6" in _cdi_devices(node))
    assert "4:0" not in _cdi_devices(node)
    # node state wins once the layout changes: nvidia-smi mig changes GPU 1's,
    # a reset of GPU 0 destroys it
    ok(node.smi("mig", "-dci", "-gi", "7", "-ci", "0", "-i", "1"))
    ok(node.smi("mig", "-dgi", "-gi", "7", "-i", "1"))
    ok(node.smi("-r", "-i", "0"))
    per_gpu = re.split(r"^GPU \d+: ", ok(node.smi("-L")), flags=re.M)[1:]
    assert [part.count("MIG 1g.10gb") for part in per_gpu] == [0, 6, 7, 7, 0, 0, 0, 0]


@pytest.mark.parametrize(("declared", "expected"), [
    (["8x1g.10gb"], "8 GPU instances, the board holds 1 to 7"),
    (["3x3g.40gb"], "does not fit the board: it holds seven compute slices and eight memory "
                    "slices, at most 7x1g.10gb, 1x1g.10gb+me, 4x1g.20gb"),
    (["4g.40gb", "4g.40gb"], "4g.40gb, 4g.40gb does not fit the board"),
    (["1g.5gb"], "'1g.5gb' is not a GPU instance profile of this board, expected one of "
                 "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"),
    ("1g.10gb", "expected a list of GPU instance profiles such as [7x1g.10gb]"),
])
def test_a_layout_the_board_cannot_hold_is_refused_at_compile_time(
    tmp_path: Path, declared: object, expected: str
) -> None:
    from mokka.errors import SpecError
    from mokka.simulators.gpudriver.engine_config import render_engine_config
    from mokka.state.compile import compile_profile

    profile = _declaring_profile(tmp_path, declared)
    with pytest.raises(SpecError) as refused:
        render_engine_config(compile_profile(profile, node_name="worker-1"))
    message = str(refused.value)
    assert message.startswith(f"{profile}: devices[index=0].mig.layout: NVIDIA H100 80GB HBM3: ")
    assert expected in message


def test_a_declared_layout_takes_the_first_free_placements() -> None:
    from mokka.state import mig_layout

    board = mig_profiles.board("NVIDIA H100 80GB HBM3")
    assert board is not None
    # a 2g instance starts at 0, 2 or 4 only: the 3g one must take 4
    layout = mig_layout.declared(board, ["3g.40gb", "2x2g.20gb"])
    assert [(gi["id"], gi["profile"], gi["start"], gi["compute"]) for gi in layout] == [
        (2, 9, 4, [{"id": 0, "slices": 3, "start": 0}]),
        (3, 14, 0, [{"id": 0, "slices": 2, "start": 0}]),
        (4, 14, 2, [{"id": 0, "slices": 2, "start": 0}]),
    ]


#: The one instance below whose ids the numbering can name, and its capabilities.
KEPT = ["gpu0/mig/gi8/access", "gpu0/mig/gi8/ci0/access"]


@pytest.mark.parametrize(("instances", "expected"), [
    ("text", []), ({"a": 1}, []), ([1, "x", None], []),
    ([{"id": 99, "profile": 19, "start": 0}], []),
    ([{"id": 7, "profile": "a", "compute": 5}, {"id": -1, "profile": -5}], []),
    ([{"id": 8, "profile": 19, "start": 1,
       "compute": [1, {"id": 99}, {"id": True}, {"id": 0, "slices": 1, "start": 0}]}], KEPT),
])
def test_a_hand_written_layout_never_breaks_the_node(
    tmp_path: Path, instances: object, expected: list[str]
) -> None:
    """``mokka ctl set mig.instances=...`` takes anything: the capabilities, the
    CDI spec and the engine config keep only the instances the numbering can
    name, and never raise."""
    from mokka.simulators.cri import cdi
    from mokka.simulators.gpudriver.engine_config import render_engine_config
    from mokka.state.compile import compile_profile

    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(yaml.safe_dump({"version": 1, "devices": {"0": {"mig": {
        "mode_current": "enabled", "instances": instances}}}}))
    state = compile_profile("h100", node_name="worker-1", overrides=overrides)
    render_engine_config(state)
    assert sorted(cap.proc_path for cap in mig_caps.capabilities(state)) == expected
    specs = cdi.build_specs(state, cdi.NodeExtras())
    names = {d["name"] for d in specs[cdi.SPEC_PATH]["devices"]}
    assert ("0:0" in names) == bool(expected)
    assert "0:1" not in names


MIG_VIEW_SCRIPT = """
import json, sys, pynvml
pynvml.nvmlInit()
def text(value):
    return value.decode() if isinstance(value, bytes) else value
view = []
for i in range(pynvml.nvmlDeviceGetCount()):
    gpu = pynvml.nvmlDeviceGetHandleByIndex(i)
    most = pynvml.nvmlDeviceGetMaxMigDeviceCount(gpu)
    migs = []
    for m in range(most + 1):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(gpu, m)
        except pynvml.NVMLError_NotFound:
            break
        migs.append([text(pynvml.nvmlDeviceGetUUID(mig)), pynvml.nvmlDeviceGetIndex(mig)])
    view.append({"uuid": text(pynvml.nvmlDeviceGetUUID(gpu)), "max": most, "migs": migs})
def found(uuid):
    try:
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
        return True
    except pynvml.NVMLError_NotFound:
        return False
print(json.dumps({"gpus": view, "found": [found(u) for u in json.loads(sys.argv[1])]}))
"""


def test_a_process_sees_only_the_mig_devices_whose_capability_nodes_it_has(
    native: Path, tmp_path: Path
) -> None:
    """The GPU rule, by capability nodes: a ``/dev`` holding the two
    ``nvidia-cap`` nodes of some but not all of a GPU's MIG devices enumerates
    only those, numbered from 0; all or none of them (the host) is no filter.
    The maximum stays the board's, and a hidden device's UUID is not found."""
    from mokka.state.compile import compile_profile
    from tests.nvml_support import nvml_env, run_script, write_config

    state = compile_profile(_declaring_profile(tmp_path, ["3g.40gb", "2x2g.20gb"], gpus=2),
                            node_name="worker-1")
    config = write_config(tmp_path / "root", state)
    devices = {gpu.index: mig_caps.mig_devices(gpu) for gpu in state.gpus[:2]}
    # NVML's order, by placement: the 3g instance (id 2), then the 2g ones (3, 4)
    assert [(d.gi, d.ci) for d in devices[0]] == [(2, 0), (3, 0), (4, 0)]
    every_uuid = [d.uuid for gpu in (0, 1) for d in devices[gpu]]
    most = state.gpu(0).fields["mig"]["max_gpu_instances"]

    def view(*nodes: str) -> dict:
        dev = tmp_path / f"dev-{len(list(tmp_path.glob('dev-*')))}"
        (dev / "nvidia-caps").mkdir(parents=True)
        for name in nodes:
            (dev / name).touch()
        return run_script(native, config, MIG_VIEW_SCRIPT, json.dumps(every_uuid),
                          MOCK_NVML_DEV_DIR=str(dev))

    def caps(device: mig_caps.MigDevice) -> list[str]:
        return [f"nvidia-caps/nvidia-cap{device.gi_cap.minor}",
                f"nvidia-caps/nvidia-cap{device.ci_cap.minor}"]

    # A container given GPU 0's second MIG device: its GPU, and that device alone.
    chosen = devices[0][1]
    got = view("nvidia0", *caps(chosen))
    assert got["gpus"] == [{"uuid": state.gpu(0).uuid, "max": most, "migs": [[chosen.uuid, 0]]}]
    assert got["found"] == [uuid == chosen.uuid for uuid in every_uuid]
    # Both nodes are needed: a GPU instance's node without its compute
    # instance's does not make a device visible.
    got = view("nvidia0", *caps(chosen), caps(devices[0][2])[0])
    assert got["gpus"][0]["migs"] == [[chosen.uuid, 0]]
    # Two GPUs: all of GPU 0's devices (no filter) and one of GPU 1's.
    got = view("nvidia0", "nvidia1", *(c for d in devices[0] for c in caps(d)),
               *caps(devices[1][2]))
    assert [[uuid for uuid, _ in gpu["migs"]] for gpu in got["gpus"]] == [
        [d.uuid for d in devices[0]], [devices[1][2].uuid]]
    assert [index for _, index in got["gpus"][0]["migs"]] == [0, 1, 2]
    # No capability node at all, as on the host: every MIG device.
    got = view()
    assert [len(gpu["migs"]) for gpu in got["gpus"]] == [3, 3, 0, 0, 0, 0, 0, 0]
    assert all(got["found"])

    # The real nvidia-smi in the one-device view lists that device alone.
    dev = tmp_path / "dev-smi"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in ["nvidia0", *caps(chosen)]:
        (dev / name).touch()
    listing = subprocess.run(
        [str(real_nvidia_smi()), "-L"], capture_output=True, text=True, timeout=SMI_TIMEOUT,
        env=nvml_env(native, config, MOCK_NVML_DEV_DIR=str(dev)), check=False,
    )
    assert listing.returncode == 0, listing.stdout + listing.stderr
    lines = listing.stdout.strip().splitlines()
    assert len(lines) == 2, listing.stdout
    assert state.gpu(0).uuid in lines[0]
    assert re.fullmatch(rf"\s+MIG 2g\.20gb\s+Device\s+0: \(UUID: {chosen.uuid}\)", lines[1])


def test_an_instance_named_twice_gives_its_capability_minors_once(tmp_path: Path) -> None:
    """A hand-written layout that repeats an instance still renders each
    ``mig.caps`` key once: a repeated key would make the library refuse the
    whole engine config."""
    from mokka.simulators.gpudriver.engine_config import render_engine_config
    from mokka.state.compile import compile_profile

    instance = {"id": 8, "profile": 19, "start": 1,
                "compute": [{"id": 0, "slices": 1, "start": 0}]}
    overrides = tmp_path / "overrides.yaml"
    overrides.write_text(yaml.safe_dump({"version": 1, "devices": {"0": {"mig": {
        "mode_current": "enabled", "instances": [instance, instance]}}}}))
    config = render_engine_config(compile_profile("h100", node_name="worker-1",
                                                  overrides=overrides))
    caps = [line for line in config.splitlines() if line.startswith("device.0.mig.caps.")]
    assert caps == [f"device.0.mig.caps.gi8.access: {mig_caps.gi_minor(0, 8)}",
                    f"device.0.mig.caps.gi8.ci0.access: {mig_caps.ci_minor(0, 8, 0)}"]
