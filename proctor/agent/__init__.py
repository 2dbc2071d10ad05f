"""Agents that act through governed tool calls: `CodeAgent` (writes Python) and `ToolCallingAgent`.

```python
from proctor.agent import CodeAgent, LiteLLMModel

agent = CodeAgent(tools=[get_order, issue_refund], model=LiteLLMModel("openai/gpt-4o-mini"),
                  policy="policy.yaml", audit="audit.jsonl", max_steps=10)
result = agent.run("Refund order A-1041", principal="alice")
result.status, result.answer, [c.tool for c in result.tool_calls]
```
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.agent.base import AgentBase, FinalAnswerCheck, StepCallback
    from proctor.agent.code_agent import CodeAgent
    from proctor.agent.models import (
        LiteLLMModel,
        Message,
        Model,
        ModelError,
        ModelResponse,
        ScriptedModel,
        ToolCallRequest,
        Usage,
    )
    from proctor.agent.parsing import CodeParseError, extract_code
    from proctor.agent.result import RUN_STATUSES, RunResult, RunStatus, StepRecord
    from proctor.agent.streaming import CallEvent, StreamEvent
    from proctor.agent.tool_calling import ToolCallingAgent

__all__ = [
    "RUN_STATUSES",
    "AgentBase",
    "CallEvent",
    "CodeAgent",
    "CodeParseError",
    "FinalAnswerCheck",
    "LiteLLMModel",
    "Message",
    "Model",
    "ModelError",
    "ModelResponse",
    "RunResult",
    "RunStatus",
    "ScriptedModel",
    "StepCallback",
    "StepRecord",
    "StreamEvent",
    "ToolCallRequest",
    "ToolCallingAgent",
    "Usage",
    "extract_code",
]

_lazy.install(__name__, {
    "AgentBase": "proctor.agent.base",
    "FinalAnswerCheck": "proctor.agent.base",
    "StepCallback": "proctor.agent.base",
    "CodeAgent": "proctor.agent.code_agent",
    "LiteLLMModel": "proctor.agent.models",
    "Message": "proctor.agent.models",
    "Model": "proctor.agent.models",
    "ModelError": "proctor.agent.models",
    "ModelResponse": "proctor.agent.models",
    "ScriptedModel": "proctor.agent.models",
    "ToolCallRequest": "proctor.agent.models",
    "Usage": "proctor.agent.models",
    "CodeParseError": "proctor.agent.parsing",
    "extract_code": "proctor.agent.parsing",
    "RUN_STATUSES": "proctor.agent.result",
    "RunResult": "proctor.agent.result",
    "RunStatus": "proctor.agent.result",
    "StepRecord": "proctor.agent.result",
    "CallEvent": "proctor.agent.streaming",
    "StreamEvent": "proctor.agent.streaming",
    "ToolCallingAgent": "proctor.agent.tool_calling",
})
