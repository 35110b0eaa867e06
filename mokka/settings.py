"""The daemon's own settings: frozen, documented, built from flags and env.

``Settings.add_arguments(parser)`` declares the flags (their exact names are
relied on by the chart and by scripts), ``Settings.from_args(args)`` turns
the parsed namespace into one frozen value and validates it.  Every invalid
value raises ``SpecError`` with a one-line message naming the flag, what was
found and what was expected; ``mokka daemon`` prints it and exits 2, like
argparse does for its own errors.

Simulator flags are not declared here: each simulator plugin adds its own
(``mokka.simulators.registry``), so this module stays at the bottom layer
and knows nothing about simulators.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import attrs

from mokka.errors import SpecError
from mokka.layout import LOCAL_ROOT

#: Health address unless ``--health-addr`` says otherwise: loopback only,
#: whatever the root.  Exposing the probes (and the input excerpts their
#: bodies carry) to a network is a decision, not a default: the chart passes
#: ``--health-addr`` explicitly (all of the pod's own interfaces).
LOCAL_HEALTH_ADDR = ("127.0.0.1", 9091)

#: Known feature gates and their defaults.  ``IMEXDownload`` lets the imex
#: simulator download its pinned archive into the node cache (off: archives
#: come only from the chart's image volume).
FEATURE_GATES: Mapping[str, bool] = MappingProxyType({"IMEXDownload": False})

#: Default of ``--reload-debounce`` (see ``Settings.reload_debounce``).
RELOAD_DEBOUNCE = 0.01

LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
SOURCES = ("file", "control-plane")


def parse_health_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9091`` for IPv6) → ``(host, port)``; port 0 = any free port.

    Split at the *last* colon, so a bracketed IPv6 literal keeps its own.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise SpecError(f"--health-addr: {text!r} is not HOST:PORT, expected e.g. 0.0.0.0:9091")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise SpecError(f"--health-addr: port {port_text!r} in {text!r}, expected 0..65535")
    return host, port


def parse_feature_gates(text: str) -> dict[str, bool]:
    """``A=true,B=false`` → the known gates with these values applied over the defaults.

    An unknown gate is an error rather than ignored: a misspelt gate would
    otherwise silently leave the feature in its default state.
    """
    gates = dict(FEATURE_GATES)
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if name not in FEATURE_GATES:
            known = ", ".join(sorted(FEATURE_GATES))
            raise SpecError(f"--feature-gates: unknown gate {name!r}, expected one of: {known}")
        value = value.strip().lower()
        if not sep or value not in ("true", "false"):
            raise SpecError(f"--feature-gates: {item!r}, expected {name}=true or {name}=false")
        gates[name] = value == "true"
    return gates


def _seconds(flag: str, value: Any, *, allow_zero: bool) -> float:
    """A finite, non-negative duration; zero only where it means "off"."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{flag}: {value!r} is not a number of seconds") from None
    # NaN and infinity parse as floats but mean nothing as a duration here.
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        expected = "a number >= 0" if allow_zero else "a number > 0"
        raise SpecError(f"{flag}: {value!r}, expected {expected}")
    return seconds


def _hostname() -> str:
    """This machine's name, the node name of last resort."""
    # imported here: ``socket`` is a cost every ``mokka ctl`` call would pay
    # for a default only the daemon's settings need
    import socket

    return socket.gethostname()


def _choice(flag: str, value: str, choices: tuple[str, ...], *, upper: bool = False) -> str:
    """One of ``choices``, matched case-insensitively and returned in their spelling."""
    normal = value.upper() if upper else value.lower()
    if normal not in choices:
        raise SpecError(f"{flag}: {value!r}, expected one of: {', '.join(choices)}")
    return normal


@attrs.frozen(kw_only=True)
class Settings:
    """What ``mokka daemon`` was asked to do; one value for the daemon's lifetime."""

    #: Node root every write goes under.  ``/host`` in the pod; ``./mokka-node``
    #: for a local run, so ``mokka`` with no flags is harmless.
    root: Path = LOCAL_ROOT
    #: Built-in profile name (``h100``) or a path to a profile YAML.  ``h100``
    #: by default: the most common shape consumers are tested against.
    profile: str = "h100"
    #: ComputeDomain topology document; ``None``: this node is in no clique.
    topology: Path | None = None
    #: Runtime overrides file; ``None``: the node path ``mokka.layout.OVERRIDES``
    #: under the root (where ``mokka ctl`` writes by default).
    overrides: Path | None = None
    #: This node's name; seeds every per-node identity (GPU UUIDs, IB GUIDs), so
    #: two nodes never share one.  The chart sets ``NODE_NAME`` from the pod spec.
    node_name: str
    #: Where ``/healthz``, ``/readyz`` and ``/metrics`` listen (port 0: any free
    #: port, reported in the log; tests use it).
    health_addr: tuple[str, int] = LOCAL_HEALTH_ADDR
    #: Seconds between full re-reads of the inputs regardless of inotify events
    #: (NFS, exhausted watch limits); 0 disables.  60 s: a minute of staleness
    #: at worst, at a negligible cost.
    resync_interval: float = 60.0
    #: Seconds of quiet that end a burst of input events before the inputs
    #: are re-read.  The watch reacts to completed writes and renames only
    #: (``IN_CLOSE_WRITE``, ``IN_MOVED_TO``), and a ConfigMap update or an
    #: editor's save is one such event, so the quiet period only has to
    #: gather the few events of one save: 10 ms does, where 100 ms was a
    #: tenth of a second added to every change.  0 reads at the first event.
    reload_debounce: float = RELOAD_DEBOUNCE
    #: Seconds teardown (revoke + discard) may take after SIGTERM.  25 s: under
    #: the kubelet's default 30 s ``terminationGracePeriodSeconds``.
    shutdown_timeout: float = 25.0
    #: Reconcile once (stage, apply; no daemons, no teardown) and exit 0 ready,
    #: 1 failed pass, 3 not ready.
    once: bool = False
    #: ``text`` (``ts level logger msg key=value``) or ``json`` (one object per line).
    log_format: str = "text"
    #: Threshold of the root logger (``DEBUG`` .. ``CRITICAL``).
    log_level: str = "INFO"
    #: ``file`` (inotify on the inputs) or ``control-plane`` (MEP-0001, a stub).
    source: str = "file"
    #: Every known gate with its value (defaults from ``FEATURE_GATES``).
    feature_gates: Mapping[str, bool] = attrs.field(
        factory=lambda: dict(FEATURE_GATES), converter=lambda m: MappingProxyType(dict(m))
    )

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """Declare the daemon's own flags (values are validated in ``from_args``)."""
        group = parser.add_argument_group("node")
        group.add_argument(
            "--root",
            metavar="DIR",
            help="node root every write goes under (env MOKKA_ROOT; default ./mokka-node)",
        )
        group.add_argument(
            "--profile",
            metavar="NAME|PATH",
            default="h100",
            help="built-in GPU profile name or a profile YAML path (default h100)",
        )
        group.add_argument("--topology", metavar="PATH", help="ComputeDomain topology document")
        group.add_argument(
            "--overrides",
            metavar="PATH",
            help="runtime overrides file (default: the driver config dir under the root)",
        )
        group.add_argument(
            "--node-name",
            metavar="NAME",
            help="this node's name (env NODE_NAME; default the hostname)",
        )
        group.add_argument(
            "--feature-gates",
            metavar="A=true,B=false",
            default="",
            help=f"feature gates (known: {', '.join(sorted(FEATURE_GATES))})",
        )
        group.add_argument(
            "--source",
            default="file",
            metavar="|".join(SOURCES),
            help="where the desired state comes from (default file)",
        )
        group = parser.add_argument_group("daemon")
        group.add_argument(
            "--health-addr",
            metavar="HOST:PORT",
            help=(
                "health/metrics listen address (default 127.0.0.1:9091, also with --root; "
                "port 0 = any free port)"
            ),
        )
        group.add_argument(
            "--resync-interval",
            metavar="SECONDS",
            default="60",
            help="re-read all inputs this often regardless of events; 0 disables (default 60)",
        )
        group.add_argument(
            "--reload-debounce",
            metavar="SECONDS",
            default=str(RELOAD_DEBOUNCE),
            help=(
                "quiet time that ends a burst of input changes before they are read; "
                f"0 reads at once (default {RELOAD_DEBOUNCE})"
            ),
        )
        group.add_argument(
            "--shutdown-timeout",
            metavar="SECONDS",
            default="25",
            help="time budget of teardown after SIGTERM (default 25)",
        )
        group.add_argument(
            "--once",
            action="store_true",
            help="reconcile once (no daemons, no teardown), print a summary, exit 0 ready, "
            "1 failed pass, 3 not ready",
        )
        group.add_argument(
            "--log-format",
            metavar="text|json",
            default="text",
            help="log line format (default text)",
        )
        group.add_argument(
            "--log-level",
            metavar="LEVEL",
            default="INFO",
            help="DEBUG, INFO, WARNING, ERROR or CRITICAL (default INFO)",
        )

    @classmethod
    def from_args(
        cls, args: argparse.Namespace, *, environ: Mapping[str, str] | None = None
    ) -> Settings:
        """Build and validate from parsed flags; flags win over env, env over defaults."""
        env = os.environ if environ is None else environ
        root_text = args.root or env.get("MOKKA_ROOT") or ""
        root = Path(root_text) if root_text else LOCAL_ROOT
        health_addr = (
            parse_health_addr(args.health_addr) if args.health_addr else LOCAL_HEALTH_ADDR
        )
        node_name = args.node_name or env.get("NODE_NAME") or _hostname()
        if not node_name.strip():
            raise SpecError("--node-name: empty, expected this node's name")
        if not str(args.profile).strip():
            raise SpecError("--profile: empty, expected a built-in profile name or a YAML path")
        return cls(
            root=root,
            profile=args.profile,
            topology=Path(args.topology) if args.topology else None,
            overrides=Path(args.overrides) if args.overrides else None,
            node_name=node_name,
            health_addr=health_addr,
            resync_interval=_seconds("--resync-interval", args.resync_interval, allow_zero=True),
            reload_debounce=_seconds("--reload-debounce", args.reload_debounce, allow_zero=True),
            shutdown_timeout=_seconds(
                "--shutdown-timeout", args.shutdown_timeout, allow_zero=False
            ),
            once=bool(args.once),
            log_format=_choice("--log-format", args.log_format, LOG_FORMATS),
            log_level=_choice("--log-level", args.log_level, LOG_LEVELS, upper=True),
            source=_choice("--source", args.source, SOURCES),
            feature_gates=parse_feature_gates(args.feature_gates or ""),
        )
