"""Runs an alert's playbook when it fires and attaches the results (``details["playbook"]``).

The attached document keeps the playbook's four parts; every diagnosis step carries its check's
result when data could answer it. A one-line ``diagnosis`` collects what the checks found, so a
notification can lead with it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any

from gpuscope.alert.checks import CHECKS, CheckResult, Context, Reads
from gpuscope.alert.playbooks import PLAYBOOKS
from gpuscope.counters import Counters
from gpuscope.model import Alert
from gpuscope.rules import RULES

log = logging.getLogger("gpuscope.alert.triage")


def run_playbook(
    alert: Alert, reads: Reads, now: float, firing: list[Alert], counters: Counters | None = None
) -> dict[str, Any]:
    """Evaluate the rule's playbook for ``alert`` as of ``now``, reading the store through
    ``reads`` (shared with the playbooks of alerts that fired with it); returns the document to
    attach."""
    book = PLAYBOOKS[alert.rule]
    # the checks read a copy of the details: the evaluation may refresh them meanwhile
    ctx = Context(replace(alert, details=dict(alert.details)), reads.store, now, firing, shared=reads)
    steps: list[dict[str, Any]] = []
    found: list[str] = []
    started = time.perf_counter()
    for step in book.diagnosis:
        entry: dict[str, Any] = {"step": step.text}
        if step.check is not None:
            try:
                result = CHECKS[step.check](ctx)
            except Exception as exc:  # a check must never stop an alert from firing
                if counters is not None:
                    counters.inc("playbook_check_errors")
                log.exception("playbook check %s failed for %s", step.check, alert.id)
                result = CheckResult("unknown", f"check failed: {type(exc).__name__}")
            entry.update(check=step.check, status=result.status, result=result.text, data=result.data)
            if result.status == "found":
                found.append(result.text)
        steps.append(entry)
    return {
        "meaning": RULES[alert.rule].meaning,
        "impact": book.impact,
        "diagnosis": steps,
        "mitigation": list(book.mitigation),
        "summary": "; ".join(found),
        "evaluated_at": now,
        "seconds": round(time.perf_counter() - started, 4),
    }
