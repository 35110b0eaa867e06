"""The project's exception types, in one place.

The split follows controller-runtime's TerminalError / requeue: a
``SpecError`` means the *input* is wrong and retrying the same input cannot
help (the reconciler waits for a new state), every other ``MokkaError`` is
retried with backoff.
"""

from __future__ import annotations

from collections.abc import Iterable


class MokkaError(Exception):
    """Base class of every error the project raises on purpose."""


class SpecError(MokkaError):
    """A desired-state input (profile, topology, overrides, flags) is invalid.

    Carries every problem found, not just the first, each already phrased as
    ``<file>: <field path>: <what was found>, expected <what>``.
    """

    def __init__(self, problems: Iterable[str] | str) -> None:
        if isinstance(problems, str):
            problems = [problems]
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("; ".join(self.problems) if self.problems else "invalid input")


class HostPathError(MokkaError):
    """A path would resolve outside the node root, or through something unsafe."""


class NativeArtifactMissing(MokkaError):
    """A native library or binary the package build should have produced is absent."""


class StageError(MokkaError):
    """A simulator could not stage its artifacts (retried with backoff)."""


class ApplyError(MokkaError):
    """An applier could not publish its artifacts (retried with backoff)."""


class CommandError(MokkaError):
    """A host command (systemctl, nvidia-ctk, ...) failed."""


class UntrustedBookkeepingError(HostPathError):
    """A manifest, journal or backup someone other than the daemon could have written.

    Acting on it would let that someone steer what the daemon (usually root)
    creates or deletes under the node root, so nothing in it is acted on.
    """


class HostFaultError(MokkaError):
    """An expected filesystem fault under the node root (full, read-only, no permission, gone).

    Not a bug: one line says which path and why, and the pass is retried.
    """


class PassSuperseded(MokkaError):
    """A converge of a Stage wave stopped between two paths: a newer input arrived.

    Not a failure: the reconcile loop drops the pass and stages the newer
    input over whatever this one had done (``Host.GIVE_WAY``).
    """


class CtlError(MokkaError):
    """A bad command line value (exit 2, like argparse's own errors).

    Raised before the file is touched; ``run`` prints it as one
    ``mokka ctl: error: ...`` line naming the flag.
    """
