"""Generates the guard-page harness's calls from ``nvml.h`` and builds it.

Every function the library implements (``exports.surface``, the same list
``nvml-coverage.json`` holds) gets a sweep: its parameters are classified
from the header's prototype, each output buffer comes from ``guard_buf``
(flush against a PROT_NONE page) sized exactly as the entry point's struct
version, and the scalars, string lengths, struct versions and array sizes
are swept.  A parameter the rules below cannot classify stops generation
with a message naming the function and the parameter, so a newly
implemented function is covered automatically or fails loudly, never
silently skipped.

Then, per combination, every pointer is also passed as NULL once: no call
may crash on a NULL it should reject.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.nvml_support import compiler, load_target

HERE = Path(__file__).resolve().parent
RUNTIME = HERE / "nvml_guard_harness.c"

#: Called by the harness's frame itself (tests/nvml_guard_harness.c), with
#: the event set's output guarded there.
FRAME = (
    "nvmlInit",
    "nvmlInit_v2",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlEventSetCreate",
    "nvmlEventSetFree",
)

#: Entry points whose header type is newer than their ABI: the size of the
#: record they were published with.  nvmlPciInfo_t was 52 bytes (busId[16]
#: ... pciSubSystemId, reserved0-3) until nvmlDeviceGetPciInfo_v3 and
#: nvmlDeviceGetNvLinkRemotePciInfo_v2 brought the 68-byte layout.
LEGACY_SIZES: dict[tuple[str, str], int] = {
    ("nvmlDeviceGetPciInfo", "pci"): 52,
    ("nvmlDeviceGetPciInfo_v2", "pci"): 52,
    ("nvmlDeviceGetNvLinkRemotePciInfo", "pci"): 52,
    # nvmlEventData_t gained gpuInstanceId/computeInstanceId (32 bytes)
    # with nvmlEventSetWait_v2; the v1 record ends after eventData.
    ("nvmlEventSetWait", "data"): 24,
}

#: Buffers whose size the prototype does not carry: NVIDIA documents them.
FIXED_SIZES: dict[tuple[str, str], str] = {
    # NVML_GSP_FIRMWARE_VERSION_BUF_SIZE
    ("nvmlDeviceGetGspFirmwareVersion", "version"): "0x40",
    # the export table id is a 16-byte UUID
    ("nvmlInternalGetExportTable", "pExportTableId"): "16",
    # an array of NVML_MAX_GPU_PERF_PSTATES states; ``size`` counts its bytes
    ("nvmlDeviceGetSupportedPerformanceStates", "pstates"):
        "NVML_MAX_GPU_PERF_PSTATES * sizeof(nvmlPstates_t)",
}

#: Versioned structs outside NVML_STRUCT_VERSION: their version macro.
PLAIN_VERSIONS: dict[str, str] = {
    "nvmlGpmMetricsGet_t": "NVML_GPM_METRICS_GET_VERSION",
    "nvmlGpmSupport_t": "NVML_GPM_SUPPORT_VERSION",
}

#: Functions that hand the caller a resource: the parameter it comes out
#: through and the function that gives it back (so a run leaks nothing a
#: memory checker would report).
RELEASE: dict[str, tuple[str, str]] = {
    "nvmlGpmSampleAlloc": ("gpmSample", "nvmlGpmSampleFree"),
}

#: Versioned structs that carry a caller-sized array: the count member
#: and the array member.  Swept like a count pointer with its array.
EMBEDDED_ARRAYS: dict[str, tuple[str, str]] = {
    "nvmlProcessesUtilizationInfo_v1_t": ("processSamplesCount", "procUtilArray"),
    "nvmlProcessDetailList_v1_t": ("numProcArrayEntries", "procArray"),
}

#: Inputs a struct must carry to get past argument checks (C run on the
#: guarded record `p`): GPM metrics between the context's two samples.
STRUCT_INIT: dict[str, str] = {
    "nvmlGpmMetricsGet_t": (
        "p->sample1 = x->gpm[0]; p->sample2 = x->gpm[1]; p->numMetrics = NVML_GPM_METRIC_MAX; "
        "for (unsigned k = 0; k < NVML_GPM_METRIC_MAX; k++) p->metrics[k].metricId = k;"
    ),
}

#: Handles the context provides; a function that frees one gets NULL.
CONTEXT_HANDLES: dict[str, str] = {"nvmlGpmSample_t": "x->gpm"}

#: A count pointer followed by pointers that are separate outputs, not arrays.
NOT_ARRAYS = frozenset({"nvmlDeviceGetEncoderStats"})

#: Scalars swept over a wide range (the first of a function) and a narrow one.
WIDE = [*range(24), 0x7FFFFFFF, 0xFFFFFFFF]
NARROW = [0, 1, 2, 3, 0xFFFFFFFF]
#: Lengths given with a char buffer (0: a pointer onto the guard page itself).
LENGTHS = [0, 1, 2, 4, 8, 13, 16, 17, 32, 64, 80, 96, 256]
#: Element counts a caller passes by value with its array.
SIZES_BY_VALUE = [0, 1, 2, 3, 8, 300]

_SCALAR_WORDS = ("unsigned", "int", "long", "char", "short", "float", "double")


class Unclassified(RuntimeError):
    """A parameter the harness does not know how to size."""


@dataclass
class Struct:
    name: str
    members: str  # the body between the braces
    alias_of: str | None = None


@dataclass
class Header:
    """What the generator needs from nvml.h beyond the prototypes."""

    structs: dict[str, Struct]
    handles: set[str]  # typedefs of `struct x *`
    enums: set[str]
    families: dict[str, list[int]]  # struct family -> versions (NVML_STRUCT_VERSION)

    def resolve(self, name: str) -> list[str]:
        """``name`` and every typedef it aliases, newest spelling first."""
        chain = [name]
        while name in self.structs and self.structs[name].alias_of:
            name = self.structs[name].alias_of
            chain.append(name)
        return chain

    def body(self, name: str) -> str | None:
        for n in self.resolve(name):
            if n in self.structs and self.structs[n].alias_of is None:
                return self.structs[n].members
        return None

    def versions(self, ctype: str) -> list[tuple[int, str]] | None:
        """``[(version, struct type)]`` for a struct that starts with a
        version field; None for an unversioned one.  An explicitly versioned
        type (``nvmlMemory_v2_t``) has only its own version; an alias
        (``nvmlPlatformInfo_t``) has every version the header defines."""
        body = self.body(ctype)
        if body is None or not re.match(r"\s*unsigned int version;", body):
            return None
        if ctype in PLAIN_VERSIONS:
            return [(0, ctype)]
        explicit = re.fullmatch(r"nvml(\w+)_v(\d+)_t", ctype)
        if explicit:
            return [(int(explicit.group(2)), ctype)]
        for n in self.resolve(ctype):
            m = re.fullmatch(r"nvml(\w+)_v(\d+)_t", n)
            if m and m.group(1) in self.families:
                family = m.group(1)
                return [(v, f"nvml{family}_v{v}_t") for v in self.families[family]]
        raise Unclassified(
            f"{ctype}: a versioned struct of no NVML_STRUCT_VERSION family; add its version "
            "macro to PLAIN_VERSIONS"
        )


def read_header(header: Path, cc: str, raw: str) -> Header:
    exports = load_target("nvml")._exports()
    structs: dict[str, Struct] = {}
    handles: set[str] = set()
    enums: set[str] = set()
    for st in exports.header_statements(header, cc):
        m = re.fullmatch(r"typedef struct \w* ?\{(.*)\} ?([\w ,\*]+)", st)
        if m:
            for name in (n.strip() for n in m.group(2).split(",")):
                structs[name] = Struct(name, m.group(1))
            continue
        m = re.fullmatch(r"typedef (?:enum|union) \w* ?\{.*\} ?(\w+)", st)
        if m:
            enums.add(m.group(1))
            continue
        m = re.fullmatch(r"typedef struct \w+ ?\* ?(\w+)", st)
        if m:
            handles.add(m.group(1))
            continue
        m = re.fullmatch(r"typedef (nvml\w+) (\w+)", st)
        if m:
            structs[m.group(2)] = Struct(m.group(2), "", alias_of=m.group(1))
            continue
        m = re.fullmatch(r"typedef unsigned int (\w+)", st)
        if m:
            enums.add(m.group(1))
    families: dict[str, list[int]] = {}
    for fam, ver in re.findall(r"#define nvml(\w+)_v(\d+)\s+NVML_STRUCT_VERSION\(\1,", raw):
        families.setdefault(fam, []).append(int(ver))
    return Header(structs=structs, handles=handles, enums=enums, families=families)


# --------------------------------------------------------------------------
# Parameter roles: each knows its variants and the C that sets it up
# --------------------------------------------------------------------------


@dataclass
class Role:
    """One parameter (or a count with its arrays) in a generated call.

    ``variants`` C cases; ``setup(v)`` the statements for variant ``v``
    (a C expression) that assign ``a<i>``; ``pointers`` which of the
    parameter indices are pointers (NULL-able)."""

    indices: list[int]
    decls: list[str]
    variants: int
    setup: str  # uses the variable `v`
    pointers: list[int] = field(default_factory=list)
    #: A size query run first, with the other arguments as this combination
    #: sets them: C that prepares it, and the expression holding the total
    #: after the call (the variants are built around that total).
    query: tuple[str, str] | None = None


def _is_scalar(ctype: str, header: Header) -> bool:
    if "*" in ctype:
        return False
    words = ctype.replace("const ", "").split()
    return all(w in _SCALAR_WORDS for w in words) or ctype in header.enums


def _elem(ctype: str) -> str:
    """The pointee type of a pointer type."""
    return ctype[: ctype.rindex("*")].strip()


def _is_out_pointer(ctype: str) -> bool:
    return ("*" in ctype and not ctype.startswith("const ")) or ctype.endswith("**")


def _count_name(name: str) -> bool:
    low = name.lower()
    return low.endswith("count") or low.endswith("size")


def classify(
    name: str, params: list[tuple[str, str]], header: Header, legacy: dict[tuple[str, str], int]
) -> list[Role]:
    """The roles of a function's parameters, in order of first index."""
    roles: list[Role] = []
    taken: set[int] = set()
    scalars_seen = 0

    def where(i: int) -> str:
        return f"{name}: parameter {i} `{params[i][0]} {params[i][1]}`"

    # Count + arrays first: they claim their neighbours.
    for i, (ctype, pname) in enumerate(params):
        if i in taken:
            continue
        if name in NOT_ARRAYS:
            break
        after = params[i + 1] if i + 1 < len(params) else None
        before = params[i - 1] if i > 0 else None
        if ctype == "unsigned int *" and _count_name(pname):
            arrays = []
            j = i + 1
            while (
                j < len(params)
                and _is_out_pointer(params[j][0])
                and (j == i + 1 or params[j][1].endswith("s"))
            ):
                arrays.append(j)
                j += 1
            if (
                not arrays
                and before is not None
                and _is_out_pointer(before[0])
                and i - 1 not in taken
            ):
                arrays = [i - 1]
            if arrays:
                roles.append(_count_pointer_role(i, arrays, params))
                taken.update([i, *arrays])
        elif (
            _is_scalar(ctype, header)
            and _count_name(pname)
            and after is not None
            and _is_out_pointer(after[0])
        ):
            roles.append(_count_value_role(i, i + 1, params))
            taken.update([i, i + 1])

    devices = 0
    for i, (ctype, pname) in enumerate(params):
        if i in taken:
            continue
        a = f"a{i}"
        if ctype == "nvmlDevice_t":
            roles.append(
                Role(
                    [i],
                    [f"nvmlDevice_t {a};"],
                    1,
                    f"{a} = {'x->dev' if devices == 0 else 'x->peer'};",
                )
            )
            devices += 1
        elif ctype == "nvmlEventSet_t":
            roles.append(Role([i], [f"nvmlEventSet_t {a};"], 1, f"{a} = x->set;"))
        elif ctype in CONTEXT_HANDLES and not name.endswith("Free"):
            k = sum(1 for t, _ in params[:i] if t == ctype)
            roles.append(Role([i], [f"{ctype} {a};"], 1, f"{a} = {CONTEXT_HANDLES[ctype]}[{k}];"))
        elif ctype in header.handles:
            roles.append(Role([i], [f"{ctype} {a};"], 1, f"{a} = NULL;"))
        elif _is_scalar(ctype, header):
            nxt_prev = [params[k] for k in (i - 1,) if k >= 0]
            if pname.lower() in ("length", "size") and nxt_prev and nxt_prev[0][0] == "char *":
                continue  # the char buffer's role sets it
            if "timeout" in pname.lower():
                values = [0]
            else:
                values = WIDE if scalars_seen == 0 else NARROW
                scalars_seen += 1
            table = ", ".join(f"{v}ULL" for v in values)
            roles.append(
                Role(
                    [i],
                    [f"{ctype} {a};", f"static const unsigned long long s{i}[] = {{{table}}};"],
                    len(values),
                    f"{a} = ({ctype})s{i}[v];",
                )
            )
        elif ctype == "char *":
            length = params[i + 1] if i + 1 < len(params) else None
            if (
                length is not None
                and _is_scalar(length[0], header)
                and length[1].lower() in ("length", "size")
            ):
                table = ", ".join(str(n) for n in LENGTHS)
                roles.append(
                    Role(
                        [i, i + 1],
                        [
                            f"char *{a};",
                            f"{length[0]} a{i + 1};",
                            f"static const unsigned l{i}[] = {{{table}}};",
                        ],
                        len(LENGTHS),
                        f"a{i + 1} = l{i}[v]; {a} = guard_buf(l{i}[v]);",
                        pointers=[i],
                    )
                )
            elif (name, pname) in FIXED_SIZES:
                roles.append(
                    Role(
                        [i],
                        [f"char *{a};"],
                        1,
                        f"{a} = guard_buf({FIXED_SIZES[(name, pname)]});",
                        pointers=[i],
                    )
                )
            else:
                raise Unclassified(
                    f"{where(i)}: a char buffer with no length; add it to FIXED_SIZES"
                )
        elif ctype == "const char *":
            source = {"uuid": "x->uuid", "serial": "x->serial", "pcibusid": "x->bus_id"}.get(
                pname.lower(), '""'
            )
            roles.append(Role([i], [f"const char *{a};"], 1, f"{a} = {source};"))
        elif "*" in ctype:
            roles.append(_struct_role(name, i, ctype, pname, header, legacy))
        else:
            raise Unclassified(f"{where(i)}: unknown type")
    roles.sort(key=lambda r: r.indices[0])
    return roles


def _count_pointer_role(i: int, arrays: list[int], params: list[tuple[str, str]]) -> Role:
    """``*count`` in/out with its arrays: a size query, then exactly the
    total, one fewer (INSUFFICIENT_SIZE), one more, and a count with no
    array (the size query's other spelling)."""
    decls = [f"unsigned int *a{i};"] + [f"{params[j][0]} a{j};" for j in arrays]
    alloc = " ".join(
        f"a{j} = n == 0 && v == 4 ? NULL : guard_buf((size_t)n * sizeof *a{j});" for j in arrays
    )
    setup = (
        "unsigned n = v == 0 ? 0 : v == 1 ? total : v == 2 ? (total ? total - 1 : 0) "
        ": v == 3 ? total + 1 : total; "
        f"a{i} = guard_buf(sizeof *a{i}); *a{i} = v == 4 ? n + 1 : n; "
        + (" ".join(f"a{j} = NULL;" for j in arrays) + " if (v != 0 && v != 4) { " + alloc + " }")
    )
    query = f"unsigned int q = 0; a{i} = &q; " + " ".join(f"a{j} = NULL;" for j in arrays)
    return Role([i, *arrays], decls, 5, setup, pointers=[i, *arrays], query=(query, "q"))


def _count_value_role(i: int, j: int, params: list[tuple[str, str]]) -> Role:
    """An element count passed by value with its array (cpuSetSize, cpuSet)."""
    table = ", ".join(str(n) for n in SIZES_BY_VALUE)
    init = ""
    if params[j][0] == "nvmlFieldValue_t *":
        init = f" for (unsigned k = 0; k < z{i}[v]; k++) a{j}[k].fieldId = k;"
    return Role(
        [i, j],
        [
            f"{params[i][0]} a{i};",
            f"{params[j][0]} a{j};",
            f"static const unsigned z{i}[] = {{{table}}};",
        ],
        len(SIZES_BY_VALUE),
        f"a{i} = ({params[i][0]})z{i}[v]; a{j} = guard_buf((size_t)z{i}[v] * sizeof *a{j});{init}",
        pointers=[j],
    )


def _struct_role(
    name: str, i: int, ctype: str, pname: str, header: Header, legacy: dict[tuple[str, str], int]
) -> Role:
    a = f"a{i}"
    elem = _elem(ctype)
    if (name, pname) in legacy:
        size = legacy[(name, pname)]
        return Role([i], [f"{ctype} {a};"], 1, f"{a} = guard_buf({size});", pointers=[i])
    if (name, pname) in FIXED_SIZES:
        return Role(
            [i],
            [f"{ctype} {a};"],
            1,
            f"{a} = guard_buf({FIXED_SIZES[(name, pname)]});",
            pointers=[i],
        )
    if elem in ("void", "const void"):
        raise Unclassified(f"{name}: `{ctype} {pname}`: an untyped buffer; add it to FIXED_SIZES")
    versions = header.versions(elem.replace("const ", ""))
    embedded = [header.resolve(t) for _, t in versions or []]
    for chain in embedded:
        for t in chain:
            if t in EMBEDDED_ARRAYS and len(versions) == 1:
                return _embedded_role(i, ctype, versions[0][1], *EMBEDDED_ARRAYS[t])
    init = next((STRUCT_INIT[t] for t in header.resolve(elem) if t in STRUCT_INIT), "")
    if init:
        init = f" {{ {elem} *p = {a}; {init} }}"
    if versions:
        # Every version the entry point may be handed, then a bad one (0)
        # in the largest record: that one must not be written at all.
        sizes = ", ".join(f"sizeof({t})" for _, t in versions)
        tags = ", ".join(
            PLAIN_VERSIONS.get(t) or f"nvml{re.sub(r'^nvml|_t$', '', t)}" for _, t in versions
        )
        n = len(versions)
        setup = (
            f"static const size_t sz{i}[] = {{{sizes}}}; "
            f"static const unsigned ver{i}[] = {{{tags}}}; "
            f"size_t big{i} = 0; "
            f"for (unsigned k = 0; k < {n}; k++) if (sz{i}[k] > big{i}) big{i} = sz{i}[k]; "
            f"{a} = guard_buf(v < {n} ? sz{i}[v] : big{i}); "
            f"*(unsigned *)(void *){a} = v < {n} ? ver{i}[v] : 0;{init}"
        )
        return Role([i], [f"{ctype} {a};"], n + 1, setup, pointers=[i])
    return Role([i], [f"{ctype} {a};"], 1, f"{a} = guard_buf(sizeof *{a});{init}", pointers=[i])


def _embedded_role(i: int, ctype: str, struct: str, count: str, array: str) -> Role:
    """A versioned record with its own count and array members: a size
    query, then exactly the total, one fewer, one more, a count with no
    array, and a wrong version."""
    a = f"a{i}"
    tag = f"nvml{re.sub(r'^nvml|_t$', '', struct)}"
    query = (
        f"{a} = guard_buf(sizeof *{a}); {a}->version = {tag}; {a}->{count} = 0; "
        f"{a}->{array} = NULL;"
    )
    setup = (
        "unsigned n = v == 0 ? 0 : v == 1 ? total : v == 2 ? (total ? total - 1 : 0) "
        ": v == 3 ? total + 1 : total; "
        f"{a} = guard_buf(sizeof *{a}); {a}->version = v == 5 ? 0 : {tag}; "
        f"{a}->{count} = v == 4 ? n + 1 : n; "
        f"{a}->{array} = v == 0 || v == 4 ? NULL : guard_buf((size_t)n * sizeof *{a}->{array});"
    )
    return Role([i], [f"{ctype} {a};"], 6, setup, pointers=[i], query=(query, f"{a}->{count}"))


# --------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------


def render_sweep(
    name: str, params: list[tuple[str, str]], header: Header, legacy: dict[tuple[str, str], int]
) -> str:
    roles = classify(name, params, header, legacy)
    args = ", ".join(f"a{i}" for i in range(len(params)))
    call = f"(void){name}({args});"
    if name in RELEASE:
        out_name, free = RELEASE[name]
        (out,) = [i for i, (_, p) in enumerate(params) if p == out_name]
        call = f"if ({name}({args}) == NVML_SUCCESS) {free}(*a{out});"
    lines = [f"static void sweep_{name}(const struct guard_ctx *x)", "{", "    (void)x;"]
    for role in roles:
        lines.extend(f"    {d}" for d in role.decls)
    pointers = [p for role in roles for p in role.pointers]
    lines.append("    unsigned variant = 0;")
    lines.append(f"    for (int nul = -1; nul < {len(pointers)}; nul++) {{")
    # NULL passes run the first combination only.
    loops = []
    for k, role in enumerate(roles):
        loops.append(f"for (unsigned v{k} = 0; v{k} < (nul < 0 ? {role.variants}u : 1u); v{k}++)")
    lines.append("        " + " ".join(loops) + " {" if loops else "        {")
    # Roles with a size query go last: the query needs every other argument.
    ordered = sorted(enumerate(roles), key=lambda kr: kr[1].query is not None)
    for k, role in ordered:
        lines.append("            {")
        lines.append(f"                unsigned v = v{k};")
        if role.query is not None:
            prepare, total = role.query
            lines.append("                unsigned total = 0;")
            lines.append("                {")
            lines.append(f"                    {prepare}")
            lines.append(f'                    guard_call("{name}", variant);')
            lines.append(f"                    {call}")
            lines.append(f"                    total = {total} > 4096 ? 4096 : {total};")
            lines.append("                }")
        lines.append(f"                {role.setup}")
        lines.append("            }")
    for p_index, p in enumerate(pointers):
        lines.append(f"            if (nul == {p_index}) a{p} = NULL;")
    lines.append(f'            guard_call("{name}", variant++);')
    lines.append(f"            {call}")
    lines.append("            guard_release();")
    lines.append("        }")
    lines.append("    }")
    lines.append("}")
    return "\n".join(lines)


def render(
    names: list[str], prototypes: dict, header: Header, legacy: dict[tuple[str, str], int]
) -> tuple[str, list[str]]:
    """The generated C file, and the problems of functions it cannot sweep."""
    out = [
        "/* Generated by tests/nvml_guard_support.py from nvml.h: do not edit. */",
        "#include <stddef.h>",
        '#include "nvml_guard_harness.h"',
        "",
        '#pragma GCC diagnostic ignored "-Wunused-variable"',
        "",
    ]
    exports = load_target("nvml")._exports()
    # Names the header does not declare (nvmlInternalGetExportTable).
    for extra, (returns, params) in sorted(exports.EXTRA_PROTOTYPES.items()):
        out.append(f"{returns} {extra}({params});")
    problems: list[str] = []
    swept: list[str] = []
    params_of = exports.parameters
    for name in names:
        if name in FRAME:
            continue
        proto = prototypes[name]
        try:
            out.append(render_sweep(name, params_of(proto.params), header, legacy))
        except (Unclassified, ValueError) as exc:
            problems.append(str(exc))
            continue
        out.append("")
        swept.append(name)
    out.append("const struct guard_sweep GUARD_SWEEPS[] = {")
    out.extend(f'    {{"{n}", sweep_{n}}},' for n in swept)
    out.append("};")
    out.append("const size_t GUARD_SWEEP_COUNT = sizeof GUARD_SWEEPS / sizeof *GUARD_SWEEPS;")
    out.append("const char *const GUARD_FRAME[] = {" + ", ".join(f'"{n}"' for n in FRAME) + "};")
    out.append("const size_t GUARD_FRAME_COUNT = sizeof GUARD_FRAME / sizeof *GUARD_FRAME;")
    return "\n".join(out) + "\n", problems


@dataclass(frozen=True)
class Harness:
    binary: Path
    implemented: frozenset[str]
    problems: tuple[str, ...]


def build(native: Path, out_dir: Path, legacy: dict[tuple[str, str], int] | None = None) -> Harness:
    """Generate the sweeps for what the library in ``native`` implements and
    link the harness against it.  ``legacy`` replaces LEGACY_SIZES (the
    harness's own test sizes a buffer too small on purpose)."""
    cc = compiler()
    target = load_target("nvml")
    exports = target._exports()
    header_path = exports.find_header()
    sources = [target.HERE / s for s in target.SOURCES]
    surface = exports.surface(header_path, cc, sources)
    header = read_header(header_path, cc, header_path.read_text())
    generated, problems = render(
        sorted(surface.implemented),
        surface.prototypes,
        header,
        LEGACY_SIZES if legacy is None else legacy,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    source = out_dir / "nvml_guard_calls.c"
    source.write_text(generated)
    binary = out_dir / "nvml_guard"
    result = subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-O1",
            "-g",
            "-Wall",
            "-Werror",
            "-DNVML_NO_UNVERSIONED_FUNC_DEFS",
            f"-I{header_path.parent}",
            f"-I{HERE}",
            str(RUNTIME),
            str(source),
            "-o",
            str(binary),
            f"-L{native}",
            "-l:libnvidia-ml.so.1",
            f"-Wl,-rpath,{native}",
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"the guard harness ({source}) does not compile:\n{result.stderr[-6000:]}"
        )
    return Harness(binary=binary, implemented=surface.implemented, problems=tuple(problems))


def covered(stdout: str) -> set[str]:
    """The functions a harness run reports it swept or called itself."""
    return {
        line.split()[1] for line in stdout.splitlines() if line.startswith(("SWEEP ", "FRAME "))
    }
