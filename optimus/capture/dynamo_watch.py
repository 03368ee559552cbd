"""Say truthfully what the per-call Dynamo path ran after ``optimize()`` returned.

WHY: on the dynamo-subgraphs path (a model whole-graph export cannot capture), every call whose
inputs match none of the compiled graphs makes Dynamo recompile, and optimus optimizes the new
graph. Past ``torch._dynamo.config.recompile_limit`` Dynamo stops compiling that function and runs
such calls eagerly, unoptimized, with one log warning. The report used to keep saying "8 graphs
optimized" while the model ran eagerly. The backend now counts the graphs it optimizes after
``optimize()`` (``report.recompiles``), and :class:`LimitWatch` (a logging filter that records,
never suppresses) sets ``report.recompile_limit_hit`` when Dynamo's warning names the model's
``forward``.
"""

from __future__ import annotations

import logging
import types
import weakref
from typing import Any

from optimus.report import OptimusReport

DYNAMO_LOGGER = "torch._dynamo.convert_frame"
_LIMIT_MESSAGE = "torch._dynamo hit config."


def code_info(code: types.CodeType) -> str:
    """How Dynamo's warning names a function (``convert_frame.format_func_info``)."""
    return f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})"


class LimitWatch(logging.Filter):
    """Marks the report when Dynamo's recompile-limit warning names ``code``; passes every record."""

    def __init__(self, report: OptimusReport, code: types.CodeType) -> None:
        super().__init__()
        self.report = weakref.ref(report)
        self.info = code_info(code)

    def filter(self, record: logging.LogRecord) -> bool:
        report = self.report()
        if report is None:  # dropped by the next watch(): removing it here, while the logger
            return True  # iterates over its filters, skipped the filter after it
        if isinstance(record.msg, str) and record.msg.startswith(_LIMIT_MESSAGE):
            args: Any = record.args
            if (
                isinstance(args, tuple)
                and any(a == self.info for a in args)
                and not report.recompile_limit_hit
            ):
                report.recompile_limit_hit = True
                report.notes.append(
                    f"Dynamo's recompile limit ({args[1] if len(args) > 1 else '?'}) was reached: calls whose "
                    "inputs match none of the optimized graphs now run eagerly, unoptimized"
                )
        return True


def watch(report: OptimusReport, forward: Any) -> None:
    """Watch Dynamo's log for the recompile limit of ``forward`` (a bound or plain function)."""
    code = getattr(getattr(forward, "__func__", forward), "__code__", None)
    if isinstance(code, types.CodeType):
        logger = logging.getLogger(DYNAMO_LOGGER)
        for old in [f for f in logger.filters if isinstance(f, LimitWatch) and f.report() is None]:
            logger.removeFilter(old)  # watches of reports nobody holds any more
        logger.addFilter(LimitWatch(report, code))


__all__ = ["LimitWatch", "code_info", "watch"]
