"""A local stand-in for gymnasium's CartPole-v1 (no network here).

Only what the RL examples use: make("CartPole-v1"), reset(seed=...) ->
(observation, info), step(action) -> (observation, reward, terminated,
truncated, info), and spec.reward_threshold / spec.max_episode_steps. The
environment is baton's CartPole-v1 (rl/cartpole.h, gym's exact dynamics,
bound as baton._C.CartPole); observations are float32 numpy arrays.
"""
import os
import types

import numpy as np

from baton import _C

__all__ = ["make"]


class _CartPole:
    def __init__(self):
        self.spec = types.SimpleNamespace(id="CartPole-v1", reward_threshold=475.0,
                                          max_episode_steps=_C.CartPole.max_steps)
        self._env = _C.CartPole(int.from_bytes(os.urandom(8), "little"))

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._env = _C.CartPole(int(seed))
        return np.array(self._env.reset(), dtype=np.float32), {}

    def step(self, action):
        obs, reward, terminated, truncated = self._env.step(int(action))
        return np.array(obs, dtype=np.float32), reward, terminated, truncated, {}

    def close(self):
        pass


def make(env_id, **kwargs):
    if env_id != "CartPole-v1":
        raise ValueError(f"this gymnasium stand-in has only CartPole-v1, not {env_id}")
    return _CartPole()
