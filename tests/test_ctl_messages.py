"""``mokka ctl`` never misleads: ranges refused at write time, one error per
mistake, one answer to "is this node staged?", help on every flag, no
abbreviations, and only the imports the verb needs.

Where the words matter the command runs as a real ``python -m mokka ctl``
process, as a person or a script would run it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mokka.ctl import command as ctl
from mokka.ctl import targets as ctl_targets
from mokka.ctl import verbs as ctl_verbs
from mokka.layout import CONFIG_DIR, OVERRIDES
from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from mokka.state.overrides import load_overrides
from mokka.state.profile import BUILTIN_PROFILES
from tests.daemon_support import PROCESS_TIMEOUT, daemon_env

NOT_STAGED = "no such directory, expected the node's driver config directory " \
    "(is the node agent running with this root?)"


def mokka_ctl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A real ``python -m mokka ctl`` process, bounded in time."""
    return subprocess.run([sys.executable, "-m", "mokka", "ctl", *args], cwd=cwd,
                          env=daemon_env(), capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT, check=False)


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A node root as a staged agent leaves it: the driver config directory exists."""
    root = tmp_path / "node"
    (root / CONFIG_DIR.lstrip("/")).mkdir(parents=True)
    return root


def overrides_of(root: Path) -> dict | None:
    found = load_overrides(root / OVERRIDES.lstrip("/"))
    return None if found is None else found.to_mapping()


# ---- temperature range ------------------------------------------------------


@pytest.mark.parametrize("celsius", ["-500", "-1", "201", "100000"])
def test_a_temperature_no_board_reports_is_refused(node: Path, celsius: str) -> None:
    done = mokka_ctl("temp", "--root", str(node), "--gpu", "0", "--celsius", celsius,
                     cwd=node.parent)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        f"mokka ctl: error: {node}{OVERRIDES}: devices.0.thermal.temperature_gpu_c: "
        f"{celsius} is out of range, expected 0..200\n")
    assert overrides_of(node) is None


def test_the_temperature_range_is_inclusive_and_covers_every_threshold(node: Path) -> None:
    for celsius in (0, 200):
        assert ctl.main(["temp", "--root", str(node), "--gpu", "0",
                         "--celsius", str(celsius)]) == 0
        assert overrides_of(node)["devices"]["0"]["thermal"]["temperature_gpu_c"] == celsius
    # thresholds take the same range; tlimit is headroom, and may be negative
    assert ctl.main(["set", "--root", str(node), "thermal.shutdown_threshold_c=96",
                     "thermal.tlimit_c=-5"]) == 0
    assert ctl.main(["set", "--root", str(node), "thermal.slowdown_threshold_c=-1"]) == 2
    assert ctl.main(["set", "--root", str(node), "thermal.tlimit_c=-201"]) == 2
    assert overrides_of(node)["all"] == {
        "thermal": {"shutdown_threshold_c": 96, "tlimit_c": -5}}
    # the built-in profiles' own thresholds all lie inside the range
    for name in BUILTIN_PROFILES:
        for gpu in compile_profile(name, node_name="n").gpus:
            for key in ("shutdown_threshold_c", "slowdown_threshold_c", "max_operating_c"):
                value = gpu.fields.get("thermal", {}).get(key)
                assert isinstance(value, int), (name, key, value)
                assert 0 <= value <= 200, (name, key, value)


# ---- performance state ------------------------------------------------------


def test_a_bad_pstate_is_one_error_spelt_as_typed(node: Path) -> None:
    done = mokka_ctl("pstate", "--root", str(node), "--gpu", "0", "--state", "P16",
                     cwd=node.parent)
    assert done.returncode == 2
    assert done.stderr == (
        "mokka ctl: error: --state: 'P16' is not a performance state, expected P0..P15\n")
    assert overrides_of(node) is None
    # the same value through ``set`` names the field, in the same words
    done = mokka_ctl("set", "--root", str(node), "performance_state=p16", cwd=node.parent)
    assert done.returncode == 2
    assert done.stderr == (
        f"mokka ctl: error: {node}{OVERRIDES}: all.performance_state: 'p16' is not a "
        "performance state, expected P0..P15\n")
    # any case is accepted and written as nvidia-smi prints it
    assert ctl.main(["pstate", "--root", str(node), "--gpu", "0", "--state", " p15 "]) == 0
    assert overrides_of(node)["devices"]["0"] == {
        "performance_state": "P15", "power": {"power_state": "P15"}}


# ---- a node that is not staged ----------------------------------------------


@pytest.mark.parametrize("verb", [
    ["status"], ["status", "--json"], ["status", "--gpu", "0"],
    ["fail", "--gpu", "0", "--mode", "lost"], ["reset"],
])
def test_every_verb_says_the_same_of_a_node_not_staged(tmp_path: Path, verb: list[str]) -> None:
    root = tmp_path / "not-staged"
    done = mokka_ctl(verb[0], "--root", str(root), *verb[1:], cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr == (
        f"mokka ctl: error: {root}{CONFIG_DIR}: {NOT_STAGED}\n")
    assert not root.exists()


def test_status_of_a_staged_node_without_overrides_is_0(node: Path) -> None:
    done = mokka_ctl("status", "--root", str(node), cwd=node.parent)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"no overrides in {node}{OVERRIDES}\n"


# ---- help and abbreviations -------------------------------------------------


def ctl_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mokka ctl", allow_abbrev=False)
    ctl_verbs.add_verbs(parser)
    return parser


def every_verb(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every verb's parser, the deferred ones built (``ib-counter``)."""
    verbs = ctl_verbs.verbs_action(parser)
    return {name: verbs.load(name) for name in list(verbs.choices)}


def test_every_ctl_flag_and_verb_has_help() -> None:
    parser = ctl_parser()
    verbs = every_verb(parser)
    assert {"fail", "xid", "temp", "power", "util", "clocks", "throttle", "pstate",
            "nvlink-error", "fabric-health", "mig", "set", "status", "reset",
            ctl_verbs.IB_COUNTER_VERB} == set(verbs)
    missing = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, verb in [("(ctl)", parser), *verbs.items()]
        for action in verb._actions
        if not isinstance(action, argparse._SubParsersAction)
        and (not action.help or action.help == argparse.SUPPRESS)
    ]
    assert missing == []
    summaries = {a.dest: a.help for a in ctl_verbs.verbs_action(parser)._choices_actions}
    assert sorted(summaries) == sorted(verbs)
    assert all(summaries.values())


def test_the_deferred_verb_is_listed_as_its_module_defines_it() -> None:
    from mokka.simulators.ib import counters

    assert ctl_verbs.IB_COUNTER_VERB == counters.VERB
    assert counters.__name__ == ctl_verbs.IB_COUNTER_MODULE
    parser = ctl_parser()
    before = parser.format_help()
    every_verb(parser)
    # built, it sits where it was listed, with the module's own summary
    assert parser.format_help() == before
    assert f"{ctl_verbs.IB_COUNTER_VERB}  " in before
    assert ctl_verbs.IB_COUNTER_SUMMARY in before
    args = parser.parse_args(["ib-counter", "--file", "f", "--hca", "mlx5_1", "symbol_error=2"])
    assert (args.verb, args.hca, args.changes, args.set) == (
        "ib-counter", "mlx5_1", ["symbol_error=2"], False)


def test_deferred_verb_help_through_the_command_line(tmp_path: Path) -> None:
    done = mokka_ctl("ib-counter", "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: mokka ctl ib-counter ")
    assert "--hca mlx5_N" in done.stdout
    listing = mokka_ctl("--help", cwd=tmp_path)
    assert listing.returncode == 0
    assert ctl_verbs.IB_COUNTER_SUMMARY in listing.stdout


@pytest.mark.parametrize("argv", [
    ["status", "--jso"],
    ["temp", "--gpu", "0", "--celsius", "50", "--roo", "x"],
    ["--fil=x", "status"],
    ["fail", "--gpu", "0", "--mode", "lost", "--after", "3"],
])
def test_abbreviated_ctl_flags_are_refused(file_dir: Path, argv: list[str], capsys) -> None:
    # the standalone entry point and the ``mokka`` command line alike
    with pytest.raises(SystemExit) as info:
        ctl.main([*argv, "--file", str(file_dir / "overrides.yaml")])
    assert info.value.code == 2
    assert "unrecognized arguments: " in capsys.readouterr().err
    done = mokka_ctl(*argv, "--file", str(file_dir / "overrides.yaml"), cwd=file_dir)
    assert done.returncode == 2
    assert "unrecognized arguments: " in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert list(file_dir.iterdir()) == []


def test_no_ctl_parser_allows_abbreviations() -> None:
    parser = ctl_parser()
    assert [name for name, verb in every_verb(parser).items() if verb.allow_abbrev] == []


@pytest.fixture
def file_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "config"
    directory.mkdir()
    return directory


# ---- imports ----------------------------------------------------------------

#: What ``mokka ctl`` must never import for a verb of its own: the daemon
#: (its simulators, the health server and what that stands on).
HEAVY = ("mokka.daemon", "mokka.simulators", "hypercorn", "quart", "flask", "trio",
         "prometheus_client", "importlib.metadata")
PROBE = """
import sys
from mokka import cli
code = cli.main(sys.argv[1:])
heavy = sorted(m for m in sys.modules if m.startswith({heavy!r}))
print(code, heavy)
"""


@pytest.mark.parametrize("verb", [
    ["status"], ["temp", "--gpu", "0", "--celsius", "70"], ["xid", "--gpu", "0", "--code", "79"],
])
def test_a_ctl_verb_imports_only_what_it_needs(node: Path, verb: list[str]) -> None:
    """The daemon's stack made every ``mokka ctl`` call twenty times slower than Python's start."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY), "ctl", verb[0], "--root", str(node),
         *verb[1:]],
        env=daemon_env(), capture_output=True, text=True, timeout=PROCESS_TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "0 []"


# ---- the engine config's index ----------------------------------------------


@pytest.mark.parametrize("profile", sorted(BUILTIN_PROFILES))
def test_engine_index_reads_what_yaml_reads(tmp_path: Path, profile: str) -> None:
    """The line scan agrees with a full YAML load of what the daemon writes."""
    text = render_engine_config(compile_profile(profile, node_name="node-7"))
    config = tmp_path / "config.yaml"
    config.write_text(text)
    doc = yaml.safe_load(text)
    expected = {doc[f"device.{pos}.uuid"]: doc[f"device.{pos}.index"]
                for pos in range(doc["device_count"])}
    assert ctl_targets.engine_gpus(config) == expected


def test_engine_index_reads_the_first_and_the_last_line(tmp_path: Path) -> None:
    """The line scan finds a GPU's lines wherever they are, the file's ends included."""
    uuid = "GPU-0a1b2c3d-0000-4000-8000-00000000000f"
    config = tmp_path / "config.yaml"
    config.write_text(f"device.0.index: 7\nformat: 1\nx.device.1.index: 3\n"
                      f'device.0.uuid: "{uuid}"')
    assert ctl_targets.engine_gpus(config) == {uuid: 7}


@pytest.mark.parametrize(("change", "readable"), [
    (lambda t: t.replace("format: 1\n", "format: 2\n"), False),
    (lambda t: t.replace("format: 1\n", ""), False),
    (lambda t: t.replace('device.0.uuid: "', "device.0.uuid: ", 1), False),
    (lambda t: t.replace("device.0.index: 0", "device.0.index: zero", 1), False),
    (lambda t: t + "device.0.index: 5\n", True),
])
def test_engine_index_gives_up_on_surprises(tmp_path: Path, change, readable: bool) -> None:
    text = render_engine_config(compile_profile("l40s", node_name="n"))
    config = tmp_path / "config.yaml"
    config.write_text(change(text))
    found = ctl_targets.engine_gpus(config)
    if readable:
        # a later line wins, as in YAML loaders and the library
        assert list(found.values()) == [5]
    else:
        assert found is None
