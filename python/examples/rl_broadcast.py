"""One learner, many actors: the learner broadcasts each new policy to every
observer through a group, and supervises them (baton.rpc.group).

    bash tools/python.sh
    bazel-bin/launcher/baton-run --standalone --role learner:1 --role observer:8 \\
        --restart_policy observer=worker --max_restarts 3 \\
        .venv/bin/python python/examples/rl_broadcast.py [--target 475]

Each observer owns a CartPole-v1 (baton's, bound as baton._C.CartPole) and
a copy of the policy. Every round the learner

* broadcasts the policy's weights to every observer through the group's
  tree (``Group.broadcast``): the weights leave the learner `fanout` times,
  not once per observer;
* asks every observer, again through the tree, for one episode played with
  that policy (its states, actions and rewards: ``Group.rpc_sync``);
* takes a REINFORCE step on those episodes, recomputing the log-probabilities
  of the observers' actions with its own copy of the policy.

A Supervisor watches the observers: a call to one that hangs for
--hung_after seconds is reported, and the handler has baton-run restart
that observer (``--restart_policy observer=worker``: it alone, and it
rejoins); one that dies is restarted by baton-run's policy anyway. A round
uses the episodes of the observers that answered (``GroupError.results``),
so training goes on while one is down. --hang_at R makes observer0 hang in
round R once, to show it. Prints RESULT OK once the running reward passes
--target within --max_rounds rounds, else RESULT FAIL and exits 1.
"""
import argparse
import os
import sys
import threading

import torch

import baton
import baton.rpc as rpc
from baton.rpc.group import Group, GroupError, MemberFailure, Supervisor


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = torch.nn.Linear(4, 128)
        self.affine2 = torch.nn.Linear(128, 2)

    def forward(self, x):
        return torch.softmax(self.affine2(torch.relu(self.affine1(x))), dim=-1)


# ---- The observers ----

_policy = Policy()
_version = {"value": 0}
_env = {}


def load_policy(state_dict, version):
    """Runs on every observer: the learner's newest weights."""
    _policy.load_state_dict(state_dict)
    _version["value"] = version


def play(version, hang_at):
    """One episode with the policy of `version`: (states, actions, rewards),
    or None when this observer missed that policy (it was restarting)."""
    if _version["value"] != version:
        return None
    me = rpc.get_worker_info().name
    if version == hang_at and me == "observer0" and os.environ.get("BATON_RESTART_COUNT") == "0":
        threading.Event().wait()  # a hang, until the supervisor has it restarted
    env = _env.setdefault("cartpole", baton._C.CartPole(1000 + rpc.get_worker_info().id))
    state, states, actions, rewards = env.reset(), [], [], []
    with torch.no_grad():
        while True:
            x = torch.tensor(state, dtype=torch.float32)
            action = int(torch.distributions.Categorical(_policy(x)).sample())
            states.append(x)
            actions.append(action)
            state, reward, terminated, truncated = env.step(action)
            rewards.append(reward)
            if terminated or truncated:
                return torch.stack(states), torch.tensor(actions), rewards


# ---- The learner ----

class Learner:
    def __init__(self, args):
        torch.manual_seed(543)
        self.args = args
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.version = 0
        self.running_reward = 10.0
        self.supervisor = Supervisor(Group.with_prefix("observer"), self.on_failure,
                                     hung_after=args.hung_after)

    def on_failure(self, f: MemberFailure) -> None:
        print(f"observer {f.member.name} (incarnation {f.incarnation}) {f.kind}: {f.error}",
              flush=True)
        if f.kind == "hung":
            self.supervisor.restart(f.member, reason=f"{f.function} hung")

    def round(self):
        observers = self.supervisor.group
        self.version += 1
        weights = {k: v.clone() for k, v in self.policy.state_dict().items()}
        try:
            observers.broadcast(load_policy, args=(weights, self.version))
        except GroupError as e:  # they are left out of this round's episodes
            print(f"round {self.version}: the policy reached {len(observers) - len(e.errors)} "
                  f"of {len(observers)} observers ({', '.join(sorted(e.errors))} failed)",
                  flush=True)
        try:
            episodes = observers.rpc_sync(play, args=(self.version, self.args.hang_at),
                                          timeout=self.args.episode_timeout)
            episodes = [ep for ep in episodes if ep is not None]
        except GroupError as e:  # the others' episodes still count
            episodes = [ep for ep in e.results if ep is not None]
            print(f"round {self.version}: {len(e.errors)} observers left out "
                  f"({', '.join(sorted(e.errors))})", flush=True)
        if not episodes:
            return self.running_reward
        loss = []
        for states, actions, rewards in episodes:
            returns, r = [], 0.0
            for reward in reversed(rewards):
                r = reward + self.args.gamma * r
                returns.insert(0, r)
            returns = torch.tensor(returns)
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
            log_probs = torch.distributions.Categorical(self.policy(states)).log_prob(actions)
            loss.append(-(log_probs * returns).sum())
        self.optimizer.zero_grad()
        torch.stack(loss).sum().backward()
        self.optimizer.step()
        for _, _, rewards in episodes:
            self.running_reward = 0.05 * len(rewards) + 0.95 * self.running_reward
        return self.running_reward


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max_rounds", type=int, default=1000)
    parser.add_argument("--gamma", type=float, default=0.99)
    parser.add_argument("--hung_after", type=float, default=5.0,
                        help="seconds before a call to an observer is reported hung")
    parser.add_argument("--episode_timeout", type=float, default=30.0)
    parser.add_argument("--hang_at", type=int, default=0,
                        help="observer0 hangs in this round (0: never)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rpc.init_rpc()  # learner0, observer0..N-1 under baton-run
    ok = True
    if rpc.get_worker_info().name == "learner0":
        learner = Learner(args)
        ok = False
        for round_ in range(1, args.max_rounds + 1):
            running = learner.round()
            if round_ % 10 == 0:
                print(f"round {round_}: running reward {running:.1f}", flush=True)
            if running > args.target:
                print(f"solved after {round_} rounds: running reward {running:.1f}", flush=True)
                ok = True
                break
        learner.supervisor.stop()
        print("RESULT OK" if ok else "RESULT FAIL: not solved", flush=True)
    rpc.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
