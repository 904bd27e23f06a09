"""baton's Python front end, tested through real worker processes.

Each test starts the workers of one scenario of workers.py (harness.py) and
checks that every worker passed its own assertions; some also check what the
workers printed.
"""
import os
import subprocess

import pytest

import harness


def test_every_call_form_future_and_rref_proxy():
    harness.check(harness.run("api", 3))


def test_every_dtype_views_and_nested_values_round_trip():
    harness.check(harness.run("dtypes", 2))


def test_every_error_class_is_raised_with_its_code_and_worker():
    harness.check(harness.run("errors", 2))


def test_a_killed_worker_raises_connection_error():
    workers = harness.run("killed", 2, timeout=60, expected_exit={1: (3,)})
    harness.check(workers, expect_rc={1: 3})
    assert workers[0].lines("DEAD") == ["reported"]


def test_blocking_calls_release_the_gil_and_nested_calls_do_not_deadlock():
    harness.check(harness.run("gil", 2))


def test_distributed_autograd_and_optimizer_match_local_torch():
    harness.check(harness.run("autograd", 2, timeout=120))


def test_ten_thousand_rrefs_leave_every_table_empty():
    workers = harness.run("rrefs_10k", 3, timeout=180)
    harness.check(workers)
    empty = workers[0].lines("EMPTY")
    assert [line.split()[0] for line in empty] == ["0", "1", "2"], workers[0].output


def test_python_calls_functions_registered_in_cpp():
    peer = os.environ.get("BATON_CPP_PEER")
    if not peer:
        pytest.skip("BATON_CPP_PEER (python/tests/cpp_peer) is not set")
    harness.check(harness.run("cpp_interop", 2, commands={1: [peer]}))


def test_parameter_server_hosted_and_used_from_python():
    workers = harness.run("ps", 2)
    harness.check(workers)
    assert workers[0].lines("CLOCK") == ["2"], workers[0].output
    assert "applied pushes 2" in workers[1].output, workers[1].output


def test_ps_example_trains_fashion_mnist_under_baton_run():
    baton_run = os.environ.get("BATON_RUN")
    if not baton_run:
        pytest.skip("BATON_RUN (the baton-run binary) is not set")
    example = os.path.join(os.path.dirname(harness.HERE), "examples", "ps_fashion_mnist.py")
    env = harness.env_for()
    out = subprocess.run(
        [baton_run, "--standalone", "--role", "ps:2", "--role", "trainer:2",
         harness.PYTHON, example], env={**env, "RANK": "", "WORLD_SIZE": ""},
        capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "RESULT OK" in text, text


def test_baton_run_starts_a_python_job_with_roles():
    baton_run = os.environ.get("BATON_RUN")
    if not baton_run:
        pytest.skip("BATON_RUN (the baton-run binary) is not set")
    env = harness.env_for()
    out = subprocess.run(
        [baton_run, "--standalone", "--role", "leader:1", "--role", "helper:2",
         harness.PYTHON, harness.WORKERS, "launched"],
        env={**env, "RANK": "", "WORLD_SIZE": ""}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "PEERS leader0,helper0,helper1" in out.stdout + out.stderr, out.stdout + out.stderr


def test_remote_layers_example_trains_fashion_mnist_under_baton_run():
    baton_run = os.environ.get("BATON_RUN")
    if not baton_run:
        pytest.skip("BATON_RUN (the baton-run binary) is not set")
    example = os.path.join(os.path.dirname(harness.HERE), "examples", "train_remote_layers.py")
    env = harness.env_for()
    out = subprocess.run(
        [baton_run, "--standalone", "--role", "trainer:1", "--role", "ps:2",
         harness.PYTHON, example], env={**env, "RANK": "", "WORLD_SIZE": ""},
        capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "RESULT OK" in text, text


def test_rl_example_learns_cartpole_with_batched_async_execution():
    baton_run = os.environ.get("BATON_RUN")
    if not baton_run:
        pytest.skip("BATON_RUN (the baton-run binary) is not set")
    example = os.path.join(os.path.dirname(harness.HERE), "examples", "rl_cartpole.py")
    env = harness.env_for()
    out = subprocess.run(
        [baton_run, "--standalone", "--role", "agent:1", "--role", "observer:3",
         harness.PYTHON, example, "--target", "150"], env={**env, "RANK": "", "WORLD_SIZE": ""},
        capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "RESULT OK" in text and "solved after" in text, text
