"""`agent.run(task, stream=True)`: the run's steps and calls as they happen, then its result.

The run itself is the ordinary one (`AgentBase.run`), carried out in a worker thread; its
step callback and the run context's call hook put what happens on a queue the caller reads.
So a streamed run decides, audits and traces exactly as a plain one, and ends with the same
`RunResult`.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from proctor.agent.result import RunResult, StepRecord
from proctor.calls import CallRecord

if TYPE_CHECKING:
    from proctor.agent.base import AgentBase

__all__ = ["CallEvent", "StreamEvent", "stream_run"]


@dataclass(frozen=True)
class CallEvent:
    """One tool call of a streamed run, yielded as soon as the gate has its outcome.

    `step` is the action step whose program (or function call) made it; `call` is the same
    `CallRecord` the step will list: tool, redacted arguments, decision, approval, status.
    """

    step: int
    call: CallRecord

    @property
    def refused(self) -> bool:
        """The gate refused it (policy, approval, budget or validation): the tool never ran."""
        return self.call.status == "denied"


#: What `run(task, stream=True)` yields: steps and calls in the order they happen, then one `RunResult`.
StreamEvent = Union[StepRecord, CallEvent, RunResult]  # noqa: UP007 - a runtime alias, readable in docs

_DONE = object()


def stream_run(agent: AgentBase, run: Callable[[], RunResult]) -> Iterator[StreamEvent]:
    """Run `run` (a plain `agent.run`) in a thread and yield its steps and calls, then its result.

    Leaving the loop early (``break``, an exception in the caller) waits for the run to end:
    it is never left half-done behind the caller's back, and its audit trail is complete.
    An exception the run raises (an interrupt, a store that cannot be opened) is raised here.
    """
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    failure: list[BaseException] = []

    def on_call(step: int, record: CallRecord) -> None:
        events.put(CallEvent(step, record))

    def work() -> None:
        try:
            events.put(run())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            failure.append(exc)
        finally:
            events.put(_DONE)

    def gen() -> Iterator[StreamEvent]:
        agent.step_callbacks.append(events.put)
        agent.call_listeners.append(on_call)
        # The caller's context (its current span, for one) is the run's context too.
        thread = threading.Thread(target=contextvars.copy_context().run, args=(work,),
                                  name=f"proctor-stream-{agent.name}", daemon=True)
        try:
            thread.start()
            while (item := events.get()) is not _DONE:
                if isinstance(item, (StepRecord, CallEvent, RunResult)):
                    yield item
            if failure:
                raise failure[0]
        finally:
            thread.join()
            agent.step_callbacks.remove(events.put)
            agent.call_listeners.remove(on_call)

    return gen()
