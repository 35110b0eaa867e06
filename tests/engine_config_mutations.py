"""Damaged engine configs for the NVML fuzz tests (``tests/nvml_fuzz_support.py``).

The starting points are the configs the writer renders for every built-in
profile, each also with Xids, processes, retired pages, fans, NVLink links
and failure modes appended (``ENRICH``), so the list, event and failure
paths are reached too.  ``mutate`` applies one to three mutations; the
corpus is the same for the same seed.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Sequence

from mokka.simulators.gpudriver.engine_config import render_engine_config
from mokka.state.compile import compile_profile
from tests.engine_config_oracle import MAX_KEY, MAX_LINE, MAX_VALUE

PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")


#: Lines that exercise the list, Xid and failure paths the profiles leave
#: empty; appended to a rendered config (later keys win).
ENRICH = b"""xid_count: 3
xid.0.id: "fuzz-1"
xid.0.gpu: 0
xid.0.code: 79
xid.1.id: "fuzz-2"
xid.1.gpu: 1
xid.1.code: 48
xid.2.id: "fuzz-1"
xid.2.gpu: 0
xid.2.code: 13
device.0.processes.count: 2
device.0.processes.0.pid: 4242
device.0.processes.0.name: "python3"
device.0.processes.0.used_memory_bytes: 1048576
device.0.processes.1.pid: 4343
device.0.processes.1.type: "graphics"
device.0.retired_pages.double_bit_retirement.addresses.count: 2
device.0.retired_pages.double_bit_retirement.addresses.0: 0x1000
device.0.retired_pages.double_bit_retirement.addresses.1: 0x2000
device.0.fan.count: 2
device.0.fan.speed_percent: 40
device.0.failure.mode: "ecc_uncorrectable"
device.0.failure.after_calls: 50
device.1.failure.mode: "lost"
device.1.failure.probability: 0.5
device.1.failure.seed: 7
device.0.nvlink.link_count: 2
device.0.nvlink.link.0.remote_type: "gpu"
device.0.nvlink.link.1.remote_type: "switch"
device.0.fabric.state: "auto"
device.0.cpu_affinity: "0-7,64-71"
"""


def base_configs() -> dict[str, bytes]:
    """Engine configs the writer renders for the built-in profiles, each
    also with ENRICH appended."""
    configs: dict[str, bytes] = {}
    for profile in PROFILES:
        text = render_engine_config(compile_profile(profile, node_name="fuzz-node")).encode()
        configs[profile] = text
        configs[f"{profile}+lists"] = text + ENRICH
    return configs


Mutation = Callable[[random.Random, list[bytes]], list[bytes]]

HUGE = (b"18446744073709551616", b"18446744073709551615", b"9223372036854775808",
        b"4294967296", b"4294967295", b"2147483648", b"1" + b"0" * 40, b"0x" + b"f" * 17,
        b"0xffffffffffffffff", b"1e400", b"99999999999999999999999")
NEGATIVE = (b"-1", b"-0", b"-2147483649", b"-18446744073709551615", b"\t-1", b'" -1"',
            b" +5", b'"\t-5"', b"+-1", b"- 1")


def _pick(rng: random.Random, lines: list[bytes]) -> int:
    return rng.randrange(len(lines)) if lines else 0


def _set_value(line: bytes, value: bytes) -> bytes:
    key, sep, _ = line.partition(b": ")
    return key + b": " + value if sep else line


def _truncate(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    data = b"\n".join(lines)
    cut = rng.randrange(len(data) + 1)
    return data[:cut].split(b"\n")


def _flip(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    data = bytearray(b"\n".join(lines))
    for _ in range(rng.randint(1, 8)):
        if data:
            data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data).split(b"\n")


def _long_key(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    size = rng.choice((MAX_KEY - 1, MAX_KEY, MAX_KEY + 1, 4096, MAX_LINE + 1))
    prefix = rng.choice((b"device.0.", b"", b"xid.0."))
    return [*lines, prefix + b"k" * max(size - len(prefix), 1) + b": 1"]


def _long_value(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    size = rng.choice((MAX_VALUE - 1, MAX_VALUE, MAX_VALUE + 1, 2 * MAX_VALUE + 8, MAX_LINE))
    filler = rng.choice((b"x", b"\\\\", b'\\"', b"\xc3\xa9"))
    body = (filler * (size // len(filler) + 1))[:size]
    if rng.random() < 0.5:
        body = b'"' + body + b'"'
    lines = list(lines)
    lines[i] = _set_value(lines[i], body)
    return lines


def _separator(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    lines = list(lines)
    replacement = rng.choice((b"", b":", b"=", b" : ", b":\t", b"::", b": : "))
    lines[i] = lines[i].replace(b": ", replacement, 1)
    return lines


def _duplicate(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    value = rng.choice((b'"dup"', b"0", b"7", b"true", b"", b'""'))
    where = rng.randrange(len(lines) + 1)
    return [*lines[:where], _set_value(lines[i], value), *lines[where:]]


def _number(choices: Sequence[bytes]) -> Mutation:
    def mutate(rng: random.Random, lines: list[bytes]) -> list[bytes]:
        numeric = [i for i, line in enumerate(lines)
                   if re.fullmatch(rb"[A-Za-z0-9_.-]+: -?[0-9.]+", line)]
        lines = list(lines)
        for i in rng.sample(numeric, min(len(numeric), rng.randint(1, 6))):
            lines[i] = _set_value(lines[i], rng.choice(choices))
        return lines
    return mutate


def _non_utf8(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    lines = list(lines)
    junk = rng.choice((b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\x80" * 5, b"\x1b[2J"))
    pos = rng.randrange(len(lines[i]) + 1) if lines else 0
    if lines:
        lines[i] = lines[i][:pos] + junk + lines[i][pos:]
    return lines


def _nul(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    i = _pick(rng, lines)
    lines = list(lines)
    if lines:
        pos = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:pos] + b"\0" + lines[i][pos:]
    return lines


def _device_count(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    count = rng.choice((0, 1, 2, 7, 63, 64, 65, 1000))
    return [_set_value(line, str(count).encode()) if line.startswith(b"device_count:") else line
            for line in lines]


def _device_index(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    new = rng.choice((b"63", b"64", b"65", b"4294967295", b"-1", b"01", b"x"))
    old = rng.choice((b"0", b"1", b"2"))
    return [re.sub(rb"^device\." + old + rb"\.", b"device." + new + b".", line) for line in lines]


def _xids(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    count = rng.choice((b"0", b"1", b"3", b"200", b"4294967295", b"18446744073709551615", b"-1"))
    extra = [b"xid_count: " + count]
    for i in range(rng.randint(0, 4)):
        idx = rng.choice((str(i).encode(), b"4294967294", b"-1"))
        extra.append(b"xid." + idx + b".id: " + rng.choice(
            (b'"x"', b'""', b'"' + b"i" * 127 + b'"', b'"' + b"i" * 128 + b'"', b"7")))
        extra.append(b"xid." + idx + b".gpu: " + rng.choice(
            (b"0", b"1", b"63", b"64", b"4294967295", b"-1", b"0x0", b"gpu")))
        extra.append(b"xid." + idx + b".code: " + rng.choice(
            (b"79", b"-1", b"99999999999999999999")))
    return [*lines, *extra]


def _counts(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    counted = [i for i, line in enumerate(lines) if re.match(rb"[^:]*(count|_count): ", line)]
    lines = list(lines)
    for i in rng.sample(counted, min(len(counted), rng.randint(1, 4))):
        lines[i] = _set_value(lines[i], rng.choice(
            (b"4294967295", b"100000000", b"65536", b"19", b"0", b"18446744073709551615")))
    return lines


def _quotes(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    quoted = [i for i, line in enumerate(lines) if b': "' in line]
    lines = list(lines)
    if quoted:
        i = rng.choice(quoted)
        lines[i] = lines[i] + rng.choice((b'"', b"x", b" # c", b"\\", b'\\"', b" \t# c", b"#"))
        if rng.random() < 0.3:
            lines[i] = lines[i].rstrip(b'"')
    return lines


def _whitespace(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    lines = list(lines)
    for i in rng.sample(range(len(lines)), min(len(lines), rng.randint(1, 10))):
        lines[i] = rng.choice((b" ", b"\t", b"")) + lines[i] + rng.choice(
            (b"\r", b" ", b"\t", b" # note", b"#x", b"\r\r"))
    return lines


def _format(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    value = rng.choice((b"2", b"01", b'"1"', b"1.0", b"", b"0x1", b"1 # one"))
    lines = [_set_value(line, value) if line.startswith(b"format:") else line for line in lines]
    return lines if rng.random() < 0.7 else [x for x in lines if not x.startswith(b"format:")]


def _shuffle(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    lines = list(lines)
    for _ in range(rng.randint(1, 20)):
        op = rng.randrange(3)
        i = _pick(rng, lines)
        if not lines:
            break
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        else:
            j = _pick(rng, lines)
            lines[i], lines[j] = lines[j], lines[i]
    return lines


def _garbage(rng: random.Random, lines: list[bytes]) -> list[bytes]:
    junk = bytes(rng.randrange(1, 256) for _ in range(rng.randint(1, 64))).replace(b"\n", b" ")
    where = rng.randrange(len(lines) + 1)
    return [*lines[:where], junk, *lines[where:]]


MUTATIONS: dict[str, Mutation] = {
    "truncate": _truncate, "flip": _flip, "long-key": _long_key, "long-value": _long_value,
    "separator": _separator, "duplicate": _duplicate, "huge": _number(HUGE),
    "negative": _number(NEGATIVE), "non-utf8": _non_utf8, "nul": _nul,
    "device-count": _device_count, "device-index": _device_index, "xids": _xids,
    "counts": _counts, "quotes": _quotes, "whitespace": _whitespace, "format": _format,
    "shuffle": _shuffle, "garbage": _garbage,
}


def mutate(rng: random.Random, base: bytes) -> tuple[bytes, tuple[str, ...]]:
    """One damaged config from ``base`` and the names of the mutations applied."""
    lines = base.split(b"\n")
    names = tuple(rng.choice(sorted(MUTATIONS)) for _ in range(rng.choice((1, 1, 1, 2, 3))))
    for name in names:
        lines = MUTATIONS[name](rng, lines)
    return b"\n".join(lines), names


def iter_corpus(seed: int, count: int) -> Iterator[tuple[str, bytes]]:
    """``count`` mutated configs (name, bytes), the same for the same seed;
    generated one at a time, so a long campaign holds one batch in memory."""
    rng = random.Random(seed)
    bases = base_configs()
    names = sorted(bases)
    for n in range(count):
        base = rng.choice(names)
        data, applied = mutate(rng, bases[base])
        yield f"{n:06d}-{base}-{'+'.join(applied)}", data


def corpus(seed: int, count: int) -> list[tuple[str, bytes]]:
    return list(iter_corpus(seed, count))
