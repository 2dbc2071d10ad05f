"""Running the three parts of a durable run in three processes, and reading what they left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from durable_tools import count

from proctor.policy.approvers import os_account

HERE = Path(__file__).parent
PROC_TIMEOUT = 240


def policy_dict(**tools: Any) -> dict[str, Any]:
    """look is allowed, send to @example.com is allowed, send elsewhere needs a human; note is allowed."""
    return {
        "version": 1,
        "default": "deny",
        "tools": tools,
        "rules": [
            {"name": "reads", "match": {"side_effect": ["none", "read"]}, "decision": "allow"},
            {"name": "notes", "match": {"tool": "note"}, "decision": "allow"},
            {"name": "internal-mail", "match": {"tool": "send"}, "when": "args.to.endsWith('@example.com')",
             "decision": "allow"},
            {"name": "external-mail", "match": {"tool": "send"}, "when": "!args.to.endsWith('@example.com')",
             "decision": "require_approval", "reason": "mail leaving the company needs a human"},
        ],
        # The tests answer through the store CLI as this OS account, `--as` the approvers they name.
        "approval": {"os_users": {os_account(): {"as": ["bob", "carol", "alice"]}}},
    }


@dataclass
class Durable:
    """One test's store, audit log, policy and counter, and the processes that use them."""

    tmp: Path

    @property
    def store(self) -> str:
        return f"sqlite:///{self.tmp}/runs.db"

    @property
    def audit(self) -> Path:
        return self.tmp / "audit.jsonl"

    @property
    def counter(self) -> Path:
        return self.tmp / "effects.jsonl"

    def policy(self, data: dict[str, Any] | None = None, name: str = "policy.yaml") -> Path:
        path = self.tmp / name
        path.write_text(yaml.safe_dump(data or policy_dict()))
        return path

    def env(self, **extra: str) -> dict[str, str]:
        # PROCTOR_AUDIT: the runs' trail, so that `proctor approvals` seals its answers with its key (as a
        # user of `proctor run` has it set).
        env = {**os.environ, "DURABLE_COUNTER": str(self.counter), "PROCTOR_AUDIT": str(self.audit), **extra}
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env

    def process(self, action: str, script: dict[str, Any], policy: Path, run_id: str = "",
                crash: str | None = None) -> dict[str, Any] | None:
        """Run one driver process; its RunResult as a dict, or None when it was SIGKILLed as asked."""
        if crash and ":" not in crash:  # a point between the tools' calls: the driver kills itself there
            script = {**script, "crash": crash}
        path = self.tmp / f"script-{action}-{len(list(self.tmp.glob('script-*')))}.json"
        path.write_text(json.dumps(script))
        argv = [sys.executable, str(HERE / "durable_driver.py"), action, self.store, str(self.audit), str(policy),
                str(path)] + ([run_id] if run_id else [])
        env = self.env(DURABLE_CRASH=crash) if crash and ":" in crash else self.env()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROC_TIMEOUT, env=env, cwd=self.tmp)
        if done.returncode == -9:
            return None
        assert done.returncode == 0, done.stderr[-3000:]
        result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return result

    def cli(self, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        """`proctor …` in its own process."""
        done = subprocess.run([sys.executable, "-m", "proctor.cli", *args], capture_output=True, text=True,
                              timeout=PROC_TIMEOUT, env=self.env(), cwd=self.tmp)
        assert done.returncode == expect, (done.returncode, done.stdout, done.stderr)
        return done

    def pending(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = json.loads(self.cli("approvals", "list", "--store", self.store, "--json").stdout)
        return out

    def effects(self, tool: str | None = None) -> list[list[Any]]:
        return [e for e in count(str(self.counter)) if tool is None or e[0] == tool]

    def kinds(self) -> list[str]:
        return [json.loads(line)["kind"] for line in self.audit.read_text().splitlines() if line.strip()]

    def records(self, kind: str) -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in self.audit.read_text().splitlines() if line.strip()]
        return [r for r in lines if r["kind"] == kind]

    def verify(self, *, crashed: bool = False) -> None:
        """`proctor audit verify` passes on the log, with no run, intent or approval left open.

        `--strict` also fails on `recovery` records, which a log whose writer was killed
        rightly holds; after a crash the open items are checked in the JSON report instead."""
        if not crashed:
            done = self.cli("audit", "verify", str(self.audit), "--strict")
            assert "intact" in done.stdout, done.stdout
            return
        report = json.loads(self.cli("audit", "verify", str(self.audit), "--json").stdout)
        assert report["failure"] is None, report
        assert report["dangling_intents"] == [] and report["unfinished_runs"] == [], report
        assert report["unresolved_approvals"] == [], report
