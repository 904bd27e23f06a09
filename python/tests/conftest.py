"""Bazel test sharding for the pytest suite (python:python_test's shard_count).

Bazel runs a sharded test once per shard with TEST_TOTAL_SHARDS and
TEST_SHARD_INDEX set, and TEST_SHARD_STATUS_FILE naming a file the runner
touches to say it shards. Each shard keeps every TEST_TOTAL_SHARDS-th test of
the collected order, so the shards together run each test exactly once.
Without those variables (pytest run by hand, the wheel's checks) every test
runs.

SIGTERM (Bazel's timeout, CI stopping a stage at its budget) ends pytest
through SystemExit, so that the harness's `finally` blocks kill the workers
it started in sessions of their own (harness.py), which the signal does not
reach.
"""
import os
import signal
import sys


def _exit_on_sigterm(signum, frame):
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, _exit_on_sigterm)


def pytest_collection_modifyitems(config, items):
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    if total <= 1:
        return
    index = int(os.environ["TEST_SHARD_INDEX"])
    status = os.environ.get("TEST_SHARD_STATUS_FILE")
    if status:
        with open(status, "a"):
            pass
    keep, drop = [], []
    for i, item in enumerate(items):
        (keep if i % total == index else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
