"""baton's Python front end, tested through real worker processes.

Each test starts the workers of one scenario of workers.py (harness.py) and
checks that every worker passed its own assertions; some also check what the
workers printed.
"""
import os
import subprocess

import pytest

import harness


def run_under_baton_run(roles, program, *args, timeout=300, launcher_args=()):
    """Runs `program` (a file under python/) with baton-run --standalone and
    the given roles ("ps:2", ...); returns its combined output, asserting it
    exited 0."""
    baton_run = os.environ.get("BATON_RUN")
    if not baton_run:
        pytest.skip("BATON_RUN (the baton-run binary) is not set")
    path = os.path.join(os.path.dirname(harness.HERE), program)
    argv = [baton_run, "--standalone", *launcher_args]
    for role in roles:
        argv += ["--role", role]
    env = {**harness.env_for(), "RANK": "", "WORLD_SIZE": ""}
    out = subprocess.run(argv + [harness.PYTHON, path, *args], env=env, capture_output=True,
                         text=True, timeout=timeout)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    return text


def test_every_call_form_future_and_rref_proxy():
    harness.check(harness.run("api", 3))


def test_every_dtype_views_and_nested_values_round_trip():
    harness.check(harness.run("dtypes", 2))


def test_device_maps_reach_the_agent_and_are_checked_at_init():
    harness.check(harness.run("device_maps", 2))



def test_remote_module_parses_its_device_as_torch_and_returns_results_whole():
    harness.check(harness.run("remote_module_devices", 2))


def require_a_cuda_device():
    """Skips a CUDA case where this (the pytest) process sees no CUDA device;
    its two workers share cuda:0."""
    import torch
    if torch.cuda.device_count() == 0:
        pytest.skip("no CUDA device is visible (torch.cuda.device_count() == 0): this case "
                    "needs one GPU, shared by its two workers")


def test_cuda_tensors_travel_through_rpc_sync_and_remote_with_device_maps():
    """Device map {0: 0} set by the caller (worker0) only: float32, a
    non-contiguous view, bfloat16 and int64 CUDA tensors arrive on the
    callee's cuda:0 through rpc_sync, rpc_async and remote(), and its CUDA
    results come back to cuda:0 (the inverse map) with their values; a CPU
    tensor beside a CUDA one stays on the CPU; a call to itself keeps the
    device; worker1, with no map of its own, sends to worker0's cuda:0."""
    require_a_cuda_device()
    harness.check(harness.run("cuda_tensors", 2, timeout=180))


def test_a_cuda_tensor_with_no_device_map_fails_naming_device_and_worker():
    """No device map on either worker: a CUDA tensor sent to the other
    worker (argument or result) fails the call with "cannot send a tensor
    on device cuda:0 to worker '...': no device map applies"; calls to
    itself and CPU tensors still work (docs/cuda.md, "No map, no send")."""
    require_a_cuda_device()
    harness.check(harness.run("cuda_no_map", 2, timeout=180))


def test_distributed_autograd_and_optimizer_on_cuda_parameters():
    """Device map {0: 0} set by both workers: an nn.Linear on worker1's
    cuda:0 (in an RRef) and a CUDA parameter on worker0; distributed
    autograd's gradients equal local autograd's on worker0's GPU, the
    DistributedOptimizer's 3 SGD steps equal torch.optim.SGD's there, and a
    RemoteModule on "worker1/cuda:0" learns."""
    require_a_cuda_device()
    harness.check(harness.run("cuda_autograd", 2, timeout=180))


def test_module_binding_trains_a_cuda_module():
    """No device map (nothing on the GPU travels): a server hosted by
    worker1, worker0's module on cuda:0 bound to it; after every pull the
    parameters on the GPU equal the server's host values, 20 steps follow
    torch.optim.SGD on the GPU, and the loss goes down."""
    require_a_cuda_device()
    workers = harness.run("cuda_ps", 2, timeout=180)
    harness.check(workers)
    assert len(workers[0].lines("LOSS")) == 1, workers[0].output


def test_init_rpc_after_init_process_group_on_the_same_master_port():
    harness.check(harness.run("after_process_group", 3))


def test_shutdown_runs_torchs_replaceable_steps_and_reports_leaked_rrefs():
    harness.check(harness.run("shutdown_steps", 3, timeout=120))


def test_every_error_class_is_raised_with_its_code_and_worker():
    harness.check(harness.run("errors", 2))


def test_workers_join_a_dynamic_group_one_by_one_and_leave_it_alone():
    workers = harness.run("dynamic", 3, timeout=120)
    harness.check(workers)
    assert workers[0].lines("MEMBERS") == ["worker0,worker1,worker2"]
    assert workers[0].lines("LEFT") == ["True"]


def test_a_group_call_reaches_every_member_through_a_tree():
    script = os.path.join(harness.HERE, "group_workers.py")
    workers = harness.run("group", 5, timeout=120,
                          commands={r: [harness.PYTHON, script, "group"] for r in range(5)})
    harness.check(workers)
    assert workers[0].lines("FAILED") == ["worker2"]
    assert workers[0].lines("TIMED_OUT") == ["worker1"]
    assert workers[0].lines("LEFT_OUT") == ["worker2"]


def test_a_supervisor_restarts_a_hung_member_and_drops_another_under_baton_run():
    text = run_under_baton_run(["boss:1", "member:3"], "tests/group_workers.py", "supervised",
                               timeout=240, launcher_args=["--max_restarts", "1",
                                                          "--restart_policy", "member=worker",
                                                          "--stop_timeout", "5"])
    assert "HUNG member0" in text, text
    assert "RESTARTED member0 2" in text, text
    assert "DROPPED member1" in text, text
    assert "dropped at the request of rank 0: not needed" in text, text
    assert "all workers succeeded" in text, text


def test_a_killed_worker_raises_connection_error():
    workers = harness.run("killed", 2, timeout=60, expected_exit={1: (3,)})
    harness.check(workers, expect_rc={1: 3})
    assert workers[0].lines("DEAD") == ["reported"]


def test_blocking_calls_release_the_gil_and_nested_calls_do_not_deadlock():
    harness.check(harness.run("gil", 2))


def test_distributed_autograd_and_optimizer_match_local_torch():
    harness.check(harness.run("autograd", 2, timeout=120))


def test_ddp_averages_gradients_under_distributed_autograd():
    port = str(harness.free_port())
    harness.check(harness.run("ddp_under_dist_autograd", 3, timeout=120,
                              extra_env={"DDP_PORT": port}))


def test_rpc_profiler_merges_the_callees_events_into_the_callers_profile():
    harness.check(harness.run("profiler", 2))


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
    text = run_under_baton_run(["ps:2", "trainer:2"], "examples/ps_fashion_mnist.py")
    assert "RESULT OK" in text, text


def test_baton_run_starts_a_python_job_with_roles():
    text = run_under_baton_run(["leader:1", "helper:2"], "tests/workers.py", "launched",
                               timeout=120)
    assert "PEERS leader0,helper0,helper1" in text, text


def test_baton_run_restarts_a_python_worker_that_rejoins_the_running_job():
    text = run_under_baton_run(["leader:1", "helper:2"], "tests/workers.py", "restarts",
                               timeout=180, launcher_args=["--max_restarts", "1",
                                                          "--restart_policy", "helper=worker"])
    assert "REJOINED incarnation 2" in text, text


def test_remote_layers_example_trains_fashion_mnist_under_baton_run():
    text = run_under_baton_run(["trainer:1", "ps:2"], "examples/train_remote_layers.py")
    assert "RESULT OK" in text, text


def test_rl_example_learns_cartpole_with_batched_async_execution():
    text = run_under_baton_run(["agent:1", "observer:3"], "examples/rl_cartpole.py",
                               "--target", "150")
    assert "RESULT OK" in text and "solved after" in text, text

def test_rl_broadcast_example_learns_while_its_supervisor_restarts_a_hung_observer():
    """The learner broadcasts each policy through a group; observer0 hangs in
    round 3, the supervisor has baton-run restart it, and training goes on."""
    text = run_under_baton_run(["learner:1", "observer:6"], "examples/rl_broadcast.py",
                               "--target", "150", "--hang_at", "3", "--hung_after", "2",
                               timeout=300, launcher_args=["--restart_policy", "observer=worker",
                                                          "--max_restarts", "2",
                                                          "--stop_timeout", "5"])
    assert "RESULT OK" in text, text
    assert "observer observer0 (incarnation 1) hung" in text, text
    assert "restart of rank 1 asked by rank 0: __main__.play hung" in text, text
    assert "observers left out (observer0)" in text, text
    assert "restarting that worker alone" in text, text


def test_drop_in_mode_runs_a_torch_rpc_program_unchanged():
    """`python3 -m baton.torch_rpc PROGRAM`: a program that imports only
    torch.distributed.rpc, .autograd and .optim runs on baton, in its
    spawned workers too, and computes what it computes under torch,
    TorchScript functions that call rpc_async and remote included."""
    program = os.path.join(harness.HERE, "torch_rpc_program.py")
    out = subprocess.run([harness.PYTHON, "-m", "baton.torch_rpc", program,
                          str(harness.free_port())],
                         env=harness.env_for(), capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "MODULE baton.rpc baton.distributed.autograd baton.distributed.optim" in text, text
    assert "SYNC 9.0" in text and "ASYNC 16.0" in text, text
    assert "TRAINED 4.5" in text, text  # w = 2 - 0.5 * 1 on each of 3 entries
    # TorchScript's own rpc_async and remote, and a scripted callee's error.
    assert "SCRIPT RPC_ASYNC 10.0" in text and "SCRIPT REMOTE 6.0" in text, text
    assert "SCRIPT ERROR True" in text, text
    # Scripted RPCs on TorchScript's fork and continuation threads are
    # recorded in baton's context; scripted backward and get_gradients.
    assert "SCRIPT AUTOGRAD [9.0, 16.0] [6.0, 16.0]" in text, text
    # RRefs made from Python in scripted code: to_here() of a user's
    # (36 + 1), is_owner() on a user and an owner, an owner's fetched by the
    # other worker (7 + 1), and an RRef a scripted callee returned.
    assert "SCRIPT RREF 37.0 False True 8.0 36.0" in text, text
    assert "SCRIPT MODULE True 6.0" in text, text
    # The program's own registered backend wraps TENSORPIPE, on each worker.
    assert "BACKEND INIT worker0" in text and "BACKEND INIT worker1" in text, text
    assert "FOREIGN AGENT REFUSED True" in text, text
    # A list kept as TorchScript's value, mutated by scripted code; RRefs as
    # a scripted module's attribute (36 + 4), and a RemoteModule scripted.
    assert "SCRIPT LIST [1, 2, 3, 4]" in text, text
    assert "SCRIPT RREF ATTRIBUTE 40.0 True" in text, text
    assert "SCRIPT REMOTE MODULE 8.0" in text, text
    assert "PROGRAM OK" in text, text


def test_drop_in_mode_refuses_what_it_cannot_run():
    out = subprocess.run([harness.PYTHON, "-m", "baton.torch_rpc"], env=harness.env_for(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage: python3 -m baton.torch_rpc" in out.stderr, out
    out = subprocess.run([harness.PYTHON, "-m", "baton.torch_rpc", "/nonexistent/job.py"],
                         env=harness.env_for(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "/nonexistent/job.py: no such file" in out.stderr, out
