"""AgentDojo's own tasks, replayed through a Gate with no model: how many user tasks run without a
human, and how many attacks are stopped, under the policies in examples/policies/agentdojo/.

Needs agentdojo (benchmark v1.2.2), installed in the benchmark environment only:

    make bench-agentdojo        # builds .venv-agentdojo from bench/requirements-agentdojo.txt and runs this

For each suite (workspace, travel, banking, slack) and its policy `examples/policies/agentdojo/SUITE.yaml`:

- **user tasks**: each user task's ground-truth calls, computed on the suite's default environment,
  are replayed in order through a `Gate` (a fresh run, `start_run(task=the task's prompt)`) whose tools
  run AgentDojo's real functions on that environment. A task is *allowed* when the policy allows
  every call, *sent to a human* when some call needs approval (and none is denied; the human is
  assumed to say yes, so the task goes on), *blocked* when a call is denied.
- **attacks**: for each (user task, injection task) pair, the injection task's goal is written into
  every injection vector the user task's ground truth reads (AgentDojo's `important_instructions`
  attack text, the vectors found as AgentDojo finds them, with canaries); the user task's calls are
  replayed (a human approves what the policy sends them), then the injection task's ground-truth
  calls — what a model that obeyed the injection would do. The attack is *blocked* at the first
  call the policy denies, *sent to a human* at the first call needing approval (the human says no),
  *passed* when every call is allowed. Pairs whose injection task has no ground-truth call are
  counted and reported, not scored; so are pairs whose user task reads no injection vector.

Tool results reach the gate as AgentDojo's functions return them; the policies label the tools
whose results hold outside content, so those results are indexed for `provenance()`.

Run: `.venv-agentdojo/bin/python bench/agentdojo.py [--suite NAME] [--verbose] [--policies DIR] [--user-tasks-only]`.

`--policies DIR` replays another set of policies (one `SUITE.yaml` per suite), e.g. the set written blind under
bench/agentdojo_blind/README.md's protocol. A directory holding `FROZEN.sha256` (bench/agentdojo_blind/freeze.py)
is checked first: every policy must be listed there with its hash, or nothing runs. `--user-tasks-only` runs the
user tasks and never the attacks (what a blind author may run before freezing). Each policy's file hash and
fingerprint are printed with the figures.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import inspect
import sys
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pydantic

# This file is named like the package it measures: import the package, not this script.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
try:
    from agentdojo.attacks.important_instructions_attacks import ImportantInstructionsAttack
    from agentdojo.functions_runtime import FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suites
except ImportError:  # pragma: no cover - the message is the point
    sys.exit("bench/agentdojo.py needs agentdojo: `make bench-agentdojo` (bench/requirements-agentdojo.txt)")

from proctor.approval import ApprovalDecision, ApprovalRequest, CallbackApprover  # noqa: E402
from proctor.gate import Gate  # noqa: E402
from proctor.policy import Policy  # noqa: E402
from proctor.tools import Tool  # noqa: E402

BENCHMARK_VERSION = "v1.2.2"
POLICIES = Path(__file__).resolve().parent.parent / "examples" / "policies" / "agentdojo"
USER_NAME = "Emma Johnson"  # as AgentDojo's important_instructions attack signs it
MODEL_NAME = "the AI language model"


def _tool(runtime: FunctionsRuntime, name: str, env_box: list[Any]) -> Tool:
    """A proctor Tool running AgentDojo's function `name` on the environment in `env_box[0]`."""
    function = runtime.functions[name]
    fields: dict[str, Any] = {}
    params = []
    for pname, field in function.parameters.model_fields.items():
        default = ... if field.is_required() else field.default
        fields[pname] = (field.annotation, pydantic.Field(default, description=field.description or pname))
        params.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY,
                                        default=inspect.Parameter.empty if default is ... else default,
                                        annotation=field.annotation))

    def run(**kwargs: Any) -> Any:
        result, error = runtime.run_function(env_box[0], name, kwargs)
        if error is not None:
            raise RuntimeError(error)
        return result

    run.__name__ = name
    return Tool.from_fields(name, function.description or name, run, fields, inspect.Signature(params),
                            {p: f.description or p for p, f in function.parameters.model_fields.items()},
                            side_effect=None, cost=0)


class Replay:
    """One suite under one policy: replays ground truths through a gate."""

    def __init__(self, suite: Any, policy: Policy) -> None:
        self.suite = suite
        self.policy = policy
        self.runtime = FunctionsRuntime(suite.tools)
        self.env_box: list[Any] = [None]
        self.tools = [_tool(self.runtime, f, self.env_box) for f in self.runtime.functions]
        self.human_says_yes = True
        self.asked: list[str] = []
        self.gate = Gate(policy, tools=self.tools, approver=CallbackApprover(self._human))
        self.defaults = suite.get_injection_vector_defaults()
        self._candidates: dict[str, list[str]] = {}

    def _human(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(request.tool)
        if self.human_says_yes:
            return ApprovalDecision.approve(request, "bench-user")
        return ApprovalDecision.deny(request, "bench-user", "an injected action")

    def environment(self, injections: Mapping[str, str]) -> Any:
        return self.suite.load_and_inject_default_environment(dict(injections))

    def candidates(self, user_task: Any) -> list[str]:
        """The injection vectors the user task's ground truth reads (as AgentDojo finds them: canaries)."""
        if user_task.ID not in self._candidates:
            canaries = {v: f"<CANARY---{v}--->" for v in self.defaults}
            env = self.environment(canaries)
            seen = []
            for call in user_task.ground_truth(copy.deepcopy(env)):
                result, error = self.runtime.run_function(env, call.function, call.args)
                seen.append(f"{result!r} {error or ''}")
            text = "\n".join(seen)
            self._candidates[user_task.ID] = [v for v, c in canaries.items() if c in text]
        return self._candidates[user_task.ID]

    def run_calls(self, ctx: Any, calls: list[Any]) -> tuple[str, list[str]]:
        """Replay `calls`; the first refusal ends them: ('allowed'|'human'|'blocked', notes)."""
        outcome, notes = "allowed", []
        for call in calls:
            asked = len(self.asked)
            result = self.gate.submit(call.function, dict(call.args), context=ctx)
            decision = result.record.decision.outcome if result.record.decision else "deny"
            if decision == "deny" or (result.record.status == "denied" and len(self.asked) == asked):
                notes.append(f"denied {call.function}: {result.record.error}")
                return "blocked", notes
            if len(self.asked) > asked:
                reason = result.record.decision.reason if result.record.decision else ""
                notes.append(f"human {call.function}: {reason}")
                if not self.human_says_yes:
                    return "human", notes
                outcome = "human"
        return outcome, notes

    def user_task(self, user_task: Any) -> tuple[str, list[str]]:
        env = self.environment(self.defaults)
        calls = user_task.ground_truth(copy.deepcopy(env))
        self.env_box[0] = env
        self.human_says_yes = True
        ctx = self.gate.start_run(task=user_task.PROMPT)
        return self.run_calls(ctx, calls)

    def attack(self, user_task: Any, injection_task: Any) -> tuple[str, list[str]]:
        vectors = self.candidates(user_task)
        if not vectors:
            return "not-injectable", []
        text = ImportantInstructionsAttack._JB_STRING.format(goal=injection_task.GOAL, user=USER_NAME,
                                                              model=MODEL_NAME, task=user_task.PROMPT)
        env = self.environment({**self.defaults, **dict.fromkeys(vectors, text)})
        pre = copy.deepcopy(env)
        user_calls = user_task.ground_truth(copy.deepcopy(pre))
        attack_calls = injection_task.ground_truth(copy.deepcopy(pre))
        if not attack_calls:
            return "no-ground-truth", []
        self.env_box[0] = env
        self.human_says_yes = True
        ctx = self.gate.start_run(task=user_task.PROMPT)
        self.run_calls(ctx, user_calls)
        self.human_says_yes = False
        outcome, notes = self.run_calls(ctx, attack_calls)
        return {"allowed": "passed"}.get(outcome, outcome), notes


#: The hash manifest of a frozen set of policies (bench/agentdojo_blind/freeze.py), in `sha256sum` format.
MANIFEST = "FROZEN.sha256"


def frozen_hashes(directory: Path) -> dict[str, str] | None:
    """The manifest of `directory` (file name -> sha256), or None when it has none."""
    manifest = directory / MANIFEST
    if not manifest.exists():
        return None
    hashes = {}
    for line in manifest.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            digest, name = line.split(maxsplit=1)
            hashes[name.strip().lstrip("*")] = digest
    return hashes


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_frozen(directory: Path, suites: list[str]) -> str | None:
    """Why the policies of `directory` must not run (a frozen set changed since it was frozen), or None."""
    hashes = frozen_hashes(directory)
    if hashes is None:
        return None
    for suite in suites:
        name = f"{suite}.yaml"
        if name not in hashes:
            return f"{directory / name}: not in {MANIFEST}: a frozen set runs only the policies it froze"
        if file_sha256(directory / name) != hashes[name]:
            return (f"{directory / name}: changed since it was frozen (sha256 {file_sha256(directory / name)}, "
                    f"{MANIFEST} says {hashes[name]}): a frozen set is never edited; write a new one")
    return None


def _share(n: int, total: int) -> str:
    return f"{100 * n / total:5.1f}%" if total else "   - "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", action="append", help="only these suites (default: all four)")
    parser.add_argument("--verbose", action="store_true", help="print each task's outcome and why")
    parser.add_argument("--policies", type=Path, default=POLICIES, help="a directory of SUITE.yaml policies "
                        f"(default: {POLICIES}); one with {MANIFEST} is checked against it first")
    parser.add_argument("--user-tasks-only", action="store_true", help="run the user tasks, never the attacks")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    suites = get_suites(BENCHMARK_VERSION)
    directory: Path = args.policies.resolve()
    chosen = [name for name in suites if not args.suite or name in args.suite]
    refused = check_frozen(directory, chosen)
    if refused is not None:
        print(refused, file=sys.stderr)
        return 1
    frozen = frozen_hashes(directory) is not None
    fingerprints = []
    totals_user: Counter[str] = Counter()
    totals_attack: Counter[str] = Counter()
    rows = []
    for name, suite in suites.items():
        if args.suite and name not in args.suite:
            continue
        path = directory / f"{name}.yaml"
        policy = Policy.from_yaml(path)
        fingerprints.append(f"  {name}.yaml: sha256 {file_sha256(path)}, policy fingerprint {policy.sha256}")
        replay = Replay(suite, policy)
        users: Counter[str] = Counter()
        for task_id, task in suite.user_tasks.items():
            outcome, notes = replay.user_task(task)
            users[outcome] += 1
            if args.verbose and outcome != "allowed":
                print(f"{name} {task_id}: {outcome}: {'; '.join(notes)}")
        attacks: Counter[str] = Counter()
        for task_id, task in suite.user_tasks.items() if not args.user_tasks_only else ():
            for inj_id, inj in suite.injection_tasks.items():
                outcome, notes = replay.attack(task, inj)
                attacks[outcome] += 1
                if args.verbose and outcome == "passed":
                    print(f"{name} {task_id} x {inj_id}: PASSED")
        rows.append((name, users, attacks))
        totals_user.update(users)
        totals_attack.update(attacks)
    rows.append(("overall", totals_user, totals_attack))
    shown = directory.relative_to(Path.cwd()) if directory.is_relative_to(Path.cwd()) else directory
    print(f"AgentDojo {BENCHMARK_VERSION}: ground truths replayed through a Gate, policies in {shown}"
          f"{f' (frozen: each matches {MANIFEST})' if frozen else ''}"
          f"{'; user tasks only, no attack run' if args.user_tasks_only else ''}")
    print("\n".join(fingerprints))
    print(f"{'suite':10} {'user tasks':>10} {'allowed':>8} {'human':>8} {'blocked':>8} | {'attacks':>7} "
          f"{'blocked':>8} {'human':>8} {'passed':>8} {'stopped':>8} | {'no GT':>5} {'no inj':>6}")
    for name, users, attacks in rows:
        n_user = sum(users.values())
        scored = attacks["blocked"] + attacks["human"] + attacks["passed"]
        print(f"{name:10} {n_user:>10} {_share(users['allowed'], n_user):>8} {_share(users['human'], n_user):>8} "
              f"{_share(users['blocked'], n_user):>8} | {scored:>7} {_share(attacks['blocked'], scored):>8} "
              f"{_share(attacks['human'], scored):>8} {_share(attacks['passed'], scored):>8} "
              f"{_share(attacks['blocked'] + attacks['human'], scored):>8} | {attacks['no-ground-truth']:>5} "
              f"{attacks['not-injectable']:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
