"""One agent, several observers: REINFORCE on CartPole-v1 over baton.rpc.

    bash tools/python.sh
    bazel-bin/launcher/baton-run --standalone --role agent:1 --role observer:4 \\
        .venv/bin/python python/examples/rl_cartpole.py [--target 475]

Each observer owns a CartPole-v1 (baton's, rl/cartpole.h, bound as
baton._C.CartPole) and plays episodes; at every step it asks the agent for
an action. The agent answers all observers of a step together: its
select_action is @async_execution, so a call parks without holding a thread
until the last observer's state arrives, then one batched policy forward
answers them all. After each round (one episode per observer) the agent
takes a REINFORCE step over every observer's episode. It prints RESULT OK
once the running reward passes --target (CartPole-v1's 475 by default)
within --max_rounds rounds, else RESULT FAIL and exits 1.
"""
import argparse
import sys
import threading

import torch

import baton
import baton.rpc as rpc


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = torch.nn.Linear(4, 128)
        self.dropout = torch.nn.Dropout(p=0.6)
        self.affine2 = torch.nn.Linear(128, 2)

    def forward(self, x):
        return torch.softmax(self.affine2(torch.relu(self.dropout(self.affine1(x)))), dim=1)


class Observer:
    def __init__(self, seed):
        self.env = baton._C.CartPole(seed)

    def run_episode(self, agent_rref, index):
        """Plays one episode; returns its rewards."""
        state, rewards = self.env.reset(), []
        while True:
            action = agent_rref.rpc_sync().select_action(index, state)
            state, reward, terminated, truncated = self.env.step(action)
            rewards.append(reward)
            if terminated or truncated:
                # Told before returning, so the agent never waits for this
                # observer's next state, and never counts it in a later round.
                agent_rref.rpc_sync().episode_done(index)
                return rewards


class Agent:
    def __init__(self, observers, gamma):
        torch.manual_seed(543)
        self.policy = Policy()
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=1e-2)
        self.gamma = gamma
        self.lock = threading.Lock()
        self.observer_rrefs = [rpc.remote(name, Observer, args=(i + 1,))
                               for i, name in enumerate(observers)]
        self.log_probs = [[] for _ in observers]
        self.running_reward = 0.0
        self._reset_batch()

    def _reset_batch(self):
        self.states = {}
        self.future = torch.futures.Future()

    @rpc.functions.async_execution
    def select_action(self, index, state):
        """Answered when every observer still playing sent its state."""
        with self.lock:
            self.states[index] = torch.tensor(state)
            future = self.future
            self._answer_if_complete_locked()
        return future.then(lambda f: f.value()[index])

    def episode_done(self, index):
        with self.lock:
            self.playing -= 1
            # The observers still playing may all be waiting already.
            self._answer_if_complete_locked()

    def _answer_if_complete_locked(self):
        if not self.states or len(self.states) != self.playing:
            return
        indices = sorted(self.states)
        probs = self.policy(torch.stack([self.states[i] for i in indices]))
        dist = torch.distributions.Categorical(probs)
        actions = dist.sample()
        log_probs = dist.log_prob(actions)
        for row, i in enumerate(indices):
            self.log_probs[i].append(log_probs[row])
        future = self.future
        self._reset_batch()
        future.set_result({i: int(actions[row]) for row, i in enumerate(indices)})

    def run_round(self, agent_rref):
        with self.lock:
            self.playing = len(self.observer_rrefs)
        futures = []
        for i, ob in enumerate(self.observer_rrefs):
            futures.append(ob.rpc_async().run_episode(agent_rref, i))
        episodes = [f.wait() for f in futures]
        loss = []
        for log_probs, rewards in zip(self.log_probs, episodes):
            returns, r = [], 0.0
            for reward in reversed(rewards):
                r = reward + self.gamma * r
                returns.insert(0, r)
            returns = torch.tensor(returns)
            returns = (returns - returns.mean()) / (returns.std() + 1e-8)
            loss.extend(-lp * ret for lp, ret in zip(log_probs, returns))
        self.optimizer.zero_grad()
        torch.stack(loss).sum().backward()
        self.optimizer.step()
        self.log_probs = [[] for _ in self.observer_rrefs]
        for rewards in episodes:
            self.running_reward = 0.05 * len(rewards) + 0.95 * self.running_reward
        return self.running_reward


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--max_rounds", type=int, default=2000)
    parser.add_argument("--gamma", type=float, default=0.99)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rpc.init_rpc()  # agent0, observer0..N-1 under baton-run
    ok = True
    if rpc.get_worker_info().name == "agent0":
        observers = [w.name for w in rpc.get_worker_infos() if w.name.startswith("observer")]
        agent = Agent(observers, args.gamma)
        agent_rref = rpc.RRef(agent)
        ok = False
        for round_ in range(1, args.max_rounds + 1):
            running = agent.run_round(agent_rref)
            if round_ % 10 == 0:
                print(f"round {round_}: running reward {running:.1f}", flush=True)
            if running > args.target:
                print(f"solved after {round_} rounds ({round_ * len(observers)} episodes): "
                      f"running reward {running:.1f}", flush=True)
                ok = True
                break
        print("RESULT OK" if ok else "RESULT FAIL: not solved", flush=True)
    rpc.shutdown()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
