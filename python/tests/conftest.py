"""Bazel test sharding for the pytest suite (python:python_test's shard_count).

Bazel runs a sharded test once per shard with TEST_TOTAL_SHARDS and
TEST_SHARD_INDEX set, and TEST_SHARD_STATUS_FILE naming a file the runner
touches to say it shards. Each shard keeps every TEST_TOTAL_SHARDS-th test of
the collected order, so the shards together run each test exactly once.
Without those variables (pytest run by hand, the wheel's checks) every test
runs.
"""
import os


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
