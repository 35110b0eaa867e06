"""Fuzzing the mock NVML library's engine config parser: building, running
and judging.

Shared by ``tests/test_nvml_fuzz.py`` (a bounded, seeded run) and by longer
campaigns run by hand::

    .venv/bin/python -m tests.nvml_fuzz_support --configs 20000 --seed 7

* the inputs are ``tests.engine_config_mutations`` (damaged configs
  starting from the writer's own);
* the oracle is ``tests.engine_config_oracle`` (the documented format in
  Python): a file it refuses must fail ``nvmlInit`` with
  ``NVML_ERROR_UNKNOWN``; a file it accepts must initialise and report the
  device count, UUIDs and memory sizes it holds;
* the driver (``tests/nvml_fuzz_driver.c`` and ``nvml_fuzz_device.c``),
  built with AddressSanitizer and UBSan against a library built the same
  way, initialises the library from each config and sweeps every
  implemented getter (``fuzz``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs

if __package__ in (None, ""):  # run as a script: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.engine_config_mutations import iter_corpus
from tests.engine_config_oracle import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_UNKNOWN,
    Expected,
    expected_answers,
)
from tests.nvml_support import compiler, load_target

HERE = Path(__file__).resolve().parent
DRIVER_SOURCES = (HERE / "nvml_fuzz_driver.c", HERE / "nvml_fuzz_device.c")

#: gcc's AddressSanitizer and UBSan; any finding aborts (no recovery), so a
#: report always ends the run with a non-zero status.
SANITIZE = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer",
            "-fno-sanitize-recover=all", "-g")
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=23:strict_string_checks=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


# --------------------------------------------------------------------------
# Building and running
# --------------------------------------------------------------------------


def build_sanitized(out: Path) -> Path:
    """The library and the driver, both with ASan and UBSan; the driver's path."""
    out.mkdir(parents=True, exist_ok=True)
    target = load_target("nvml")
    target.build(out, compiler(), extra_cflags=SANITIZE)
    header = target._exports().find_header()
    driver = out / "nvml_fuzz_driver"
    subprocess.run(
        [compiler(), "-std=gnu11", "-O1", *SANITIZE, "-Wall", "-Wextra", "-Werror",
         f"-I{header.parent}", *map(str, DRIVER_SOURCES), "-o", str(driver), f"-L{out}",
         "-l:libnvidia-ml.so.1", f"-Wl,-rpath,{out}"],
        check=True,
    )
    return driver


@attrs.frozen(kw_only=True)
class Outcome:
    """What the driver printed for one config."""

    init: int | None = None
    devices: tuple[tuple[str, str], ...] = ()
    violations: tuple[str, ...] = ()
    hung: bool = False
    finished: bool = False


def parse_output(stdout: str) -> dict[str, Outcome]:
    outcomes: dict[str, dict] = {}
    current: dict | None = None
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "config":
            current = outcomes.setdefault(rest, {"devices": [], "violations": []})
        elif current is None:
            continue
        elif word == "init":
            current["init"] = int(rest)
        elif word == "device":
            fields = rest.split(" ")
            current["devices"].append((fields[2], fields[4]))
        elif word == "violation":
            current["violations"].append(rest)
        elif word == "hang":
            current["hung"] = True
        elif word == "done":
            current["finished"] = True
    return {
        path: Outcome(init=o.get("init"), devices=tuple(o["devices"]),
                      violations=tuple(o["violations"]), hung=o.get("hung", False),
                      finished=o.get("finished", False))
        for path, o in outcomes.items()
    }


def _driver_env(dev_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOCK_NVML", "LD_"))}
    env.update(SANITIZER_ENV, MOCK_NVML_DEV_DIR=str(dev_dir))
    return env


def start_driver(driver: Path, configs: Sequence[Path], dev_dir: Path,
                 seconds: int) -> subprocess.Popen:
    """One driver process over ``configs``; ``dev_dir`` is where the library
    looks for /dev/nvidia* (empty: no device filtering)."""
    return subprocess.Popen([str(driver), str(seconds), *map(str, configs)],
                            env=_driver_env(dev_dir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace")


def judge(path: Path, outcome: Outcome | None, expected: Expected) -> list[str]:
    """Every way ``outcome`` breaks the contract (empty when it is right)."""
    if outcome is None:
        return ["never started (the driver died on an earlier config)"]
    problems = [f"violation: {v}" for v in outcome.violations]
    if outcome.hung:
        problems.append("hung (no answer within the driver's time limit)")
    elif not outcome.finished:
        problems.append("did not finish (crashed; see the sanitizer report)")
    if outcome.init != expected.init:
        problems.append(f"nvmlInit returned {outcome.init}, expected {expected.init}")
    elif len(outcome.devices) != len(expected.devices) and outcome.finished:
        problems.append(f"{len(outcome.devices)} devices, expected {len(expected.devices)}")
    else:
        for index, ((uuid, memory), (want_uuid, want_memory)) in enumerate(
                zip(outcome.devices, expected.devices, strict=False)):
            if uuid != want_uuid:
                problems.append(f"device {index}: uuid {uuid}, expected {want_uuid}")
            if want_memory is not None and memory != want_memory:
                problems.append(f"device {index}: memory {memory}, expected {want_memory}")
            lost = f"!{NVML_ERROR_GPU_IS_LOST}"
            if want_memory is None and memory != lost and not memory.isdigit():
                problems.append(f"device {index}: memory {memory}, expected a size or {lost}")
    return [f"{path.name}: {p}" for p in problems]


@attrs.define
class Campaign:
    """Running totals of a fuzz run."""

    ran: int = 0  # configs the driver finished or was stopped on
    refused: int = 0  # nvmlInit refused the file (NVML_ERROR_UNKNOWN)
    calls: int = 0  # NVML calls the driver made
    problems: list[str] = attrs.Factory(list)


def _run_batches(driver: Path, chunks: list[list[Path]], dev_dir: Path, seconds: int,
                 expected: dict[Path, Expected], campaign: Campaign) -> set[Path]:
    """Run the chunks in parallel; the configs with problems (kept on disk)."""
    failed: set[Path] = set()
    pending = list(chunks)
    while pending:
        running = [(chunk, start_driver(driver, chunk, dev_dir, seconds)) for chunk in pending]
        pending = []
        for chunk, proc in running:
            stdout, stderr = proc.communicate(timeout=seconds * len(chunk) + 120)
            outcomes = parse_output(stdout)
            for i, path in enumerate(chunk):
                outcome = outcomes.get(str(path))
                if outcome is None:
                    pending.append(chunk[i:])  # the process died earlier: resume here
                    break
                campaign.ran += 1
                campaign.refused += outcome.init == NVML_ERROR_UNKNOWN
                found = judge(path, outcome, expected[path])
                if not outcome.finished and not outcome.hung:
                    found.append(f"{path.name}: stderr:\n{stderr[-3000:]}")
                if found:
                    failed.add(path)
                    campaign.problems.extend(found)
            campaign.calls += sum(int(line.split()[1]) for line in stdout.splitlines()
                                  if line.startswith("done "))
            if proc.returncode != 0 and not pending and all(
                    str(p) in outcomes and outcomes[str(p)].finished for p in chunk):
                campaign.problems.append(f"driver exited {proc.returncode} after its batch:\n"
                                         f"{stderr[-3000:]}")
    return failed


def fuzz(driver: Path, work: Path, cases: Iterable[tuple[str, bytes]], *, seconds: int = 10,
         batch: int = 150, jobs: int = 2) -> Campaign:
    """Run ``cases`` through the driver, ``jobs`` processes of ``batch``
    configs at a time.  Configs are written to ``work`` per round and
    removed once judged right; those with problems stay for a look."""
    work.mkdir(parents=True, exist_ok=True)
    dev_dir = work / "dev"
    dev_dir.mkdir(exist_ok=True)
    campaign = Campaign()
    cases = iter(cases)
    while True:
        round_cases = [case for _, case in zip(range(batch * jobs), cases, strict=False)]
        if not round_cases:
            return campaign
        expected: dict[Path, Expected] = {}
        for name, data in round_cases:
            path = work / f"{name[:120]}.yaml"
            path.write_bytes(data)
            expected[path] = expected_answers(data)
        paths = list(expected)
        chunks = [paths[i : i + batch] for i in range(0, len(paths), batch)]
        failed = _run_batches(driver, chunks, dev_dir, seconds, expected, campaign)
        for path in paths:
            if path not in failed:
                path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=5000, help="mutated configs to run")
    parser.add_argument("--seed", type=int, default=1, help="seed of the mutations")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="driver processes")
    parser.add_argument("--keep", type=Path,
                        help="directory for the build and failing configs (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="mokka-nvml-fuzz-") as scratch:
        work = args.keep or Path(scratch)
        driver = build_sanitized(work / "build")
        campaign = fuzz(driver, work / "configs", iter_corpus(args.seed, args.configs),
                        jobs=args.jobs)
        for problem in campaign.problems:
            print(problem)
        print(f"{campaign.ran} configs (seed {args.seed}): {campaign.refused} refused, "
              f"{campaign.calls} NVML calls, {len(campaign.problems)} problems")
        return 1 if campaign.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
