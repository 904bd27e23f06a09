"""The group-call scenario (baton/rpc/group.py), run by test_rpc.py in real
worker processes through harness.py, as workers.py's scenarios are."""
import queue
import sys
import threading
import time

import torch

import baton.rpc as rpc
from baton.rpc.group import Group, GroupError, MemberFailure, Supervisor
from workers import _role_name, init, name


def scaled(x, k):
    return x * (rpc.get_worker_info().id * k)


def fail_on(rank):
    me = rpc.get_worker_info().id
    if me == rank:
        raise ValueError("refused on purpose")
    return me


_policy = {}


def load_policy(version):
    _policy["version"] = version
    return "not sent back"


def policy_version():
    return _policy.get("version")


_released = threading.Event()


def block_on(rank):
    me = rpc.get_worker_info().id
    if me == rank:
        assert _released.wait(60), "never released"
    return me


def release():
    _released.set()


def rank_tensor(n):
    return torch.full((n,), float(rpc.get_worker_info().id))


def text_on(rank):
    me = rpc.get_worker_info().id
    return "not a tensor" if me == rank else torch.full((2,), float(me))


def scenario_group(rank, world_size):
    """A group call from rank 0 to every worker (itself included) through a
    tree of fanout 2: values in member order, a broadcast, one member's
    error or silence costing its own entry only (GC1, GC4), and the
    arguments a group refuses."""
    init(rank, world_size)
    if rank == 0:
        everyone = Group.with_prefix("worker", fanout=2)
        assert [w.name for w in everyone.members] == [name(r) for r in range(world_size)]
        values = everyone.rpc_sync(scaled, args=(torch.ones(3), 2))
        assert [v.tolist() for v in values] == [[2.0 * r] * 3 for r in range(world_size)], values

        observers = everyone[1:]
        assert len(observers) == world_size - 1
        assert observers.broadcast(load_policy, args=(7,)) is None
        versions = [rpc.rpc_sync(name(r), policy_version) for r in range(1, world_size)]
        assert versions == [7] * (world_size - 1), versions
        futures = observers.broadcast_async(load_policy, args=(8,))
        assert [f.wait() for f in futures] == [None] * (world_size - 1)

        try:
            observers.rpc_sync(fail_on, args=(2,))
            raise AssertionError("a member's error was lost")
        except GroupError as e:
            assert list(e.errors) == [name(2)], e.errors
            assert "refused on purpose" in str(e.errors[name(2)]), e.errors
            assert e.results == [1, None] + list(range(3, world_size)), e.results
            print("FAILED " + ",".join(e.errors))

        # Worker 1 forwards for worker 2, then blocks: its own entry times
        # out, worker 2's value still arrives.
        try:
            observers.rpc_sync(block_on, args=(1,), timeout=3)
            raise AssertionError("a member that never answered was not reported")
        except GroupError as e:
            assert list(e.errors) == [name(1)], e.errors
            assert isinstance(e.errors[name(1)], rpc.RpcTimeoutError), repr(e.errors[name(1)])
            assert isinstance(e.errors[name(1)], RuntimeError)
            assert e.results[1:] == list(range(2, world_size)), e.results
            print("TIMED_OUT " + ",".join(e.errors))
        rpc.rpc_sync(name(1), release)

        for bad, error in ((lambda: Group([name(1), 1]), ValueError),
                           (lambda: Group([]), ValueError),
                           (lambda: Group([name(1)], fanout=0), ValueError),
                           (lambda: Group(["nobody"]), RuntimeError),
                           (lambda: Group.with_prefix("observer"), ValueError)):
            try:
                bad()
                raise AssertionError("a bad group was made")
            except error:
                pass
        # A reduce: every member's tensor summed on the way up; a member
        # whose value is not a tensor is left out, named.
        total = everyone.reduce(rank_tensor, args=(4,))
        assert total.tolist() == [float(sum(range(world_size)))] * 4, total
        mean = observers.reduce(rank_tensor, args=(2,), op="mean")
        assert mean.tolist() == [sum(range(1, world_size)) / (world_size - 1)] * 2, mean
        try:
            observers.reduce(text_on, args=(2,))
            raise AssertionError("a member's value that is not a tensor was summed")
        except GroupError as e:
            assert list(e.errors) == [name(2)], e.errors
            assert "returned a str, not a tensor" in str(e.errors[name(2)]), e.errors
            assert e.results.tolist() == [float(sum(range(1, world_size)) - 2)] * 2, e.results
            print("LEFT_OUT " + ",".join(e.errors))

        owned = rpc.RRef(torch.ones(1))
        try:
            observers.rpc_async(scaled, args=(owned, 1))
            raise AssertionError("an RRef was sent to a group")
        except ValueError as e:
            assert "cannot send RRefs" in str(e), e
    rpc.shutdown()
    print("SCENARIO OK")


def hang():
    threading.Event().wait()


def whoami_incarnation():
    return rpc.get_worker_info().name, rpc.api._current().incarnation()


def scenario_supervised():
    """Under baton-run (roles boss:1, member:3, member=worker restarts):
    boss0 supervises the members; a call to member0 hangs, the handler has
    baton-run restart member0, its successor answers through the group;
    member1 is dropped, the group and everyone's graceful shutdown go on
    without it (group/supervisor.h SV2, SV4, SV5)."""
    rpc.init_rpc(_role_name())
    if rpc.get_worker_info().name != "boss0":
        rpc.shutdown()
        print("SCENARIO OK")
        return
    events = queue.Queue()

    def on_failure(f: MemberFailure) -> None:
        events.put(f)
        # The restart is for member0, whose call hangs; under load a member
        # slower than hung_after is a hung event too, left alone. Given the
        # failure, restart() asks for the incarnation it names, once.
        if f.kind == "hung" and f.member.name == "member0":
            sup.restart(f, reason="its call hung")

    sup = Supervisor(Group.with_prefix("member"), on_failure, hung_after=1.0)
    first = sup.group.rpc_sync(whoami_incarnation)
    assert first == [("member0", 1), ("member1", 1), ("member2", 1)], first
    hanging = rpc.rpc_async("member0", hang, timeout=60)
    until = time.monotonic() + 30
    while True:
        f = events.get(timeout=max(0.0, until - time.monotonic()))
        if f.kind == "hung" and f.member.name == "member0":
            break
        print("OTHER_EVENT", f.kind, f.member.name, f.function)
    assert f.incarnation == 1, f
    assert isinstance(f.error, RuntimeError) and "member0" in str(f.error), f
    print("HUNG", f.member.name, f.function)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            now = sup.group.rpc_sync(whoami_incarnation)
        except GroupError:
            continue  # member0 between its incarnations
        if now[0] != ("member0", 1):
            break
    assert now == [("member0", 2), ("member1", 1), ("member2", 1)], now
    print("RESTARTED", now[0][0], now[0][1])
    try:
        hanging.wait()
        raise AssertionError("the hung call returned")
    except RuntimeError as e:
        assert "member0" in str(e), e
    sup.drop("member1", reason="not needed")
    assert [w.name for w in sup.group.members] == ["member0", "member2"]
    assert sup.group.rpc_sync(whoami_incarnation) == [("member0", 2), ("member2", 1)]
    try:
        sup.restart("member1")
        raise AssertionError("a dropped member was restarted")
    except RuntimeError as e:
        assert "not a member" in str(e), e
    sup.stop()
    rpc.shutdown()
    print("DROPPED member1")
    print("SCENARIO OK")


if __name__ == "__main__":
    import os
    if sys.argv[1] == "supervised":  # rank and world size from baton-run
        scenario_supervised()
    else:
        globals()["scenario_" + sys.argv[1]](int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
