"""One results file per figure: what a benchmark measured, with its command, commit and machine.

    from benchmarks import record
    record.add_run(args.out, result)          # args.out from record.out_option(parser)

A results file is {"command", "commit", "machine", "runs": [...]}: the first run names the
command line (relative to the repository root) and the machine (CPU model, cores, flags that
change the kernels); every run carries its own date, commit, load average before and after,
the speed-changing environment variables it was started with (provenance.settings: {} where
every default held) and what the benchmark printed. A later run of the same command appends to
"runs", so a series of runs stays one file. Used by the scripts in benchmarks/ only; nothing in
ragspec imports it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

from ragspec.bench.provenance import commit, machine, settings

ROOT = Path(__file__).resolve().parent.parent
_STARTED_LOAD = os.getloadavg()


def out_option(parser) -> None:
    """Add --out FILE (a results file for docs/results/) to an argparse parser."""
    parser.add_argument("--out", type=Path, default=None,
                        help="append this run to a results file (JSON: command, commit, machine, "
                             "runs); e.g. docs/results/NAME.json")


def add_run(out: Path | None, result: dict, argv: list[str] | None = None) -> None:
    """Append `result` as one run of the results file `out` (nothing when out is None)."""
    if out is None:
        return
    argv = sys.argv if argv is None else argv
    script = Path(argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    command = " ".join(["PYTHONPATH=. python", str(shown), *map(shlex.quote, argv[1:])])
    run = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "commit": commit(),
           "command": command, "environment": settings(),
           "load_average": {"start": [round(x, 2) for x in _STARTED_LOAD],
                            "end": [round(x, 2) for x in os.getloadavg()]},
           "result": result}
    data = json.loads(out.read_text()) if out.exists() else {
        "command": command, "commit": run["commit"], "machine": machine(), "runs": []}
    data["runs"].append(run)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"appended to {out}", file=sys.stderr)
