"""Runs PyTorch's RPC test suites against baton (drop-in mode) or against
torch's own agent, and reports per suite.

    python3 run.py [--agent baton|torch] [--cuda] [--filter REGEX] [--json OUT]
                   [--reference torch.json] [--table docs/conformance.md]
                   [--min-share FRACTION] [--start auto|forkserver|spawn]

The suites are upstream's test/distributed/rpc/test_tensorpipe_agent.py's
(rpc_utils.GENERIC_TESTS + TENSORPIPE_TESTS) or, with --cuda, its
cuda/test_tensorpipe_agent.py's (GENERIC_CUDA_TESTS + TENSORPIPE_CUDA_TESTS;
without a GPU every test is skipped, with one GPU those that need two are).
Each test is torch's own MultiProcessTestCase: world_size processes, forked
from a fork server that imported the suites once (--start spawn: a fresh
interpreter each, upstream's way; with --cuda, --start auto spawns them where
the fork server's children cannot use the GPU), bounded by
DISTRIBUTED_TESTS_DEFAULT_TIMEOUT seconds (set here: --timeout, 60). --json
writes every test's outcome; --table, given the torch run's JSON as
--reference, writes the per-suite table (pass, fail, error, listed; and how
many of the tests that pass under torch pass on baton). The reference
defaults to the committed outcomes of `--agent torch` on a CPU machine for
the torch this Python imports: torch_reference.json for Debian's 1.13,
torch_reference_<major.minor>.json for another release (rerun it with --json
after a torch upgrade). With --cuda there is no committed reference: run
`--agent torch --cuda --json torch_cuda.json` first, then
`--agent baton --cuda --reference torch_cuda.json --table table.md`. The
outcome counts are printed in any case, and with a reference (given, or the
default one where --table or --min-share asks for it) on baton the table and
how many of the tests that pass under torch pass on baton. Exit status 0 when
every test ran and, with --min-share, at least that fraction of the tests
that pass under torch passed on baton (failures are otherwise results here);
2 when the reference cannot be used (checked before any test runs).
"""
import argparse
import collections
import json
import os
import re
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def default_reference():
    """The committed torch run for the torch this Python imports: Debian's
    1.13 in torch_reference.json, another release in
    torch_reference_<major.minor>.json (its suites differ)."""
    import torch
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    name = "torch_reference.json" if release == "1.13" else f"torch_reference_{release}.json"
    return os.path.join(HERE, name)


class _Recorder(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}
        self.details = {}
        self._started = {}

    def startTest(self, test):
        self._started[test.id()] = time.monotonic()
        super().startTest(test)

    def _put(self, test, outcome, detail=""):
        self.outcomes[test.id()] = outcome
        seconds = time.monotonic() - self._started.get(test.id(), time.monotonic())
        self.details[test.id()] = {"detail": detail[-2000:], "seconds": round(seconds, 1)}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._put(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._put(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._put(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._put(test, "listed" if reason.startswith("listed: ") else "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._put(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._put(test, "fail", "unexpected success")


def _tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _tests(t)
        else:
            yield t


def table(results, reference, suite_of):
    """The markdown table: per suite, baton's outcomes and the share of the
    tests that pass under torch that pass on baton."""
    rows = collections.OrderedDict()
    for test_id in sorted(set(results) | set(reference)):
        suite = suite_of(test_id)
        r = rows.setdefault(suite, collections.Counter())
        outcome = results.get(test_id, "not run")
        r[outcome] += 1
        if reference.get(test_id) == "pass":
            r["torch pass"] += 1
            if outcome == "pass":
                r["both pass"] += 1
    cols = ["pass", "fail", "error", "listed", "skipped", "not run"]
    lines = ["| suite | " + " | ".join(cols) + " | pass under torch | of those, pass on baton |",
             "| --- |" + " ---: |" * (len(cols) + 2)]
    total = collections.Counter()
    for suite, r in rows.items():
        total.update(r)
        share = f"{r['both pass']} ({100.0 * r['both pass'] / r['torch pass']:.0f}%)" \
            if r["torch pass"] else "-"
        lines.append(f"| {suite} | " + " | ".join(str(r[c]) for c in cols) +
                     f" | {r['torch pass']} | {share} |")
    share = f"{total['both pass']} ({100.0 * total['both pass'] / total['torch pass']:.1f}%)" \
        if total["torch pass"] else "-"
    lines.append("| **all** | " + " | ".join(f"**{total[c]}**" for c in cols) +
                 f" | **{total['torch pass']}** | **{share}** |")
    return "\n".join(lines) + "\n"


def load_reference(path, cuda):
    """The reference run's outcomes, or None (with the reason printed) when
    it is missing or of the other mode (a CPU run against --cuda)."""
    try:
        with open(path) as f:
            reference = json.load(f)
    except (OSError, ValueError) as e:
        print(f"conformance: reference {path}: {e}", file=sys.stderr, flush=True)
        return None
    if bool(reference.get("cuda", False)) != cuda:
        mode = lambda c: "--cuda" if c else "CPU"  # noqa: E731
        print(f"conformance: reference {path} is a {mode(reference.get('cuda', False))} run, "
              f"this is a {mode(cuda)} run", file=sys.stderr, flush=True)
        return None
    return reference["outcomes"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agent", choices=["baton", "torch"], default="baton")
    ap.add_argument("--cuda", action="store_true",
                    help="run the CUDA suites (GENERIC_CUDA_TESTS + TENSORPIPE_CUDA_TESTS)")
    ap.add_argument("--filter", default="", help="regex over test ids")
    ap.add_argument("--timeout", type=int, default=60, help="seconds per test")
    ap.add_argument("--json", help="write every test's outcome here")
    ap.add_argument("--reference", default=None,
                    help="the torch run's --json (default: the committed one for this torch; "
                         "none with --cuda)")
    ap.add_argument("--table", help="write the per-suite markdown table here")
    ap.add_argument("--min-share", type=float, default=None,
                    help="fail unless this fraction of the reference's passing tests pass")
    ap.add_argument("--start", choices=["auto", "forkserver", "spawn"], default="auto",
                    help="how the workers start (auto: forkserver, or spawn with --cuda where "
                         "the fork server's children cannot use the GPU)")
    args = ap.parse_args()

    # The reference is read before any test runs: a missing one is no
    # reason to lose a whole run's time.
    reference = None
    if args.agent == "baton":
        explicit = args.reference is not None
        if not explicit and not args.cuda:
            args.reference = default_reference()
        if explicit or (args.reference and (args.table or args.min_share is not None)):
            reference = load_reference(args.reference, args.cuda)
            if reference is None and (explicit or args.min_share is not None):
                return 2
        if reference is None and args.min_share is not None:
            print("conformance: --min-share needs a reference (--reference: the torch run's "
                  "--json)", file=sys.stderr, flush=True)
            return 2

    os.environ["BATON_CONFORMANCE_AGENT"] = args.agent
    os.environ["BATON_CONFORMANCE_CUDA"] = "1" if args.cuda else "0"
    if args.cuda:
        # torch.cuda.is_available() from NVML: without it, importing torch's
        # testing modules initialises CUDA in the fork server (suites.py).
        os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    os.environ["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
    os.environ["RPC_INIT_WITH_TCP"] = "1"
    # The spawned test processes import suites.py by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    sys.path.insert(0, HERE)
    # The pytest suite's harness, for its free_port (suites.py, in this
    # process only); last, so that none of its modules shadows another.
    sys.path.append(os.path.dirname(HERE))
    if args.agent == "baton":
        from baton import torch_rpc
        torch_rpc.install()
    import torch
    import suites

    loaded = unittest.defaultTestLoader.loadTestsFromModule(suites)
    pattern = re.compile(args.filter) if args.filter else None
    chosen = unittest.TestSuite(t for t in _tests(loaded)
                                if pattern is None or pattern.search(t.id()))
    mode = " --cuda" if args.cuda else ""
    start = "forkserver" if args.start == "auto" else args.start
    gpus = torch.cuda.device_count() if args.cuda else 0
    if args.cuda and args.start == "auto" and gpus > 0 and chosen.countTestCases() > 0 \
            and not suites.fork_server_children_use_cuda():
        print("conformance: a process forked from the fork server cannot use CUDA (CUDA "
              "initialised in the fork server, or the error above); the workers start with "
              "spawn", flush=True)
        start = "spawn"
    suites.START = start
    print(f"conformance: {chosen.countTestCases()} tests, agent {args.agent}{mode}, "
          f"torch {torch.__version__}" + (f", {gpus} GPU(s)" if args.cuda else "") +
          f", workers by {start}" +
          (", expecttest: suites.py's stand-in" if suites.EXPECTTEST_STANDIN else ""), flush=True)
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=2, stream=sys.stdout)
    started = time.monotonic()
    result = runner.run(chosen)
    print(f"conformance: {time.monotonic() - started:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"agent": args.agent, "cuda": args.cuda, "torch": torch.__version__,
                       "outcomes": result.outcomes, "details": result.details},
                      f, indent=1, sort_keys=True)
    counts = collections.Counter(result.outcomes.values())
    print(f"conformance: agent {args.agent}{mode}: {len(result.outcomes)} tests: " +
          ", ".join(f"{counts[o]} {o}" for o in ("pass", "fail", "error", "skipped", "listed")),
          flush=True)
    strip = re.compile(r"^suites\.(Baton|TensorPipe)")
    norm = lambda d: {strip.sub("suites.", k): v for k, v in d.items()}  # noqa: E731
    status = 0
    if args.agent == "baton" and (reference is not None or args.table):
        reference = norm(reference or {})
        results = norm(result.outcomes)
        text = table(results, reference,
                     lambda t: re.sub(r"WithSpawn$", "", t.split(".")[-2]))
        print(text)
        if args.table:
            with open(args.table, "w") as f:
                f.write(text)
        if reference:
            # With --filter, the reference's tests that this run chose.
            torch_pass = [t for t, o in reference.items() if o == "pass" and t in results]
            both = sum(1 for t in torch_pass if results.get(t) == "pass")
            share = both / len(torch_pass) if torch_pass else 1.0
            print(f"conformance: {both} of {len(torch_pass)} tests that pass under torch "
                  f"pass on baton ({share:.1%}" +
                  (f"; required {args.min_share:.1%})" if args.min_share is not None else ")"),
                  flush=True)
            if args.min_share is not None and share < args.min_share:
                status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
