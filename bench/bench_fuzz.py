"""The long fuzz run: schemathesis on every API operation and hypothesis on every parser, with many
more (and fresh, unseeded) inputs than the bounded run in ``make test``.

Same code as tests/fuzz (the hub app as ``gpuscope hub`` builds it; the property tests of
tests/fuzz/test_parsers_fuzz.py under the ``gpuscope-long`` profile). Prints requests fuzzed per
status, inputs tried per parser, and every failure with what reproduces it; exits non-zero on any.
There is no outside anchor to compare with: the figure is the count of failures, which must be 0.

usage: python bench/bench_fuzz.py [--api-examples 100] [--parser-examples 1000] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from hypothesis import settings

from common import print_table
from fuzz.apifuzz import fuzz_api, hub_app
from fuzz.budget import TRIED


def fuzz_parsers(examples: int) -> tuple[dict[str, float], list[str]]:
    """Every property test of the parsers with ``examples`` inputs each; (seconds per test, failures)."""
    settings.register_profile("bench", settings.get_profile("gpuscope-long"), max_examples=examples)
    settings.load_profile("bench")
    # imported only now: @given reads the default settings when it decorates
    test_parsers_fuzz = importlib.import_module("fuzz.test_parsers_fuzz")
    seconds: dict[str, float] = {}
    failures: list[str] = []
    for name in sorted(vars(test_parsers_fuzz)):
        test = getattr(test_parsers_fuzz, name)
        if not name.startswith("test_") or not hasattr(test, "hypothesis"):
            continue
        t0 = time.perf_counter()
        try:
            test()
        except Exception as exc:  # reported below; the run goes on to the next parser
            failures.append(f"{name}: {exc}")
        seconds[name] = time.perf_counter() - t0
    return seconds, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api-examples", type=int, default=100, help="valid and invalid requests per operation")
    ap.add_argument("--parser-examples", type=int, default=1000, help="inputs per property test")
    ap.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = ap.parse_args()

    t0 = time.perf_counter()
    with hub_app() as app:
        api = fuzz_api(app, args.api_examples, seed=None)
    api_s = time.perf_counter() - t0
    parser_s, parser_failures = fuzz_parsers(args.parser_examples)

    statuses = ", ".join(f"{s}: {n}" for s, n in sorted(api.statuses.items()))
    print_table(
        "API fuzzing (schemathesis, every operation of /openapi.json, in process)",
        ["operations", "requests", "statuses", "failures", "seconds"],
        [[str(len(api.operations)), str(api.total), statuses, str(len(api.failures)), f"{api_s:.0f}"]],
    )
    print_table(
        "Parser fuzzing (hypothesis property tests)",
        ["parser", "inputs tried"],
        [[name, str(n)] for name, n in sorted(TRIED.items())]
        + [["all", f"{sum(TRIED.values())} in {sum(parser_s.values()):.0f} s"]],
    )
    failures = api.failures + parser_failures
    for failure in failures:
        print(f"\nFAILURE {failure}", file=sys.stderr)
    print(f"failures found: {len(failures)}")
    if args.json:
        doc: dict[str, Any] = {
            "api": {
                "operations": len(api.operations),
                "requests": api.total,
                "statuses": {str(k): v for k, v in api.statuses.items()},
                "failures": api.failures,
            },
            "parsers": {"inputs": dict(TRIED), "seconds": parser_s, "failures": parser_failures},
        }
        args.json.write_text(json.dumps(doc, indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
