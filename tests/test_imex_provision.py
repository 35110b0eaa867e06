"""What docs/imex.md promises about nvidia-imex: none by default, and the documented way in.

The default (no archive) is checked through the log line a user reads; the
chart path runs the documented recipe without a container engine: the
archive lands where the recipe's ``COPY`` puts it in the image, the chart
renders with the documented values, the init container's own ``cp`` command
runs with the image's and the volume's paths mapped into a temp directory,
and the agent's rendered flags (parsed by the daemon's own parser) build the
simulator that installs the binaries.
"""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path

import pytest
import trio
import yaml

from mokka.noderoot.host import Host
from mokka.simulators.imex import PLUGIN, ImexSimulator
from mokka.simulators.imex.simulator import IMEX_CTL_BIN, IMEX_REAL_BIN
from tests.helm_tool import Helm, agent, helm_binary, parse_daemon_args, pod_spec
from tests.support import ROOT, snapshot
from tests.test_imex import FAKE_IMEX, FAKE_IMEX_CTL, build_archive, make_state

pytestmark = pytest.mark.timeout(120)

GUIDE = ROOT / "docs" / "imex.md"


async def test_the_default_says_no_binary_ships_and_how_to_give_one(
    host: Host, node_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mokka.simulators.imex")
    before = snapshot(node_root)
    sim = ImexSimulator()
    await sim.stage(host, make_state())
    await sim.stage(host, make_state())
    (line,) = [r.getMessage() for r in caplog.records if "nvidia-imex" in r.getMessage()]
    assert "Mokka ships none" in line
    for way in ("--imex-archive-dir", "nodeAgent.imex.binaries.image", "--imex-archive-sha256"):
        assert way in line
    assert "docs/imex.md" in line
    # docs/imex.md quotes the line as the default run logs it.
    assert f"    {line}\n" in GUIDE.read_text()
    await sim.discard(host)
    assert snapshot(node_root) == before


def test_no_claim_that_an_archive_or_pin_ships() -> None:
    readme = (ROOT / "README.md").read_text()
    (row,) = [line for line in readme.splitlines() if line.startswith("| `imex` |")]
    assert "sha256-pinned archive" not in row
    assert "you provide" in row
    assert "none ships" in row
    assert "Mokka ships no NVIDIA binary" not in GUIDE.read_text()


def guide_block(language: str, containing: str) -> str:
    (block,) = [
        b
        for b in re.findall(rf"```{language}\n(.*?)```", GUIDE.read_text(), re.S)
        if containing in b
    ]
    return block


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm-home"))


async def test_the_documented_archive_image_installs_nvidia_imex_through_the_chart(
    helm: Helm, host: Host, node_root: Path, tmp_path: Path
) -> None:
    # The recipe's Containerfile: one COPY of the archive into the image.
    build = guide_block("sh", "podman build").replace("\\\n", " ")
    containerfile = shlex.split(build.splitlines()[0])[1].encode().decode("unicode_escape")
    (copy,) = [line.split()[1:] for line in containerfile.splitlines() if line.startswith("COPY")]
    archive_name, image_dir = copy
    image_root = tmp_path / "image"
    (image_root / image_dir.strip("/")).mkdir(parents=True)
    sha = build_archive(image_root / image_dir.strip("/") / archive_name)
    # The image built is the one the values name.
    tag = re.search(r"podman build -t (\S+)", build).group(1)
    values = yaml.safe_load(guide_block("yaml", "binaries:").replace("<the 64 hex digits", sha))
    values["nodeAgent"]["imex"]["archive"]["sha256"] = sha
    image = values["nodeAgent"]["imex"]["binaries"]["image"]
    assert f"{image['repository']}:{image['tag']}" == tag

    docs = helm.template(values)
    (init,) = pod_spec(docs)["initContainers"]
    assert init["image"] == tag
    (mount,) = init["volumeMounts"]
    volume_dir = tmp_path / "volume"
    volume_dir.mkdir()
    # The init container's own command, with the image's and the volume's paths mapped.
    command = [
        arg.replace(mount["mountPath"], str(volume_dir))
        if arg.startswith(mount["mountPath"])
        else str(image_root) + arg
        if arg.startswith("/")
        else arg
        for arg in init["command"]
    ]
    with trio.fail_after(30):
        await trio.run_process(command)

    from mokka.cli import build_parser

    args = [a.replace(mount["mountPath"], str(volume_dir)) for a in agent(docs)["args"]]
    namespace = parse_daemon_args(build_parser().parse_args, args)
    sim = PLUGIN.build(namespace)
    before = snapshot(node_root)
    await sim.stage(host, make_state())
    assert (node_root / IMEX_REAL_BIN.lstrip("/")).read_bytes() == FAKE_IMEX
    assert (node_root / IMEX_CTL_BIN.lstrip("/")).read_bytes() == FAKE_IMEX_CTL
    assert sim.readiness.ready
    assert "no nvidia-imex" not in sim.readiness.reason
    await sim.discard(host)
    assert snapshot(node_root) == before
