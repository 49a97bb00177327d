"""The proposer's log records, handed to TGI's loguru logger (TGI logs with loguru, the core with ``logging``)."""

from __future__ import annotations

import logging

__all__ = ["LOGGER_NAME", "proposer_logger"]

#: The stdlib logger the domain proposer of a TGI model logs to.
LOGGER_NAME = "text_generation_server.accel_plugin.speculative"


class _ToLoguru(logging.Handler):
    """Hands the proposer's stdlib records (%-style) to TGI's loguru logger."""

    def emit(self, record: logging.LogRecord) -> None:
        from . import _compat

        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format must not break a step
            self.handleError(record)
            return
        log = _compat.logger().patch(
            lambda r: r.update(function=record.funcName, line=record.lineno, module=record.module))
        if record.exc_info:
            log = log.opt(exception=record.exc_info)
        log.log(record.levelname, message)


def proposer_logger() -> logging.Logger:
    """The logger handed to the proposer: its records go to TGI's loguru sink."""
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _ToLoguru) for h in logger.handlers):
        logger.addHandler(_ToLoguru())
        logger.setLevel(logging.DEBUG)  # loguru's sink (TGI's --logger-level) filters
        logger.propagate = False
    return logger
