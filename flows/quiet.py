"""`quiet`: keep chosen records out of Prefect's logs (an end that already has its own one line: a planned
end, a failed dependency), every other record logged as before."""

from __future__ import annotations

import logging
from typing import Callable

_FILTERS: dict[Callable, logging.Filter] = {}


class _Drop(logging.Filter):
    def __init__(self, drop: Callable[[logging.LogRecord], bool]):
        super().__init__()
        self.drop = drop

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.drop(record)


def quiet(loggers: tuple[str, ...], drop: Callable[[logging.LogRecord], bool]) -> None:
    """Drop the records of `loggers` that `drop(record)` is true for (idempotent: one filter per `drop`)."""
    flt = _FILTERS.setdefault(drop, _Drop(drop))
    for name in loggers:
        log = logging.getLogger(name)
        if flt not in log.filters:
            log.addFilter(flt)
