"""The boards' MIG profile tables: what each MIG-capable board can be carved into.

One table per board, as NVIDIA publishes it: the GPU-instance profiles
(``nvidia-smi mig -lgip``: name, the NVML profile id, the id nvidia-smi
prints, slices, memory, instance count, placements as ``nvidia-smi mig
-lgipp`` lists them) and the compute-instance profiles a GPU instance of
a given size offers (``-lcip``).  The library reads the table from the
engine config; this module is the one place it is written, so a board's
geometry is data, checked against the guide by the tests, not code.

sources:
  NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles" (the
  A100, H100, H200, B200, GB200 and GB300 tables: profile names, memory
  and SM fractions, instance counts), "Getting Started with MIG", "List
  GPU Instance Profiles" (the ``-lgip``/``-lgipp`` output: profile ids,
  memory in GiB, placements) and "Deployment Considerations" (a MIG mode
  change needs a GPU reset on the A100/A30).
  ``nvml.h``: ``NVML_GPU_INSTANCE_PROFILE_*`` and
  ``NVML_COMPUTE_INSTANCE_PROFILE_*``.

Every board here has eight memory slices and seven compute slices, and
the same placements: a 1-slice instance starts at 0..6, a 2-slice one
(and a 1g instance with twice the memory) at 0, 2, 4 or 6, a 3g or 4g one
at 0 or 4, the whole GPU at 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

#: ``nvmlGpuInstanceProfile`` ids (``nvml.h``).
GI_1_SLICE, GI_2_SLICE, GI_3_SLICE, GI_4_SLICE, GI_7_SLICE = 0, 1, 2, 3, 4
GI_1_SLICE_REV1, GI_1_SLICE_REV2 = 7, 9
#: ``nvmlComputeInstanceProfile`` ids by compute-slice count (``nvml.h``).
CI_PROFILE_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}
#: Memory slices of every board here (the ``sizes`` of placements count them).
MEMORY_SLICES = 8


@attrs.frozen
class GpuInstanceProfile:
    name: str  # "1g.10gb", as nvidia-smi prints it after "MIG "
    nvml_id: int  # nvmlGpuInstanceProfile (NVML_GPU_INSTANCE_PROFILE_*)
    smi_id: int  # the id `nvidia-smi mig -lgip` prints and `-cgi` takes
    slices: int  # compute slices (sliceCount)
    memory_mib: int
    instances: int  # how many the board holds at most
    starts: tuple[int, ...]  # placements' starts, in memory slices
    size: int  # placements' size, in memory slices
    media: bool = False  # the "+me" profile: the board's media engines
    multiprocessors: int = 0  # SMs of the instance
    decoders: int = 0  # NVDECs
    jpegs: int = 0
    ofas: int = 0

    @property
    def label(self) -> str:
        """The name nvidia-smi prints after "MIG " ("1g.10gb", "1g.10gb+me")."""
        return self.name + ("+me" if self.media else "")

    @property
    def compute_instances(self) -> tuple[int, ...]:
        """The compute-slice counts of the compute instances it offers (``-lcip``)."""
        # A 3- or 4-slice compute instance fits only its own size or the whole GPU.
        return tuple(
            n
            for n in (1, 2, 3, 4, 7)
            if n <= self.slices and (n not in (3, 4, 7) or self.slices in (n, 7))
        )


@attrs.frozen
class MigBoard:
    """One board's table and how its MIG mode changes."""

    profiles: tuple[GpuInstanceProfile, ...]
    #: whether a MIG mode change waits for ``nvidia-smi -r`` ("Deployment
    #: Considerations": the A100/A30); later boards apply it at once when idle
    reset_for_mode: bool

    def profile(self, smi_id: int) -> GpuInstanceProfile | None:
        return next((p for p in self.profiles if p.smi_id == smi_id), None)

    def by_label(self, label: str) -> GpuInstanceProfile | None:
        """The profile nvidia-smi names ``label`` ("1g.10gb", "1g.10gb+me")."""
        return next((p for p in self.profiles if p.label == label), None)


def _table(
    gib: Mapping[str, float], *, media: float, ampere: bool, sms: Mapping[int, int]
) -> MigBoard:
    """The seven-slice table from each profile's memory in GiB (nvidia-smi's ``-lgip``).

    ``sms``: the SMs of an instance by its compute slices.  ``ampere``: the
    A100's media engines (NVDECs 0/1/2/2/5 for 1g..7g, JPEG and OFA only
    with "+me" or the whole GPU) and its MIG mode reset; else Hopper's and
    later (an NVDEC and a JPEG per slice, OFA with "+me" or the whole GPU).
    """
    names = list(gib)
    one, one_me, one_double, two, three, four, seven = names
    rows = [
        (one, GI_1_SLICE, 19, 1, gib[one], 7, tuple(range(7)), 1, False),
        (one_me, GI_1_SLICE_REV1, 20, 1, media, 1, tuple(range(7)), 1, True),
        (one_double, GI_1_SLICE_REV2, 15, 1, gib[one_double], 4, (0, 2, 4, 6), 2, False),
        (two, GI_2_SLICE, 14, 2, gib[two], 3, (0, 2, 4), 2, False),
        (three, GI_3_SLICE, 9, 3, gib[three], 2, (0, 4), 4, False),
        (four, GI_4_SLICE, 5, 4, gib[four], 1, (0,), 4, False),
        (seven, GI_7_SLICE, 0, 7, gib[seven], 1, (0,), 8, False),
    ]
    return MigBoard(
        profiles=tuple(
            GpuInstanceProfile(
                name=n.removesuffix("+me"),
                nvml_id=i,
                smi_id=s,
                slices=c,
                memory_mib=round(m * 1024),
                instances=k,
                starts=st,
                size=sz,
                media=me,
                multiprocessors=sms[c],
                **_engines(c, sz, me, ampere),
            )
            for n, i, s, c, m, k, st, sz, me in rows
        ),
        reset_for_mode=ampere,
    )


def _engines(slices: int, size: int, media: bool, ampere: bool) -> dict[str, int]:
    whole = slices == 7
    if ampere:
        decoders = (
            1 if media or (size == 2 and slices == 1) else {1: 0, 2: 1, 3: 2, 4: 2, 7: 5}[slices]
        )
        jpegs = 1 if media or whole else 0
    else:
        decoders = jpegs = slices
    return {"decoders": decoders, "jpegs": jpegs, "ofas": 1 if media or whole else 0}


_A100_SMS = {1: 14, 2: 28, 3: 42, 4: 56, 7: 98}
_H100_SMS = {1: 16, 2: 32, 3: 60, 4: 64, 7: 132}


def _sms(per_slice: int) -> dict[int, int]:
    return {n: per_slice * n for n in (1, 2, 3, 4, 7)}


#: Boards by the name NVML gives them (``name`` in the profile).  Memory in
#: GiB and SMs as ``nvidia-smi mig -lgip`` prints them for A100 and H100;
#: for the later boards the guide gives the names (memory in GB) and the
#: fractions only, so their GiB and SMs are those fractions of the board.
BOARDS: dict[str, MigBoard] = {
    "NVIDIA A100-SXM4-40GB": _table(
        {
            "1g.5gb": 4.75,
            "1g.5gb+me": 4.75,
            "1g.10gb": 9.62,
            "2g.10gb": 9.62,
            "3g.20gb": 19.62,
            "4g.20gb": 19.62,
            "7g.40gb": 39.50,
        },
        media=4.75,
        ampere=True,
        sms=_A100_SMS,
    ),
    "NVIDIA A100-SXM4-80GB": _table(
        {
            "1g.10gb": 9.50,
            "1g.10gb+me": 9.50,
            "1g.20gb": 19.50,
            "2g.20gb": 19.50,
            "3g.40gb": 39.25,
            "4g.40gb": 39.25,
            "7g.80gb": 78.75,
        },
        media=9.50,
        ampere=True,
        sms=_A100_SMS,
    ),
    "NVIDIA H100 80GB HBM3": _table(
        {
            "1g.10gb": 9.75,
            "1g.10gb+me": 9.75,
            "1g.20gb": 19.62,
            "2g.20gb": 19.62,
            "3g.40gb": 39.50,
            "4g.40gb": 39.50,
            "7g.80gb": 79.25,
        },
        media=9.75,
        ampere=False,
        sms=_H100_SMS,
    ),
    "NVIDIA H200": _table(
        {
            "1g.18gb": 16.0,
            "1g.18gb+me": 16.0,
            "1g.35gb": 32.5,
            "2g.35gb": 32.5,
            "3g.71gb": 66.0,
            "4g.71gb": 66.0,
            "7g.141gb": 131.0,
        },
        media=16.0,
        ampere=False,
        sms=_H100_SMS,
    ),
    "NVIDIA B200": _table(
        {
            "1g.23gb": 21.0,
            "1g.23gb+me": 21.0,
            "1g.45gb": 42.0,
            "2g.45gb": 42.0,
            "3g.90gb": 84.0,
            "4g.90gb": 84.0,
            "7g.180gb": 168.0,
        },
        media=21.0,
        ampere=False,
        sms=_sms(20),
    ),
    "NVIDIA GB200": _table(
        {
            "1g.24gb": 22.0,
            "1g.24gb+me": 22.0,
            "1g.47gb": 44.0,
            "2g.47gb": 44.0,
            "3g.93gb": 87.0,
            "4g.93gb": 87.0,
            "7g.186gb": 173.0,
        },
        media=22.0,
        ampere=False,
        sms=_sms(20),
    ),
    "NVIDIA GB300": _table(
        {
            "1g.34gb": 31.0,
            "1g.34gb+me": 31.0,
            "1g.67gb": 62.0,
            "2g.67gb": 62.0,
            "3g.135gb": 125.0,
            "4g.135gb": 125.0,
            "7g.269gb": 250.0,
        },
        media=31.0,
        ampere=False,
        sms=_sms(22),
    ),
}


def board(name: str) -> MigBoard | None:
    """The MIG table of the board NVML names ``name``; ``None``: not MIG capable."""
    return BOARDS.get(name)
