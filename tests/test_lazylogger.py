"""``LazyLogger``: the module's real logger, fetched on first use.

That ``mokka ctl`` loads no ``logging`` at all is pinned by
``tests/test_startup_imports.py``; here, that what is logged through the
stand-in reaches ``logging`` as from the named logger itself.
"""

from __future__ import annotations

import logging

import pytest

from mokka.lazylogger import LazyLogger


def test_records_come_from_the_named_logger(caplog: pytest.LogCaptureFixture) -> None:
    lazy = LazyLogger("mokka.lazy-test")
    with caplog.at_level(logging.INFO, logger="mokka.lazy-test"):
        lazy.info("placed %s", "/x")
        lazy.debug("not shown")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("mokka.lazy-test", "INFO", "placed /x")]


def test_the_real_loggers_settings_are_what_it_answers() -> None:
    real = logging.getLogger("mokka.lazy-test.level")
    real.setLevel(logging.ERROR)
    lazy = LazyLogger("mokka.lazy-test.level")
    assert lazy.name == "mokka.lazy-test.level"
    assert not lazy.isEnabledFor(logging.WARNING)
    real.setLevel(logging.NOTSET)  # a change made after first use is seen too
    assert lazy.isEnabledFor(logging.WARNING) == logging.getLogger().isEnabledFor(logging.WARNING)
