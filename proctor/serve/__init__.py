"""The approval inbox (`proctor serve`): pages and a JSON API where approvers answer calls waiting in a run store.

Needs the ``serve`` extra (FastAPI, uvicorn, Jinja2). See docs/approvals.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.approval.tokens import TokenFile, add_token
    from proctor.serve.app import create_app

__all__ = ["TokenFile", "add_token", "create_app"]

_lazy.install(__name__, {"TokenFile": "proctor.approval.tokens", "add_token": "proctor.approval.tokens",
                         "create_app": "proctor.serve.app"})
