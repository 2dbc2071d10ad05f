"""Build an approver from the command line's ``--approver`` value.

``console`` → `ConsoleApprover`; ``webhook:URL`` → `WebhookApprover` whose secret
comes from the environment (``PROCTOR_WEBHOOK_SECRET``), never from the command
line where ``ps`` and shell history would show it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from proctor.approval.base import Approver
from proctor.errors import ConfigurationError

__all__ = ["SECRET_ENV", "approver_from_spec"]

SECRET_ENV = "PROCTOR_WEBHOOK_SECRET"


def approver_from_spec(spec: str, *, env: Mapping[str, str] | None = None) -> Approver:
    """``console`` or ``webhook:https://…``; raises ValueError with a one-line fix otherwise."""
    from proctor.approval.console import ConsoleApprover
    from proctor.approval.webhook import WebhookApprover

    environ = os.environ if env is None else env
    if spec == "console":
        return ConsoleApprover()
    if spec.startswith("webhook:"):
        url = spec.removeprefix("webhook:")
        secret = environ.get(SECRET_ENV, "")
        if not secret:
            raise ConfigurationError(f"--approver {spec} needs the shared secret in ${SECRET_ENV}")
        return WebhookApprover(url, secret=secret)
    raise ConfigurationError(f"unknown approver {spec!r}: use 'console' or 'webhook:https://host/path'")
