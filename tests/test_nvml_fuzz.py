"""The mock NVML library against damaged engine configs, under AddressSanitizer
and UBSan.

The library and a driver that sweeps every implemented getter
(``tests/nvml_fuzz_driver.c``) are built with ``-fsanitize=address,undefined``;
each config must end without a sanitizer report, within the driver's time
limit, and with what ``tests.engine_config_oracle.parse_engine_config`` (the
documented format restated in Python) says: ``NVML_ERROR_UNKNOWN`` for a
file the format refuses, else the device count, UUIDs and memory sizes the
file holds.  The mutated corpus (``tests.engine_config_mutations``) is
seeded and bounded (300 configs); longer campaigns run by hand with
``python -m tests.nvml_fuzz_support``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.engine_config_mutations import MUTATIONS, corpus
from tests.engine_config_oracle import (
    MAX_BYTES,
    MAX_KEY,
    MAX_LINE,
    MAX_VALUE,
    NVML_ERROR_UNKNOWN,
    NVML_SUCCESS,
    expected_answers,
)
from tests.nvml_fuzz_support import Outcome, build_sanitized, fuzz, parse_output, start_driver

SEED = 20240611
CONFIGS = 300


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nvml-asan")
    try:
        return build_sanitized(out)
    except (subprocess.CalledProcessError, RuntimeError) as error:
        pytest.fail(f"building with -fsanitize=address,undefined failed ({error}); gcc's "
                    "libasan and libubsan come with the gcc package "
                    "(./scripts/install-system-deps)")


def test_mutated_configs_end_with_a_documented_answer(driver: Path, tmp_path: Path) -> None:
    cases = corpus(SEED, CONFIGS)
    campaign = fuzz(driver, tmp_path, cases, seconds=10, jobs=2)
    assert not campaign.problems, "\n".join(campaign.problems)
    assert campaign.ran == CONFIGS
    # The corpus reaches both sides of the parser and uses every mutation.
    assert 0.2 * CONFIGS < campaign.refused < 0.8 * CONFIGS
    assert campaign.calls > 1000 * CONFIGS
    used = {part for name, _ in cases for part in name.split("-", 2)[2].split("+")}
    assert used == set(MUTATIONS)


MINIMAL = (b'format: 1\ndevice_count: 1\ndevice.0.uuid: "GPU-1"\n'
           b"device.0.memory.total_bytes: 1024\n")


def with_line(line: bytes) -> bytes:
    return MINIMAL + line + b"\n"


def with_memory(value: bytes) -> bytes:
    return MINIMAL.replace(b"total_bytes: 1024", b"total_bytes: " + value)


def with_count(value: bytes) -> bytes:
    return MINIMAL.replace(b"device_count: 1", b"device_count: " + value)


# (id, config, nvmlInit's answer, device 0's (uuid, memory) when it succeeds)
BOUNDARIES = [
    ("minimal", MINIMAL, NVML_SUCCESS, ("GPU-1", "1024")),
    ("key-at-limit", with_line(b"k" * MAX_KEY + b": 1"), NVML_SUCCESS, ("GPU-1", "1024")),
    ("key-over-limit", with_line(b"k" * (MAX_KEY + 1) + b": 1"), NVML_ERROR_UNKNOWN, None),
    ("value-at-limit", with_line(b"v: " + b"x" * MAX_VALUE), NVML_SUCCESS, ("GPU-1", "1024")),
    ("value-over-limit", with_line(b"v: " + b"x" * (MAX_VALUE + 1)), NVML_ERROR_UNKNOWN, None),
    ("quoted-over-limit", with_line(b'v: "' + b"x" * (MAX_VALUE + 1) + b'"'),
     NVML_ERROR_UNKNOWN, None),
    ("escaped-at-limit", with_line(b'v: "' + b"\\\\" * MAX_VALUE + b'"'), NVML_SUCCESS,
     ("GPU-1", "1024")),
    ("line-over-limit", with_line(b"v: " + b"x" * MAX_LINE), NVML_ERROR_UNKNOWN, None),
    ("nul-byte", with_line(b'v: "a\0b"'), NVML_ERROR_UNKNOWN, None),
    ("empty-file", b"", NVML_ERROR_UNKNOWN, None),
    ("only-comments", b"# nothing\n#\n", NVML_ERROR_UNKNOWN, None),
    ("format-2", MINIMAL.replace(b"format: 1", b"format: 2"), NVML_ERROR_UNKNOWN, None),
    ("format-quoted", MINIMAL.replace(b"format: 1", b'format: "1"'), NVML_SUCCESS,
     ("GPU-1", "1024")),
    ("format-missing", MINIMAL.replace(b"format: 1\n", b""), NVML_ERROR_UNKNOWN, None),
    ("crlf", MINIMAL.replace(b"\n", b"\r\n"), NVML_SUCCESS, ("GPU-1", "1024")),
    ("no-separator", with_line(b"key=value"), NVML_ERROR_UNKNOWN, None),
    ("colon-no-space", with_line(b"key:value"), NVML_ERROR_UNKNOWN, None),
    ("empty-value", with_line(b"key:"), NVML_SUCCESS, ("GPU-1", "1024")),
    ("bad-key-char", with_line(b"ke y: 1"), NVML_ERROR_UNKNOWN, None),
    ("non-utf8-key", with_line(b"k\xff: 1"), NVML_ERROR_UNKNOWN, None),
    # bytes that are not UTF-8 come back as "?" (a real driver never returns them)
    ("non-utf8-value", MINIMAL.replace(b'"GPU-1"', b'"GPU-\xff\xfe"'), NVML_SUCCESS,
     ("GPU-??", "1024")),
    ("duplicate-later-wins", with_line(b'device.0.uuid: "GPU-2"'), NVML_SUCCESS,
     ("GPU-2", "1024")),
    ("uuid-fills-buffer", MINIMAL.replace(b'"GPU-1"', b'"' + b"u" * 95 + b'"'), NVML_SUCCESS,
     ("u" * 95, "1024")),
    ("uuid-over-buffer", MINIMAL.replace(b'"GPU-1"', b'"' + b"u" * 96 + b'"'), NVML_SUCCESS,
     ("!7", "1024")),
    ("unterminated-quote", MINIMAL.replace(b'"GPU-1"', b'"GPU-1'), NVML_ERROR_UNKNOWN, None),
    ("bad-escape", MINIMAL.replace(b'"GPU-1"', b'"GPU\\n1"'), NVML_ERROR_UNKNOWN, None),
    ("after-quote", MINIMAL.replace(b'"GPU-1"', b'"GPU-1" x'), NVML_ERROR_UNKNOWN, None),
    ("quote-comment", MINIMAL.replace(b'"GPU-1"', b'"GPU-1"\t# c'), NVML_SUCCESS,
     ("GPU-1", "1024")),
    ("bare-comment", with_memory(b"2048 # two"), NVML_SUCCESS, ("GPU-1", "2048")),
    ("count-64", with_count(b"64"), NVML_SUCCESS, ("GPU-1", "1024")),
    ("count-65", with_count(b"65"), NVML_ERROR_UNKNOWN, None),
    ("count-hex", with_count(b"0x1"), NVML_SUCCESS, ("GPU-1", "1024")),
    ("count-negative", with_count(b"-1"), NVML_ERROR_UNKNOWN, None),
    ("count-empty", with_count(b'""'), NVML_ERROR_UNKNOWN, None),
    # Numbers are digits (or 0x and hex digits) only: no sign, no blanks.
    ("count-plus", with_count(b"+1"), NVML_ERROR_UNKNOWN, None),
    ("count-blank", with_count(b'" 1"'), NVML_ERROR_UNKNOWN, None),
    ("count-tab", with_count(b"\t1"), NVML_ERROR_UNKNOWN, None),
    ("memory-tab-negative", with_memory(b"\t-1"), NVML_SUCCESS, ("GPU-1", "!3")),
    ("memory-blank-negative", with_memory(b'" -1"'), NVML_SUCCESS, ("GPU-1", "!3")),
    ("memory-max", with_memory(b"18446744073709551615"), NVML_SUCCESS,
     ("GPU-1", "18446744073709551615")),
    ("memory-overflow", with_memory(b"18446744073709551616"), NVML_SUCCESS, ("GPU-1", "!3")),
    ("memory-hex-negative", with_memory(b"0x-1"), NVML_SUCCESS, ("GPU-1", "!3")),
    # A value past 32 bits is no answer for a 32-bit query, through any call
    # (the driver compares each field value with its getter).
    ("power-past-32-bits", with_line(b"device.0.power.current_draw_mw: 4294967301"),
     NVML_SUCCESS, ("GPU-1", "1024")),
    ("limit-past-32-bits", with_line(b"device.0.power.enforced_limit_mw: 0x100000001"),
     NVML_SUCCESS, ("GPU-1", "1024")),
]


def run_cases(driver: Path, tmp_path: Path, cases: list[tuple[str, bytes]],
              seconds: int = 10) -> tuple[dict[str, Outcome], str]:
    """One driver process over ``cases``: each case's outcome (an empty one
    for cases the process never reached) and the driver's stderr."""
    dev = tmp_path / "dev"
    dev.mkdir(exist_ok=True)
    paths = []
    for name, data in cases:
        path = tmp_path / f"{name}.yaml"
        path.write_bytes(data)
        paths.append(path)
    proc = start_driver(driver, paths, dev, seconds)
    stdout, stderr = proc.communicate(timeout=seconds * len(paths) + 120)
    outcomes = parse_output(stdout)
    return {path.stem: outcomes.get(str(path), Outcome()) for path in paths}, stderr


def test_documented_limits_and_spellings(driver: Path, tmp_path: Path) -> None:
    outcomes, stderr = run_cases(driver, tmp_path,
                                 [(name, data) for name, data, _, _ in BOUNDARIES])
    wrong = []
    for name, data, init, device in BOUNDARIES:
        outcome = outcomes[name]
        assert outcome.finished, f"{name}:\n{stderr[-4000:]}"
        assert expected_answers(data).init == init, f"{name}: the oracle disagrees"
        got = (outcome.init, outcome.devices[0] if outcome.devices else None)
        if got != (init, device) or outcome.violations:
            wrong.append((name, got, outcome.violations))
        elif init == NVML_SUCCESS:
            assert outcome.devices == expected_answers(data).devices, name
    assert not wrong, "\n".join(map(repr, wrong))


def test_file_size_limit(driver: Path, tmp_path: Path) -> None:
    """16 MiB is accepted, one byte more is refused before it is read."""
    padding = MAX_BYTES - len(MINIMAL)
    at_limit = MINIMAL + b"#" * (padding - 1) + b"\n"
    assert len(at_limit) == MAX_BYTES
    outcomes, stderr = run_cases(driver, tmp_path, [("at-limit", at_limit),
                                                    ("over-limit", at_limit + b"\n")])
    assert outcomes["over-limit"].finished, stderr[-4000:]
    assert outcomes["at-limit"].init == NVML_SUCCESS
    assert outcomes["at-limit"].devices == (("GPU-1", "1024"),)
    assert outcomes["over-limit"].init == NVML_ERROR_UNKNOWN


HUGE_COUNTS = [
    ("xid-count", b"xid_count: 18446744073709551615"),
    ("xid-count-32", b"xid_count: 4294967295"),
    ("processes", b"device.0.processes.count: 4294967295"),
    ("memory-clocks", b"device.0.supported_clocks.memory_clocks.count: 4294967295"),
    ("graphics-clocks", b"device.0.supported_clocks.memory_clocks.count: 1\n"
                        b"device.0.supported_clocks.memory_clocks.0.freq_mhz: 1000\n"
                        b"device.0.supported_clocks.memory_clocks.0.graphics_clocks.count: "
                        b"4294967295"),
    ("retired-pages", b"device.0.retired_pages.single_bit_retirement.addresses.count: "
                      b"4294967295"),
]


def test_list_counts_beyond_their_entries_stay_bounded(driver: Path, tmp_path: Path) -> None:
    """A list count no file could back (2^32 processes, 2^64 Xids) must not
    make a call loop for hours or hand a client a list it cannot allocate."""
    wrong = []
    for name, line in HUGE_COUNTS:
        outcomes, stderr = run_cases(driver, tmp_path, [(name, with_line(line))], seconds=5)
        outcome = outcomes[name]
        assert outcome.hung or outcome.finished, f"{name}:\n{stderr[-4000:]}"
        if outcome.hung or outcome.violations or outcome.init != NVML_SUCCESS:
            wrong.append((name, "hung" if outcome.hung else outcome.init, outcome.violations))
    assert not wrong, "\n".join(map(repr, wrong))
