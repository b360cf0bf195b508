"""python -m bench <scenario> [options]: run one benchmark and write its result to
bench/results/; python -m bench report: regenerate the docs' tables from the results."""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench import report, scenarios
from bench.driver import results

# The driver's own options, beside each scenario's; not recorded as its arguments.
DRIVER_OPTIONS = ("command", "results", "save", "conditions")


def parser_for(chosen: str | None) -> argparse.ArgumentParser:
    """The CLI; only the chosen scenario's module is imported to add its options."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="scenario", required=True)
    for name in scenarios.NAMES:
        text = scenarios.docstring(name)
        sub = commands.add_parser(
            name, help=text.splitlines()[0], description=text, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        if name == chosen:
            scenarios.load(name).add_arguments(sub)
            sub.add_argument("--results", type=Path, default=results.RESULTS, help="where the result file goes")
            sub.add_argument("--no-save", dest="save", action="store_false", help="print the figures only")
            sub.add_argument(
                "--conditions",
                default="",
                help='what else ran, as the docs should say it (e.g. "busy machine", "quiet")',
            )
    sub = commands.add_parser("report", help=report.__doc__.splitlines()[0], description=report.__doc__)
    report.add_arguments(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((word for word in argv if not word.startswith("-")), None)
    args = parser_for(chosen).parse_args(argv)
    if args.command == "report":
        report.run(args)
        return
    started, load = datetime.now(UTC), [round(os.getloadavg()[0], 2)]
    outcome = scenarios.load(args.command).run(args)
    if not args.save:
        return
    arguments = {key: value for key, value in vars(args).items() if key not in DRIVER_OPTIONS}
    result = results.record(args.command, arguments, outcome, args.conditions, started, load)
    print(f"result: {results.write(result, args.results)}")


if __name__ == "__main__":
    main()
