"""The instrumented interpreter: model code runs in a sandboxed worker; every tool call goes through the gate.

```python
with Interpreter(tools=[send_email], gate=gate, timeout=10) as py:
    r = py.run("send_email('a@example.com', 'hi', 'b')\nprint('sent')")
    r.value, r.logs, r.error, r.tool_calls, r.is_final_answer
```

See docs/sandbox.md for what each isolation level guarantees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.interpreter.interpreter import ExecutionResult, Interpreter, ProgramError

__all__ = ["ExecutionResult", "Interpreter", "ProgramError"]

_lazy.install(__name__, {
    "ExecutionResult": "proctor.interpreter.interpreter",
    "Interpreter": "proctor.interpreter.interpreter",
    "ProgramError": "proctor.interpreter.interpreter",
})
