"""Plant each mutation in a copy of the tree and check that the tests catch it.

    python -m tests.mutations.run            # every patch in tests/mutations/
    python -m tests.mutations.run NAME ...   # some of them (file names without .patch)
    python -m tests.mutations.run --list

A mutation is a unified diff (``git diff`` output) in ``tests/mutations/*.patch``
whose header, before the diff, says what it plants and which tests must catch it::

    # mutation: MAX_GROUPS raised to 10**6
    # tests: tests/core/test_limits.py -k groups

For each patch the runner copies the working tree (tracked and untracked files, not
ignored ones) to a temporary directory, applies the patch with ``git apply``, and
runs ``pytest`` on the listed tests there. The mutation is **caught** when pytest
reports failing tests (exit 1). It **survived** when they pass, and it is an
**error** when the patch no longer applies, nothing was collected, or the same tests
fail on the unpatched copy too (the baseline, run once per distinct selection: a
mutation is only caught by tests that pass without it).

Exit status: 0 only when every mutation was caught. Adding one is dropping a file:
``git diff > tests/mutations/my-bug.patch`` on a planted bug, revert it, and add the
header.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: Path
    what: str
    tests: tuple[str, ...]

    @classmethod
    def load(cls, path: Path) -> Mutation:
        fields: dict[str, str] = {}
        for line in path.read_text().splitlines():
            if line.startswith(("diff --git", "--- ")):
                break
            if line.startswith("#") and ":" in line:
                key, _, value = line.lstrip("# ").partition(":")
                fields[key.strip().lower()] = value.strip()
        if "tests" not in fields:
            raise SystemExit(f"{path}: the header has no '# tests: ...' line")
        return cls(
            name=path.stem,
            path=path,
            what=fields.get("mutation", path.stem),
            tests=tuple(shlex.split(fields["tests"])),
        )


def _tree_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    return [f for f in out.split("\0") if f and (ROOT / f).is_file()]


def copy_tree(dest: Path) -> None:
    """The working tree as it is now (uncommitted edits included), without .venv."""
    for rel in _tree_files():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, target)


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # the copy's packages shadow the editable install of the real tree
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _check_shadowing(tree: Path) -> None:
    probe = "import forge, workflows, activities; print(forge.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe], cwd=tree, env=_env(tree), capture_output=True, text=True
    )
    if not where.stdout.strip().startswith(str(tree)):
        raise SystemExit(f"the copy's forge package is not the one imported: {where}")


def run_tests(tree: Path, tests: tuple[str, ...], log: Path) -> tuple[int, float]:
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
            cwd=tree,
            env=_env(tree),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc.returncode, time.monotonic() - started


def apply(tree: Path, patch: Path) -> str | None:
    """None when applied, else git's complaint."""
    proc = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", str(patch)],
        cwd=tree,
        capture_output=True,
        text=True,
    )
    return None if proc.returncode == 0 else proc.stderr.strip() or proc.stdout.strip()


def _tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="patch names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--keep", action="store_true", help="keep the copies (paths printed)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unpatched runs")
    args = parser.parse_args(argv)

    patches = sorted(HERE.glob("*.patch"))
    mutations = [Mutation.load(p) for p in patches]
    if args.names:
        unknown = set(args.names) - {m.name for m in mutations}
        if unknown:
            raise SystemExit(f"no such mutation: {', '.join(sorted(unknown))}")
        mutations = [m for m in mutations if m.name in args.names]
    if args.list:
        for m in mutations:
            print(f"{m.name:32} {m.what}\n{'':32} tests: {shlex.join(m.tests)}")
        return 0
    if not mutations:
        print("no mutations in", HERE)
        return 1

    work = Path(tempfile.mkdtemp(prefix="forge-mutations-"))
    results: list[tuple[str, str, float]] = []
    baseline: dict[tuple[str, ...], tuple[int, Path]] = {}
    started = time.monotonic()
    try:
        pristine = work / "pristine"
        copy_tree(pristine)
        _check_shadowing(pristine)
        for m in mutations:
            if not args.no_baseline and m.tests not in baseline:
                log = work / f"baseline-{len(baseline)}.log"
                code, secs = run_tests(pristine, m.tests, log)
                baseline[m.tests] = (code, log)
                print(f"baseline  {shlex.join(m.tests)}: exit {code} in {secs:.1f}s", flush=True)
            if not args.no_baseline and baseline[m.tests][0] != 0:
                code, log = baseline[m.tests]
                results.append((m.name, f"error: tests fail without the mutation (exit {code})", 0))
                print(_tail(log))
                continue
            tree = work / m.name
            shutil.copytree(pristine, tree)
            problem = apply(tree, m.path)
            if problem is not None:
                results.append((m.name, f"error: patch does not apply: {problem}", 0.0))
                continue
            log = work / f"{m.name}.log"
            code, secs = run_tests(tree, m.tests, log)
            verdict = {0: "SURVIVED", 1: "caught"}.get(code, f"error: pytest exit {code}")
            results.append((m.name, verdict, secs))
            print(f"{verdict:9} {m.name} ({secs:.1f}s)", flush=True)
            if code != 1:
                print(_tail(log))
            if not args.keep:
                shutil.rmtree(tree, ignore_errors=True)
    finally:
        if args.keep:
            print("copies kept in", work)
        else:
            shutil.rmtree(work, ignore_errors=True)

    total = time.monotonic() - started
    print(f"\n{'mutation':32} {'verdict':10} seconds")
    for name, verdict, secs in results:
        print(f"{name:32} {verdict:10} {secs:6.1f}")
    caught = sum(v == "caught" for _, v, _ in results)
    print(f"\n{caught}/{len(results)} mutations caught in {total:.0f}s")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
