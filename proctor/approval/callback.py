"""An approver that asks a function of the program itself.

The callback answers with an `ApprovalDecision` or a plain bool. Whatever goes
wrong inside it becomes a deny that names the problem, never an exception in the
gate. A decision bound to another call is passed through untouched on purpose: the
gate checks every binding, and rewriting it here would hide a bug in the callback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from typing import Any, Protocol

from proctor.approval.base import ApprovalDecision, ApprovalRequest
from proctor.errors import ConfigurationError

__all__ = ["ApprovalCallback", "CallbackApprover"]

_DEFAULT_APPROVER = ApprovalDecision.__dataclass_fields__["approver"].default


class ApprovalCallback(Protocol):
    """What `CallbackApprover` calls: the request in, a decision or a bool out."""

    def __call__(self, request: ApprovalRequest, /) -> ApprovalDecision | bool: ...


class CallbackApprover:
    """Approve or deny with `fn(request)`.

    - ``True`` approves, ``False`` denies ("callback said no").
    - An `ApprovalDecision` is returned as is; its approver defaults to `name`.
    - A coroutine is run to completion when no event loop is running in this thread.
    - An exception, or any other return value, denies and says why.
    """

    def __init__(self, fn: ApprovalCallback, *, name: str = "callback") -> None:
        if not callable(fn):
            raise ConfigurationError(f"CallbackApprover needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.name = name

    def __repr__(self) -> str:
        return f"CallbackApprover({getattr(self.fn, '__qualname__', self.fn)!r}, name={self.name!r})"

    def request(self, request: ApprovalRequest) -> ApprovalDecision:
        decision = self._ask(request)
        # The program's own function answered: that is all that is proven (its name is the callback's word).
        return dataclasses.replace(decision, method="callback",
                                   answered_at_ns=decision.answered_at_ns or time.time_ns())

    def _ask(self, request: ApprovalRequest) -> ApprovalDecision:
        try:
            result: Any = self.fn(request)
            if inspect.iscoroutine(result):
                result = self._run_coroutine(result)
        except Exception as exc:  # noqa: BLE001 - any failure of the callback is a deny, never a crash
            return ApprovalDecision.deny(request, self.name, f"callback raised {type(exc).__name__}: {exc}")
        if isinstance(result, bool):
            if result:
                return ApprovalDecision.approve(request, self.name)
            return ApprovalDecision.deny(request, self.name, "callback said no")
        if isinstance(result, ApprovalDecision):
            decision: ApprovalDecision = result
            if decision.approver == _DEFAULT_APPROVER or not decision.approver:
                decision = dataclasses.replace(decision, approver=self.name)
            return decision
        return ApprovalDecision.deny(
            request, self.name, f"callback returned {type(result).__name__}, expected ApprovalDecision or bool"
        )

    @staticmethod
    def _run_coroutine(coro: Any) -> Any:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        coro.close()  # never awaited: close it so Python does not warn about it
        raise ConfigurationError("async callback called from inside a running event loop; pass a sync function")
