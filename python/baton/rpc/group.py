"""Group calls: one call to many workers, sent through a tree (group/group.h).

    import baton.rpc as rpc
    from baton.rpc.group import Group

    observers = Group.with_prefix("observer")      # observer0, observer1, ...
    rewards = observers.rpc_sync(run_episode, args=(3,))   # one value per member
    observers.broadcast(load_policy, args=(policy.state_dict(),))
    mean_grad = trainers.reduce(local_gradient, args=(step,), op="mean")   # one tensor

A loop of rpc_async sends one message per worker and handles every reply
itself. A group call sends at most `fanout` requests; each member runs the
function, forwards the call to at most `fanout` others, and answers with
its own outcome and theirs (guarantees GC1-GC5 in group/group.h):

* every member has an outcome by the call's deadline: one slow or dead
  member costs its own entry, never the call;
* a member that cannot forward leaves an error for each member it was to
  reach, naming itself and the cause;
* results are in member order.

A reduce (``reduce``) runs a function that returns a tensor on every member
and sums the tensors on the way up the tree: each member adds its own to
its part's sums, so one tensor travels on each edge of the tree, and the
caller receives one.

A Supervisor hears of its group's members' failures as they happen: a
member's death (as soon as the agent knows it, without a call to it), and
a call to a member that hangs (hung_after seconds without a reply; in a
call through ``supervisor.group``, however deep in the tree the member is,
while the call still waits; or an entry that timed out). Its handler
may have baton-run restart the member (``restart``) or drop it from the
group and the job (``drop``); ``supervisor.group`` then follows::

    def on_failure(f: MemberFailure) -> None:
        if f.kind == "hung":
            sup.restart(f, reason=str(f.error))

    sup = Supervisor(Group.with_prefix("observer"), on_failure, hung_after=30.0)
    sup.group.rpc_sync(run_episode, args=(3,))   # the members of the moment

The function runs as an RPC from the caller would. Arguments are pickled
once for every member: they may hold CPU tensors and any picklable value,
but not RRefs (ValueError). A group call carries no distributed autograd
context.
"""
from __future__ import annotations

import weakref

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Union

import torch

from baton import _C, _errors
from baton.rpc import api as _api
from baton.rpc.constants import UNSET_RPC_TIMEOUT

__all__ = ["Group", "GroupError", "MemberFailure", "Supervisor"]

_MAX_FANOUT = 64


class GroupError(RuntimeError):
    """Some members of a group call failed. ``results`` holds every member's
    value in member order (None where it failed), or for a reduce the sum
    (or mean) of the members that did not fail (None if none); ``errors``
    maps each failed member's name to its exception, which names it."""

    def __init__(self, results: Union[List[Any], torch.Tensor, str, None] = None,
                 errors: Optional[Dict[str, BaseException]] = None, reduce: bool = False):
        # Also from a message alone, so that one raised in a remote function
        # can be rebuilt on its caller.
        if isinstance(results, str):
            super().__init__(results)
            self.results, self.errors = [], {}
            return
        self.results = results if results is not None or reduce else []
        self.errors = errors or {}
        summary = "; ".join(f"{name}: {e}" for name, e in self.errors.items())
        if reduce:  # results: the others' sum, None if nobody contributed
            super().__init__(f"{len(self.errors)} members left out of the reduce: {summary}")
        else:
            super().__init__(f"{len(self.errors)} of {len(self.results)} members failed: {summary}")


class Group:
    """A fixed list of distinct workers of the job (names, ranks or
    WorkerInfos), called at once through a tree of `fanout` (1-64)."""

    def __init__(self, members: Sequence[Union[str, int, "_api.WorkerInfo"]], fanout: int = 8):
        if isinstance(fanout, bool) or not isinstance(fanout, int):
            raise TypeError(f"a group's fanout is an int, not {fanout!r}")
        if not 1 <= fanout <= _MAX_FANOUT:
            raise ValueError(f"a group's fanout must be in [1, {_MAX_FANOUT}], got {fanout}")
        agent = _api._current()
        infos = []
        seen = set()
        for m in members:
            try:
                name, wid = agent.worker(_api._to(m))
            except _C.StatusError as e:
                raise _errors.translate(e) from None
            if wid in seen:
                raise ValueError(f"worker '{name}' is listed twice in a group")
            seen.add(wid)
            infos.append(_api.WorkerInfo(name, wid))
        if not infos:
            raise ValueError("a group needs at least one member")
        self._members = infos
        self._fanout = fanout
        self._supervisor = None  # the _C.Supervisor watching its calls' entries

    @classmethod
    def with_prefix(cls, prefix: str, fanout: int = 8) -> "Group":
        """Every worker of the job whose name starts with `prefix` (a role's
        workers), in rank order."""
        members = [w for w in _api.get_worker_infos() if w.name.startswith(prefix)]
        if not members:
            raise ValueError(f"no worker's name starts with '{prefix}'")
        return cls(members, fanout)

    @property
    def members(self) -> List["_api.WorkerInfo"]:
        return list(self._members)

    @property
    def fanout(self) -> int:
        return self._fanout

    def __len__(self) -> int:
        return len(self._members)

    def __getitem__(self, index: slice) -> "Group":
        """A slice of the members as a group of its own (trainers[0:16])."""
        if not isinstance(index, slice):
            raise TypeError("a group is sliced (group[a:b]); its members are group.members")
        part = Group(self._members[index], self._fanout)
        part._supervisor = self._supervisor
        return part

    def __repr__(self) -> str:
        return f"Group({[w.name for w in self._members]}, fanout={self._fanout})"

    def _send(self, func: Callable, args, kwargs, timeout, discard: bool) -> List[torch.futures.Future]:
        data, tensors, rrefs, name = _pack(func, args, kwargs, "call",
                                           "; call C++ functions one by one")
        agent = _api._current()
        try:
            cfutures = agent.group_call([w.id for w in self._members], data, tensors, rrefs,
                                        _api._timeout(timeout), self._fanout, discard, name,
                                        self._supervisor)
        except _C.StatusError as e:
            raise _errors.translate(e, None, name) from None
        return [_api._torch_future(f, w.name, name) for f, w in zip(cfutures, self._members)]

    def rpc_async(self, func: Callable, args: Optional[tuple] = None,
                  kwargs: Optional[dict] = None,
                  timeout: float = UNSET_RPC_TIMEOUT) -> List[torch.futures.Future]:
        """Runs func(*args, **kwargs) on every member; one future per member,
        in member order, each completing as its part of the tree answers."""
        return self._send(func, args, kwargs, timeout, discard=False)

    def rpc_sync(self, func: Callable, args: Optional[tuple] = None,
                 kwargs: Optional[dict] = None, timeout: float = UNSET_RPC_TIMEOUT) -> List[Any]:
        """Every member's value, in member order; GroupError if any failed."""
        return _gather(self._members, self.rpc_async(func, args, kwargs, timeout))

    def broadcast_async(self, func: Callable, args: Optional[tuple] = None,
                        kwargs: Optional[dict] = None,
                        timeout: float = UNSET_RPC_TIMEOUT) -> List[torch.futures.Future]:
        """As rpc_async, for a function whose results are not wanted: only
        each member's outcome travels back (its future's value is None)."""
        return self._send(func, args, kwargs, timeout, discard=True)

    def broadcast(self, func: Callable, args: Optional[tuple] = None,
                  kwargs: Optional[dict] = None, timeout: float = UNSET_RPC_TIMEOUT) -> None:
        """Runs func on every member; GroupError if any failed."""
        _gather(self._members, self.broadcast_async(func, args, kwargs, timeout))


    def reduce_async(self, func: Callable, args: Optional[tuple] = None,
                     kwargs: Optional[dict] = None, op: str = "sum",
                     timeout: float = UNSET_RPC_TIMEOUT) -> torch.futures.Future:
        """Runs func on every member, each returning a tensor of one shape and
        dtype, and sums them through the tree (op "mean": divided by the
        members that contributed). The future's value is the tensor; it fails
        with GroupError if any member failed or answered late, whose
        ``results`` is then the sum (or mean) of the others and ``errors``
        names each member left out."""
        if op not in ("sum", "mean"):
            raise ValueError(f'a group reduce\'s op is "sum" or "mean", not {op!r}')
        data, tensors, _, name = _pack(func, args, kwargs, "reduce")
        agent = _api._current()
        try:
            cfuture = agent.group_reduce([w.id for w in self._members], data, tensors,
                                         _api._timeout(timeout), self._fanout, op == "mean", name,
                                         self._supervisor)
        except _C.StatusError as e:
            raise _errors.translate(e, None, name) from None
        reduced = _api._torch_future(cfuture, None, name)
        out: torch.futures.Future = torch.futures.Future()

        def outcome(f: torch.futures.Future) -> None:
            try:
                value, _, failures = f.value()
            except BaseException as e:  # noqa: BLE001  (the call's own error fails the future)
                _C.fail_torch_future(out, e)
                return
            if failures:
                _C.fail_torch_future(out, GroupError(
                    value, {worker: _errors.from_status(code, message, worker, name)
                            for worker, code, message in failures}, reduce=True))
            else:
                out.set_result(value)

        reduced.add_done_callback(outcome)
        return out

    def reduce(self, func: Callable, args: Optional[tuple] = None,
               kwargs: Optional[dict] = None, op: str = "sum",
               timeout: float = UNSET_RPC_TIMEOUT) -> torch.Tensor:
        """The sum (or mean) of every member's tensor; GroupError if any
        member failed (see reduce_async)."""
        return self.reduce_async(func, args, kwargs, op, timeout).wait()


class MemberFailure(NamedTuple):
    """A member's failure, as its Supervisor hears of it."""
    #: "died" (this incarnation of the member, and every earlier one, is
    #: dead) or "hung" (a call to it has waited too long).
    kind: str
    member: "_api.WorkerInfo"
    #: The member's incarnation: 1 at its first start, one more per restart.
    incarnation: int
    #: What happened, naming the member: WorkerUnavailableError for a death,
    #: a timeout error for a hang.
    error: BaseException
    #: "hung": the function of the call that hangs; "" otherwise.
    function: str


class Supervisor:
    """Watches a group's members and calls ``handler(MemberFailure)`` for each
    failure, on a runtime thread, one at a time, never after ``stop()``:

    * a member's death, as soon as this worker's agent knows it (once per
      dead incarnation);
    * a call from this worker to a member that has waited ``hung_after``
      seconds for its reply (once per call; None: calls are not watched);
      in a call through ``group``, a member that keeps it waiting for
      ``hung_after``, at any depth of the tree (its own function still
      runs, or it never answered its forwarder and sent no report of its
      own); and an entry of a call through ``group`` that timed out.

    The handler may call ``restart``, ``drop`` and ``stop``. Keep the
    supervisor referenced while it should watch: it stops when collected."""

    def __init__(self, group: Group, handler: Callable[[MemberFailure], None],
                 hung_after: Optional[float] = None):
        if not callable(handler):
            raise TypeError(f"a supervisor's handler is a callable, not {handler!r}")
        if hung_after is not None and not hung_after > 0:
            raise ValueError(f"hung_after is seconds > 0 or None, not {hung_after!r}")
        self._fanout = group.fanout
        self._handler = handler
        # The runtime holds only a weak reference to this object: a handler
        # that refers to the supervisor makes no cycle the collector cannot
        # see (it would never stop).
        me = weakref.ref(self)

        def on_failure(kind, name, wid, incarnation, code, message, function):
            sup = me()
            if sup is None:
                return
            error = _errors.from_status(code, message, name, function or None)
            sup._handler(MemberFailure(kind, _api.WorkerInfo(name, wid), incarnation, error,
                                       function))

        try:
            self._c = _C.Supervisor.watch(_api._current(), [w.id for w in group.members],
                                          group.fanout, None, hung_after, on_failure)
        except _C.StatusError as e:
            raise _errors.translate(e) from None

    @property
    def group(self) -> Group:
        """The watched group less the members dropped so far; its calls'
        entries that time out are heard of as hangs."""
        try:
            ids = self._c.members()
        except _C.StatusError as e:
            raise _errors.translate(e) from None
        g = Group(ids, self._fanout)
        g._supervisor = self._c
        return g

    def restart(self, member: Union[MemberFailure, str, int, "_api.WorkerInfo"],
                reason: str = "") -> None:
        """Asks baton-run to stop `member` so that its restart policy starts
        it again (``--restart_policy ROLE=worker``: it alone, and it rejoins);
        it stays in ``group``. Given the MemberFailure a handler received, it
        restarts the incarnation the failure names: nothing is asked if the
        member was replaced since, if it is known dead (baton-run restarts
        it by itself), or if its restart was asked for already. RuntimeError
        outside baton-run, and for rank 0."""
        incarnation = 0
        if isinstance(member, MemberFailure):
            member, incarnation = member.member, member.incarnation
        try:
            self._c.restart(_api._to(member), reason, incarnation)
        except _C.StatusError as e:
            raise _errors.translate(e) from None

    def drop(self, member: Union[str, int, "_api.WorkerInfo"], reason: str = "") -> None:
        """Takes `member` out of ``group`` and out of the job: no graceful
        shutdown waits for it, and under baton-run it is stopped for good
        (its end is no failure of the job). Rank 0 cannot be dropped."""
        try:
            self._c.drop(_api._to(member), reason)
        except _C.StatusError as e:
            raise _errors.translate(e) from None

    def stop(self) -> None:
        """No handler runs once this returns (it waits for one that runs)."""
        self._c.stop()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()



def _pack(func: Callable, args, kwargs, what: str, cpp_hint: str = ""):
    """The call's pickle, tensors, RRefs (none: refused) and name, once for
    every member of a group `what` (call, reduce)."""
    if isinstance(func, _api.CppFunction):
        raise TypeError(f"a group {what} runs a Python function{cpp_hint}")
    data, tensors, rrefs = _api._pack(func, args, kwargs)
    if rrefs:
        raise ValueError(f"a group {what} cannot send RRefs: its arguments are pickled once for "
                         "every member, and an RRef is forked for one destination")
    return data, tensors, rrefs, _api._name_of(func)


def _gather(members, futures) -> List[Any]:
    results: List[Any] = []
    errors: Dict[str, BaseException] = {}
    for w, f in zip(members, futures):
        try:
            results.append(f.wait())
        except Exception as e:  # noqa: BLE001  (each member's error is kept, named)
            results.append(None)
            errors[w.name] = e
    if errors:
        raise GroupError(results, errors)
    return results
