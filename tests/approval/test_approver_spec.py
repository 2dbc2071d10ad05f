"""Tests for approver_from_spec (the --approver option)."""

from __future__ import annotations

import pytest

from proctor.approval import ConsoleApprover, WebhookApprover, approver_from_spec


def test_approver_from_spec() -> None:
    """--approver values build the right approver; the webhook secret must come from the environment."""
    assert isinstance(approver_from_spec("console"), ConsoleApprover)
    hook = approver_from_spec("webhook:https://hooks.example.com/approve", env={"PROCTOR_WEBHOOK_SECRET": "s"})
    assert isinstance(hook, WebhookApprover) and hook.url == "https://hooks.example.com/approve"
    with pytest.raises(ValueError, match=r"needs the shared secret in \$PROCTOR_WEBHOOK_SECRET"):
        approver_from_spec("webhook:https://hooks.example.com/approve", env={})
    with pytest.raises(ValueError, match="unknown approver"):
        approver_from_spec("slack")
