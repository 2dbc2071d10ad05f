"""One process of a durable-run test: `start` a run until it suspends (or dies), or `resume` it.

    python durable_driver.py start|resume STORE AUDIT POLICY SCRIPT.json [RUN_ID]

SCRIPT.json: {"responses": [model replies…], "agent": "code"|"tool-calling", "crash": point}.
Prints the RunResult as JSON on its last line. `crash` SIGKILLs this process at a point
of the step no tool marks: "before-program" (the model answered, no call made) or
"after-step" (the step ran to its end, the run not yet closed).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

from durable_tools import TOOLS

from proctor import CodeAgent, InboxApprover, Policy, RunStore, ScriptedModel, ToolCallingAgent
from proctor.agent.models import ModelResponse


def _response(item: Any) -> Any:
    if isinstance(item, dict):
        return ModelResponse.calling(*[(c[0], c[1]) for c in item["calls"]], content=item.get("content", ""))
    return item


def main() -> int:
    action, store_url, audit, policy_path, script_path = sys.argv[1:6]
    script = json.loads(open(script_path, encoding="utf-8").read())
    crash = script.get("crash")

    def kill_at(point: str) -> Any:
        def callback(step: Any) -> None:
            if crash == point:
                os.kill(os.getpid(), signal.SIGKILL)
        return callback

    store = RunStore.open(store_url)
    model = ScriptedModel([_response(r) for r in script["responses"]])
    kwargs: dict[str, Any] = {"approver": InboxApprover(store, wait=script.get("wait", "0s")), "audit": audit,
                              "store": store, "max_steps": 4, "program_callbacks": [kill_at("before-program")],
                              "step_callbacks": [kill_at("after-step")]}
    policy = Policy.from_yaml(policy_path)
    if script.get("agent") == "tool-calling":
        agent: Any = ToolCallingAgent(TOOLS, model, policy, **kwargs)
    else:
        agent = CodeAgent(TOOLS, model, policy, authorized_imports=["random", "time"], sandbox="process", **kwargs)
    with agent:
        if action == "start":
            result = agent.run(script.get("task", "do the thing"), principal="alice")
        else:
            result = agent.resume(sys.argv[6])
    store.close()
    print(json.dumps(result.as_dict(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
