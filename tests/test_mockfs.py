"""libmockfs.so, the LD_PRELOAD shim: real lspci, Python and a C probe that
calls every hooked entry point see the staged mock PCI tree instead of the
host's, other paths stay real, and over-long paths fail closed."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import pytest

from mokka import layout
from mokka.noderoot.host import Host
from mokka.simulators.pcibus import PcibusSettings, PcibusSimulator
from mokka.state.compile import compile_profile
from tests.support import require_tool, snapshot
from tests.test_pcibus import H100_BDFS, H100_SWITCHES, build_mockfs, h100_state

GPU = "/sys/bus/pci/devices/0000:1a:00.0"
GPU_REAL = "/sys/devices/pci0000:00/0000:00:05.0/0000:1a:00.0"


@pytest.fixture(scope="session")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mockfs(tmp_path_factory.mktemp("mockfs"))


@pytest.fixture
async def mock_root(host: Host, node_root: Path, shim: Path,
                    monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Path]:
    """An H100 tree staged by the simulator; yields the directory standing for ``/``.

    Teardown discards it and checks the node root is back byte for byte.
    """
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(shim.parent))
    before = snapshot(node_root)
    sim = PcibusSimulator(PcibusSettings(fallback_cpus=8))
    await sim.stage(host, h100_state())
    yield node_root / layout.STATE_ROOT.lstrip("/")
    await sim.revoke(host)
    await sim.discard(host)
    assert snapshot(node_root) == before


def run(argv: list[str], shim: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a real client, preloading the shim when given; env values override."""
    environ = {k: v for k, v in os.environ.items()
               if k not in ("LD_PRELOAD", "MOKKA_MOCKFS_ROOT", "MOKKA_MOCKFS_PREFIXES",
                            "MOCK_PCI_ROOT", "MOKKA_MOCKFS_DEBUG")}
    if shim is not None:
        environ["LD_PRELOAD"] = str(shim)
    environ.update(env)
    return subprocess.run(argv, capture_output=True, text=True, env=environ, check=False,
                          timeout=120)


def expected_lspci_n() -> list[str]:
    """``lspci -n`` lines of the staged H100 tree (bridges, switches, GPUs)."""
    lines = [f"00:{d:02x}.0 0604: 1000:c030" for d in range(1, 9)]
    lines += [f"80:{d:02x}.0 0604: 1000:c030" for d in range(1, 5)]
    lines += [f"{b[5:]} 0680: 10de:22a3" for b in H100_SWITCHES]
    lines += [f"{b[5:]} 0302: 10de:2330" for b in H100_BDFS]
    return sorted(lines)


# --------------------------------------------------------------------------
# Real lspci
# --------------------------------------------------------------------------


async def test_plain_lspci_sees_the_mock_and_none_of_the_host(mock_root: Path, shim: Path) -> None:
    lspci = require_tool("lspci")
    host_view = run([lspci, "-n"])
    assert host_view.returncode == 0, host_view.stderr
    mocked = run([lspci, "-n"], shim, MOKKA_MOCKFS_ROOT=str(mock_root))
    assert mocked.returncode == 0, mocked.stderr
    lines = mocked.stdout.splitlines()
    assert sorted(lines) == expected_lspci_n()
    assert not set(lines) & set(host_view.stdout.splitlines())

    named = run([lspci, "-nn", "-vv", "-s", "ca:00.0"], shim, MOKKA_MOCKFS_ROOT=str(mock_root))
    assert "NVIDIA Corporation GH100[H100 SXM5 80GB] [10de:2330]" in named.stdout
    assert "NUMA node: 1" in named.stdout
    assert "Kernel driver in use: nvidia" in named.stdout
    tree = run([lspci, "-t"], shim, MOKKA_MOCKFS_ROOT=str(mock_root))
    assert "\\-[0000:80]-+-01.0-[8a]----00.0" in tree.stdout


async def test_preloaded_lspci_matches_the_sysfs_path_view(
    host: Host, node_root: Path, shim: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The built-in GB200 profile: the same listing through the shim as through libpci's option."""
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(shim.parent))
    before = snapshot(node_root)
    sim = PcibusSimulator(PcibusSettings(fallback_cpus=4))
    await sim.stage(host, compile_profile("gb200", node_name="node-a"))
    mock = node_root / layout.STATE_ROOT.lstrip("/")
    lspci = require_tool("lspci")
    for args in (["-D", "-nn"], ["-t", "-v"], ["-vv"]):
        direct = run([lspci, "-A", "linux-sysfs", "-O", f"sysfs.path={mock}/sys/bus/pci", *args])
        preloaded = run([lspci, *args], shim, MOKKA_MOCKFS_ROOT=str(mock))
        assert direct.returncode == preloaded.returncode == 0, preloaded.stderr
        assert preloaded.stdout == direct.stdout
        assert "0018:01:00.0" in preloaded.stdout or "[0018:00]" in preloaded.stdout
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_mock_pci_root_still_works(mock_root: Path, shim: Path) -> None:
    """The older variable points at the directory standing for /sys."""
    lspci = require_tool("lspci")
    mocked = run([lspci, "-n"], shim, MOCK_PCI_ROOT=str(mock_root / "sys"))
    assert mocked.returncode == 0, mocked.stderr
    assert sorted(mocked.stdout.splitlines()) == expected_lspci_n()
    # It covers the PCI prefixes only: the rest of /sys is the host's.
    listing = python_ops(shim, ["listdir /sys/class/net", f"realpath {GPU}"],
                         MOCK_PCI_ROOT=str(mock_root / "sys"))
    assert listing["listdir /sys/class/net"] == sorted(os.listdir("/sys/class/net"))
    assert listing[f"realpath {GPU}"] == GPU_REAL


async def test_inert_without_a_root(shim: Path) -> None:
    lspci = require_tool("lspci")
    assert run([lspci, "-n"], shim).stdout == run([lspci, "-n"]).stdout


# --------------------------------------------------------------------------
# Python in a preloaded subprocess
# --------------------------------------------------------------------------

_PY_OPS = r"""
import json, os, sys
out = {}
for op in sys.argv[1:]:
    verb, _, path = op.partition(" ")
    try:
        if verb == "listdir":
            out[op] = sorted(os.listdir(path))
        elif verb == "read":
            with open(path) as f:
                out[op] = f.read()
        elif verb == "readlink":
            out[op] = os.readlink(path)
        elif verb == "stat":
            out[op] = os.stat(path).st_size
        elif verb == "realpath":
            out[op] = os.path.realpath(path)
    except OSError as exc:
        out[op] = "errno %d" % exc.errno
print(json.dumps(out))
"""


def python_ops(shim: Path | None, ops: list[str], **env: str) -> dict[str, object]:
    result = run([sys.executable, "-c", _PY_OPS, *ops], shim, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


async def test_python_sees_the_mock(mock_root: Path, shim: Path) -> None:
    ops = ["listdir /sys/bus/pci/devices", f"read {GPU}/vendor", f"read {GPU}/numa_node",
           f"readlink {GPU}", f"stat {GPU}/config", f"realpath {GPU}",
           "listdir /sys/bus/pci/drivers/nvidia", "listdir /sys/devices/pci0000:80",
           # '..' before the prefix is complete cannot slip past the shim.
           "listdir /sys/class/../bus/pci/devices",
           # '..' after a link resolves inside the mock, as on a real host.
           f"read {GPU}/../class"]
    seen = python_ops(shim, ops, MOKKA_MOCKFS_ROOT=str(mock_root))
    mock_bdfs = sorted(os.listdir(mock_root / "sys/bus/pci/devices"))
    assert seen["listdir /sys/bus/pci/devices"] == mock_bdfs
    assert len(mock_bdfs) == 24
    assert seen[f"read {GPU}/vendor"] == "0x10de\n"
    assert seen[f"read {GPU}/numa_node"] == "0\n"
    assert seen[f"readlink {GPU}"] == "../../../devices/pci0000:00/0000:00:05.0/0000:1a:00.0"
    assert seen[f"stat {GPU}/config"] == 256
    assert seen[f"realpath {GPU}"] == GPU_REAL
    assert seen["listdir /sys/bus/pci/drivers/nvidia"] == sorted(H100_BDFS + H100_SWITCHES)
    assert seen["listdir /sys/devices/pci0000:80"] == [f"0000:80:0{d}.0" for d in range(1, 5)]
    assert seen["listdir /sys/class/../bus/pci/devices"] == mock_bdfs
    assert seen[f"read {GPU}/../class"] == "0x060400\n"  # the parent bridge


async def test_paths_outside_the_prefixes_stay_real(mock_root: Path, shim: Path) -> None:
    ops = ["listdir /sys/class/net", "listdir /sys/devices", "listdir /sys/devices/pci0000:00",
           "listdir /sys/bus", "read /proc/self/comm"]
    real = python_ops(None, ops)
    assert real["listdir /sys/class/net"]  # the host has at least a loopback device
    default = python_ops(shim, ops, MOKKA_MOCKFS_ROOT=str(mock_root))
    for op in ("listdir /sys/class/net", "listdir /sys/devices", "listdir /sys/bus"):
        assert default[op] == real[op], op
    # Only /sys/bus/pci listed: /sys/devices/pci0000:00 is the host's again.
    narrowed = python_ops(shim, ops, MOKKA_MOCKFS_ROOT=str(mock_root),
                          MOKKA_MOCKFS_PREFIXES="/sys/bus/pci")
    assert narrowed == real
    assert default["listdir /sys/devices/pci0000:00"] != real["listdir /sys/devices/pci0000:00"]
    # No prefixes at all: everything is real.
    none = python_ops(shim, ["listdir /sys/bus/pci/devices"], MOKKA_MOCKFS_ROOT=str(mock_root),
                      MOKKA_MOCKFS_PREFIXES="")
    assert none == python_ops(None, ["listdir /sys/bus/pci/devices"])


async def test_infiniband_prefixes_are_covered_by_default(tmp_path: Path, shim: Path) -> None:
    root = tmp_path / "ib-root"
    (root / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    (root / "dev/infiniband").mkdir(parents=True)
    (root / "dev/infiniband/uverbs0").write_text("")
    seen = python_ops(shim, ["listdir /sys/class/infiniband", "listdir /dev/infiniband",
                             "listdir /sys/class/infiniband_verbs"],
                      MOKKA_MOCKFS_ROOT=str(root))
    assert seen == {"listdir /sys/class/infiniband": ["mlx5_0"],
                    "listdir /dev/infiniband": ["uverbs0"],
                    "listdir /sys/class/infiniband_verbs": f"errno {errno.ENOENT}"}
    # A custom list with globs: these two trees only, PCI stays the host's.
    ops = ["listdir /sys/class/infiniband", "listdir /dev/infiniband",
           "listdir /sys/bus/pci/devices"]
    custom = python_ops(shim, ops, MOKKA_MOCKFS_ROOT=str(root),
                        MOKKA_MOCKFS_PREFIXES="/sys/class/infini?and*::/dev/infiniband/")
    real = python_ops(None, ops)
    assert custom["listdir /sys/class/infiniband"] == ["mlx5_0"]
    assert custom["listdir /dev/infiniband"] == ["uverbs0"]
    assert custom["listdir /sys/bus/pci/devices"] == real["listdir /sys/bus/pci/devices"]


async def test_over_long_paths_fail_closed(mock_root: Path, shim: Path) -> None:
    # A root so long that no redirected path fits in PATH_MAX.
    long_root = "/" + "/".join(["r" * 250] * 17)
    ops = ["listdir /sys/bus/pci/devices", f"read {GPU}/vendor", "stat /sys/bus/pci",
           f"readlink {GPU}", "listdir /sys/class/net"]
    real = python_ops(None, ops)
    assert isinstance(real["listdir /sys/bus/pci/devices"], list)  # the host's view exists
    seen = python_ops(shim, ops, MOKKA_MOCKFS_ROOT=long_root)
    too_long = f"errno {errno.ENAMETOOLONG}"
    for op in ops[:4]:
        assert seen[op] == too_long, op
    assert seen["listdir /sys/class/net"] == real["listdir /sys/class/net"]
    # A short root but a path that no longer fits once prefixed.
    deep = "/sys/bus/pci/" + "/".join(["d" * 200] * 20)
    assert len(deep) < 4096 < len(deep) + len(str(mock_root))
    assert python_ops(shim, [f"stat {deep}"], MOKKA_MOCKFS_ROOT=str(mock_root)) == {
        f"stat {deep}": too_long}
    # lspci fails instead of falling back to the host's devices: sysfs and
    # /proc/bus/pci both fail, and port I/O is refused.
    lspci = run([require_tool("lspci"), "-n"], shim, MOKKA_MOCKFS_ROOT=long_root)
    assert lspci.returncode != 0
    assert lspci.stdout == ""
    assert "Cannot find any working access method" in lspci.stderr


async def test_an_empty_bus_lists_nothing(host: Host, node_root: Path, shim: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A state without PCI devices leaves an empty bus, never the host's."""
    monkeypatch.setenv("MOKKA_NATIVE_DIR", str(shim.parent))
    before = snapshot(node_root)
    sim = PcibusSimulator(PcibusSettings(fallback_cpus=1))
    await sim.stage(host, attrs.evolve(h100_state(), gpus=(), pcie_roots=(), nvlink=None))
    mock_root = node_root / layout.STATE_ROOT.lstrip("/")
    lspci = require_tool("lspci")
    for env in ({"MOKKA_MOCKFS_ROOT": str(mock_root)}, {"MOCK_PCI_ROOT": str(mock_root / "sys")}):
        result = run([lspci, "-n"], shim, **env)
        assert (result.returncode, result.stdout) == (0, ""), result.stderr
    # A root with no tree at all fails (both conventions) rather than show the host.
    for env in ({"MOKKA_MOCKFS_ROOT": str(node_root / "nowhere")},
                {"MOCK_PCI_ROOT": str(node_root / "nowhere")}):
        result = run([lspci, "-n"], shim, **env)
        assert result.returncode != 0, env
        assert result.stdout == "", env
    await sim.discard(host)
    assert snapshot(node_root) == before


async def test_relative_root_is_refused(shim: Path) -> None:
    seen = run([sys.executable, "-c", _PY_OPS, "listdir /sys/bus/pci/devices"], shim,
               MOKKA_MOCKFS_ROOT="relative/root")
    assert json.loads(seen.stdout) == {"listdir /sys/bus/pci/devices": f"errno {errno.EINVAL}"}
    assert "MOKKA_MOCKFS_ROOT is not an absolute path" in seen.stderr


# --------------------------------------------------------------------------
# Every hook, from C
# --------------------------------------------------------------------------

_PROBE = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEV "/sys/bus/pci/devices/0000:1a:00.0"
#define LIST "/sys/bus/pci/devices"
#if defined(__x86_64__)
#define STAT_VER 1
#else
#define STAT_VER 0
#endif

/* Entry points headers no longer declare (or only under _FORTIFY_SOURCE):
 * looked up like the dynamic linker would bind them, preload first. */
#define SYM(type, name) ((type)dlsym(RTLD_DEFAULT, name))
typedef int (*open2_t)(const char *, int);
typedef int (*openat2_t)(int, const char *, int);
typedef int (*xstat_t)(int, const char *, struct stat *);
typedef int (*fxstatat_t)(int, int, const char *, struct stat *, int);
typedef ssize_t (*readlink_chk_t)(const char *, char *, size_t, size_t);
typedef char *(*realpath_chk_t)(const char *, char *, size_t);
typedef int (*ioperm_t)(unsigned long, unsigned long, int);

static void fd_line(const char *name, int fd)
{
    if (fd < 0) { printf("%s: errno %d\n", name, errno); return; }
    char buf[64] = {0};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0 && buf[n - 1] == '\n') buf[n - 1] = '\0';
    printf("%s: %s\n", name, buf);
}

static void file_line(const char *name, FILE *f)
{
    if (f == NULL) { printf("%s: errno %d\n", name, errno); return; }
    char buf[128] = {0};
    if (fgets(buf, sizeof buf, f) != NULL) buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
    printf("%s: %s\n", name, buf);
}

static void rc_line(const char *name, int rc, long value)
{
    if (rc < 0) printf("%s: errno %d\n", name, errno);
    else printf("%s: %ld\n", name, value);
}

/* The call runs before its result is read (argument order is unspecified). */
#define RC(name, call, value)                                                  \
    do {                                                                       \
        int rc_ = (call);                                                      \
        rc_line(name, rc_, (long)(value));                                     \
    } while (0)

static void *worker(void *arg)
{
    long ok = 0, rounds = (long)arg;
    for (long i = 0; i < rounds; i++) {
        char buf[8] = {0};
        int fd = open(DEV "/vendor", O_RDONLY);
        if (fd >= 0 && read(fd, buf, 6) == 6 && memcmp(buf, "0x10de", 6) == 0) ok++;
        if (fd >= 0) close(fd);
    }
    return (void *)ok;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    struct stat st;
    struct stat64 st64;
    struct statx stx;
    char buf[4096];

    fd_line("open", open(DEV "/vendor", O_RDONLY));
    fd_line("open64", open64(DEV "/vendor", O_RDONLY));
    fd_line("openat", openat(AT_FDCWD, DEV "/vendor", O_RDONLY));
    fd_line("openat64", openat64(AT_FDCWD, DEV "/vendor", O_RDONLY));
    fd_line("__open_2", SYM(open2_t, "__open_2")(DEV "/vendor", O_RDONLY));
    fd_line("__open64_2", SYM(open2_t, "__open64_2")(DEV "/vendor", O_RDONLY));
    fd_line("__openat_2", SYM(openat2_t, "__openat_2")(AT_FDCWD, DEV "/vendor", O_RDONLY));
    fd_line("__openat64_2", SYM(openat2_t, "__openat64_2")(AT_FDCWD, DEV "/vendor", O_RDONLY));
    int dirfd = open(DEV, O_RDONLY | O_DIRECTORY);
    fd_line("openat-relative", openat(dirfd, "device", O_RDONLY));
    close(dirfd);
    file_line("fopen", fopen(DEV "/resource", "r"));
    file_line("fopen64", fopen64(DEV "/numa_node", "r"));

    DIR *dir = opendir(LIST);
    long entries = 0;
    if (dir != NULL) {
        struct dirent *e;
        while ((e = readdir(dir)) != NULL) entries += e->d_name[0] != '.';
        closedir(dir);
    }
    rc_line("opendir", dir == NULL ? -1 : 0, entries);
    struct dirent **names;
    int n = scandir(LIST, &names, NULL, alphasort);
    rc_line("scandir", n, n);
    for (int i = 0; i < n; i++) free(names[i]);
    if (n >= 0) free(names);
    struct dirent64 **names64;
    n = scandir64(LIST, &names64, NULL, alphasort64);
    rc_line("scandir64", n, n);
    for (int i = 0; i < n; i++) free(names64[i]);
    if (n >= 0) free(names64);

    RC("stat", stat(DEV "/config", &st), (long)st.st_size);
    RC("lstat", lstat(DEV, &st), (long)S_ISLNK(st.st_mode));
    RC("fstatat", fstatat(AT_FDCWD, DEV "/config", &st, 0), (long)st.st_size);
    RC("stat64", stat64(DEV "/config", &st64), (long)st64.st_size);
    RC("lstat64", lstat64(DEV, &st64), (long)S_ISLNK(st64.st_mode));
    RC("fstatat64", fstatat64(AT_FDCWD, DEV "/config", &st64, 0), (long)st64.st_size);
    RC("statx", statx(AT_FDCWD, DEV "/config", 0, STATX_SIZE, &stx), (long)stx.stx_size);
    RC("__xstat", SYM(xstat_t, "__xstat")(STAT_VER, DEV "/config", &st), (long)st.st_size);
    RC("__lxstat", SYM(xstat_t, "__lxstat")(STAT_VER, DEV, &st), (long)S_ISLNK(st.st_mode));
    RC("__fxstatat", SYM(fxstatat_t, "__fxstatat")(STAT_VER, AT_FDCWD, DEV "/config", &st, 0),
            (long)st.st_size);
    RC("__xstat64", SYM(xstat_t, "__xstat64")(STAT_VER, DEV "/config", &st), (long)st.st_size);
    RC("__lxstat64", SYM(xstat_t, "__lxstat64")(STAT_VER, DEV, &st), (long)S_ISLNK(st.st_mode));
    RC("__fxstatat64", SYM(fxstatat_t, "__fxstatat64")(STAT_VER, AT_FDCWD, DEV "/config", &st, 0),
            (long)st.st_size);

    RC("access", access(DEV "/vendor", R_OK), 0);
    RC("faccessat", faccessat(AT_FDCWD, DEV "/vendor", R_OK, 0), 0);

    ssize_t len = readlink(DEV, buf, sizeof buf - 1);
    if (len >= 0) buf[len] = '\0';
    printf("readlink: %s\n", len < 0 ? strerror(errno) : buf);
    len = readlinkat(AT_FDCWD, DEV "/driver", buf, sizeof buf - 1);
    if (len >= 0) buf[len] = '\0';
    printf("readlinkat: %s\n", len < 0 ? strerror(errno) : buf);
    len = SYM(readlink_chk_t, "__readlink_chk")(DEV, buf, sizeof buf - 1, sizeof buf);
    if (len >= 0) buf[len] = '\0';
    printf("__readlink_chk: %s\n", len < 0 ? strerror(errno) : buf);

    char *r = realpath(DEV, buf);
    printf("realpath: %s\n", r ? r : strerror(errno));
    r = realpath(DEV "/driver", NULL);
    printf("realpath-malloc: %s\n", r ? r : strerror(errno));
    free(r);
    r = SYM(realpath_chk_t, "__realpath_chk")(DEV, buf, sizeof buf);
    printf("__realpath_chk: %s\n", r ? r : strerror(errno));
    r = canonicalize_file_name(DEV "/..");
    printf("canonicalize_file_name: %s\n", r ? r : strerror(errno));
    free(r);

    RC("chdir", chdir(DEV), 0);
    fd_line("open-after-chdir", open("subsystem_device", O_RDONLY));

    /* Port I/O (libpci's last fallback) is refused by the shim itself. */
    Dl_info info;
    void *ioperm_fn = dlsym(RTLD_DEFAULT, "ioperm");
    if (ioperm_fn != NULL && dladdr(ioperm_fn, &info) && info.dli_fname != NULL)
        printf("ioperm-from: %s\n", strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1
                                                                  : info.dli_fname);
    if (ioperm_fn != NULL) {
        int io = ((ioperm_t)ioperm_fn)(0xcf8, 8, 1);
        printf("ioperm: %s\n", io < 0 ? strerror(errno) : "granted");
    }

    pthread_t threads[8];
    for (int i = 0; i < 8; i++) pthread_create(&threads[i], NULL, worker, (void *)rounds);
    long ok = 0;
    for (int i = 0; i < 8; i++) {
        void *got;
        pthread_join(threads[i], &got);
        ok += (long)got;
    }
    printf("threads: %ld\n", ok);
    return 0;
}
"""


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("probe")
    (out / "probe.c").write_text(_PROBE)
    subprocess.run([require_tool("cc"), "-O0", "-g", "-Wall", "-Werror", "-pthread", "-o",
                    str(out / "probe"), str(out / "probe.c"), "-ldl"], check=True)
    return out / "probe"


def probe_expectations(rounds: int) -> dict[str, str]:
    link = "../../../devices/pci0000:00/0000:00:05.0/0000:1a:00.0"
    zero = "0x0000000000000000 0x0000000000000000 0x0000000000000000"
    expected = {name: "0x10de" for name in (
        "open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2",
        "__openat64_2")}
    expected |= {"openat-relative": "0x2330", "fopen": zero, "fopen64": "0",
                 "opendir": "24", "scandir": "26", "scandir64": "26"}
    expected |= {name: "256" for name in ("stat", "fstatat", "stat64", "fstatat64", "statx",
                                          "__xstat", "__fxstatat", "__xstat64", "__fxstatat64")}
    expected |= {name: "1" for name in ("lstat", "lstat64", "__lxstat", "__lxstat64")}
    expected |= {"access": "0", "faccessat": "0", "readlink": link,
                 "readlinkat": "../../../../bus/pci/drivers/nvidia", "__readlink_chk": link,
                 "realpath": GPU_REAL, "realpath-malloc": "/sys/bus/pci/drivers/nvidia",
                 "__realpath_chk": GPU_REAL,
                 "canonicalize_file_name": "/sys/devices/pci0000:00/0000:00:05.0",
                 "chdir": "0", "open-after-chdir": "0x16c1", "threads": str(8 * rounds),
                 "ioperm-from": "libmockfs.so", "ioperm": "Operation not permitted"}
    return expected


def parse_probe(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines())


async def test_every_hook_redirects(mock_root: Path, shim: Path, probe: Path) -> None:
    unshimmed = parse_probe(run([str(probe), "10"]).stdout)
    # Without the shim none of these paths exist on this host (no such GPU).
    assert unshimmed["open"] == f"errno {errno.ENOENT}"
    assert unshimmed["threads"] == "0"
    assert unshimmed.get("ioperm-from") != "libmockfs.so"

    result = run([str(probe), "500"], shim, MOKKA_MOCKFS_ROOT=str(mock_root))
    assert result.returncode == 0, result.stderr
    assert parse_probe(result.stdout) == probe_expectations(500)


async def test_every_hook_is_clean_under_valgrind(mock_root: Path, shim: Path,
                                                  probe: Path) -> None:
    valgrind = require_tool("valgrind")
    result = run([valgrind, "--error-exitcode=99", "--leak-check=no", "-q", str(probe), "20"],
                 shim, MOKKA_MOCKFS_ROOT=str(mock_root))
    assert result.returncode == 0, result.stderr
    assert parse_probe(result.stdout) == probe_expectations(20)


def test_only_hooks_are_exported(shim: Path) -> None:
    nm = require_tool("nm")
    symbols = run([nm, "-D", "--defined-only", str(shim)]).stdout.split()
    exported = set(symbols[2::3])
    assert exported == {
        "open", "open64", "openat", "openat64", "__open_2", "__open64_2", "__openat_2",
        "__openat64_2", "fopen", "fopen64", "opendir", "scandir", "scandir64", "stat", "lstat",
        "fstatat", "stat64", "lstat64", "fstatat64", "statx", "__xstat", "__lxstat",
        "__fxstatat", "__xstat64", "__lxstat64", "__fxstatat64", "access", "faccessat",
        "readlink", "readlinkat", "__readlink_chk", "__readlinkat_chk", "chdir", "realpath",
        "__realpath_chk", "canonicalize_file_name", "ioperm", "iopl",
    }
