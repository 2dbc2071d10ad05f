"""Every span, attribute and metric name proctor emits, in one place.

The `gen_ai.*` and `error.type` names are the OpenTelemetry GenAI semantic
conventions (github.com/open-telemetry/semantic-conventions-genai, model/gen-ai/
spans.yaml and metrics.yaml; status "development"). They are spelled out here rather
than imported from `opentelemetry-semantic-conventions`, whose GenAI constants are
deprecated since the conventions moved to their own repository, and because the
library depends on the OpenTelemetry API only.

Facts the conventions have no name for (the policy decision, budgets, approvals,
steps) live under `proctor.*`.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "APPROVAL_REQUESTED_EVENT",
    "APPROVAL_RESOLVED_EVENT",
    "APPROVAL_SPAN",
    "BUDGET_EXHAUSTED_EVENT",
    "CALL_INTERRUPTED_EVENT",
    "CALL_REFUSED_EVENT",
    "SHADOW_DECISION_EVENT",
    "PROCTOR_SHADOW_DISAGREEMENTS",
    "ERROR_OTHER",
    "ERROR_TYPE",
    "EXECUTE_TOOL",
    "GEN_AI_AGENT_DESCRIPTION",
    "GEN_AI_AGENT_ID",
    "GEN_AI_AGENT_NAME",
    "GEN_AI_CONVERSATION_ID",
    "GEN_AI_EXECUTE_TOOL_DURATION",
    "GEN_AI_INPUT_MESSAGES",
    "GEN_AI_INVOKE_AGENT_DURATION",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_OUTPUT_MESSAGES",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_TOOL_CALL_ARGUMENTS",
    "GEN_AI_TOOL_CALL_ID",
    "GEN_AI_TOOL_CALL_RESULT",
    "GEN_AI_TOOL_DESCRIPTION",
    "GEN_AI_TOOL_NAME",
    "GEN_AI_TOOL_TYPE",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "INVOKE_AGENT",
    "PROCTOR_AGENT_STATUS",
    "PROCTOR_APPROVAL_APPROVER",
    "PROCTOR_APPROVAL_OUTCOME",
    "PROCTOR_APPROVAL_WAIT",
    "PROCTOR_APPROVAL_WAIT_MS",
    "PROCTOR_BUDGET_KIND",
    "PROCTOR_BUDGET_NAME",
    "PROCTOR_BUDGET_PREFIX",
    "PROCTOR_BUDGET_REMAINING",
    "PROCTOR_DECISION",
    "PROCTOR_DECISIONS",
    "PROCTOR_POLICY_SHA256",
    "PROCTOR_REASON",
    "PROCTOR_RULES",
    "PROCTOR_RUN_ID",
    "PROCTOR_RUN_LABELS_PREFIX",
    "PROCTOR_RUN_PRINCIPAL",
    "PROCTOR_RUN_STEP",
    "PROCTOR_SIDE_EFFECT",
    "PROCTOR_STATUS",
    "PROCTOR_STEP",
    "PROCTOR_STEP_CODE",
    "PROCTOR_STEPS",
    "STEP_SPAN",
    "TOOL_TYPE_FUNCTION",
]

# -- operation names (values of gen_ai.operation.name) and span names ---------------------------
#: The run of an agent, in process: span `invoke_agent {gen_ai.agent.name}`, kind INTERNAL.
INVOKE_AGENT: Final = "invoke_agent"
#: One tool call: span `execute_tool {gen_ai.tool.name}`, kind INTERNAL.
EXECUTE_TOOL: Final = "execute_tool"
#: One step of the agent loop (model turn + program). The conventions define no step span,
#: so it is proctor's own: `step {n}`, kind INTERNAL, no gen_ai.operation.name. The name
#: stays low-cardinality because a run has at most `max_steps` steps.
STEP_SPAN: Final = "step"
#: The wait for a human (or a grant) on one call: `approval {tool}`, kind INTERNAL, a child
#: of the call's `execute_tool` span. proctor's own; the conventions have none.
APPROVAL_SPAN: Final = "approval"

# -- span events on `execute_tool` (Jaeger shows them as "Logs", Phoenix as "Events") ------------
#: The call was refused before it ran: attributes `error.type`, `proctor.reason`.
CALL_REFUSED_EVENT: Final = "proctor.call.refused"
#: A human was asked: `proctor.approval.expires_at_ns`.
APPROVAL_REQUESTED_EVENT: Final = "proctor.approval.requested"
#: The approval's answer: `proctor.approval.outcome`, `.approver`, `.wait_ms`.
APPROVAL_RESOLVED_EVENT: Final = "proctor.approval.resolved"
#: A budget refused the call: `proctor.budget.name`, `proctor.reason`.
BUDGET_EXHAUSTED_EVENT: Final = "proctor.budget.exhausted"
#: A shadow policy decided a call otherwise than the enforced one (both decisions as attributes).
SHADOW_DECISION_EVENT: Final = "proctor.shadow_decision"
#: The host was interrupted (Ctrl-C, SIGTERM) during the call: `proctor.status` unknown | cancelled.
CALL_INTERRUPTED_EVENT: Final = "proctor.call.interrupted"

# -- GenAI attributes ---------------------------------------------------------------------------
GEN_AI_OPERATION_NAME: Final = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME: Final = "gen_ai.provider.name"
GEN_AI_AGENT_NAME: Final = "gen_ai.agent.name"
GEN_AI_AGENT_ID: Final = "gen_ai.agent.id"
GEN_AI_AGENT_DESCRIPTION: Final = "gen_ai.agent.description"
GEN_AI_CONVERSATION_ID: Final = "gen_ai.conversation.id"
GEN_AI_REQUEST_MODEL: Final = "gen_ai.request.model"
GEN_AI_USAGE_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
GEN_AI_TOOL_NAME: Final = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE: Final = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
#: Opt-in (may hold secrets): only with capture_content on, and always redacted by policy first.
GEN_AI_TOOL_CALL_ARGUMENTS: Final = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT: Final = "gen_ai.tool.call.result"
#: Opt-in chat content on `chat {model}` spans: JSON lists of {role, parts: [{type, content}]}.
GEN_AI_INPUT_MESSAGES: Final = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES: Final = "gen_ai.output.messages"
#: `gen_ai.tool.type` well-known value for a function the application executes itself.
TOOL_TYPE_FUNCTION: Final = "function"

ERROR_TYPE: Final = "error.type"
#: Fallback `error.type` when nothing better is known.
ERROR_OTHER: Final = "_OTHER"

# -- GenAI metrics --------------------------------------------------------------------------------
#: Histogram, seconds: equal to the `execute_tool` span's duration.
GEN_AI_EXECUTE_TOOL_DURATION: Final = "gen_ai.execute_tool.duration"
#: Histogram, seconds: equal to the `invoke_agent` span's duration.
GEN_AI_INVOKE_AGENT_DURATION: Final = "gen_ai.invoke_agent.duration"

# -- proctor attributes ---------------------------------------------------------------------------
PROCTOR_RUN_ID: Final = "proctor.run.id"
PROCTOR_RUN_STEP: Final = "proctor.run.step"
PROCTOR_RUN_PRINCIPAL: Final = "proctor.run.principal"
#: Followed by the label name: `proctor.run.labels.env`.
PROCTOR_RUN_LABELS_PREFIX: Final = "proctor.run.labels."
PROCTOR_STEP: Final = "proctor.step"
#: Opt-in: the program the model wrote for a step (capture_content).
PROCTOR_STEP_CODE: Final = "proctor.step.code"
PROCTOR_AGENT_STATUS: Final = "proctor.agent.status"
PROCTOR_DECISION: Final = "proctor.decision"
PROCTOR_RULES: Final = "proctor.rules"
PROCTOR_REASON: Final = "proctor.reason"
PROCTOR_SIDE_EFFECT: Final = "proctor.side_effect"
PROCTOR_POLICY_SHA256: Final = "proctor.policy.sha256"
#: ok | denied | failed | timeout | unknown | cancelled (proctor.calls.CallStatus).
PROCTOR_STATUS: Final = "proctor.status"
#: Followed by `{budget}.{kind}_remaining`: `proctor.budget.outbound.calls_remaining`.
PROCTOR_BUDGET_PREFIX: Final = "proctor.budget."
PROCTOR_BUDGET_NAME: Final = "proctor.budget.name"
PROCTOR_BUDGET_KIND: Final = "proctor.budget.kind"
PROCTOR_APPROVAL_OUTCOME: Final = "proctor.approval.outcome"
PROCTOR_APPROVAL_APPROVER: Final = "proctor.approval.approver"
PROCTOR_APPROVAL_WAIT_MS: Final = "proctor.approval.wait_ms"

# -- proctor metrics ------------------------------------------------------------------------------
#: Counter of finished calls, by tool, decision, side-effect class, status and error.type.
PROCTOR_DECISIONS: Final = "proctor.decisions"
#: Histogram, seconds: how long calls waited for an approval.
PROCTOR_APPROVAL_WAIT: Final = "proctor.approval.wait"
#: Gauge: what a budget has left after the last reservation, by budget name and kind.
PROCTOR_BUDGET_REMAINING: Final = "proctor.budget.remaining"
#: Counter of agent steps, by agent name.
PROCTOR_STEPS: Final = "proctor.steps"
#: Counter of calls a shadow policy decided otherwise than the enforced one, by tool and both outcomes.
PROCTOR_SHADOW_DISAGREEMENTS: Final = "proctor.shadow.disagreements"
