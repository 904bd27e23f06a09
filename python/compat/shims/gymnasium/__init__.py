"""A small local stand-in for gymnasium's CartPole-v1 (no network here).

Only what the RL examples use: make("CartPole-v1"), reset(seed=...) ->
(observation, info), step(action) -> (observation, reward, terminated,
truncated, info), and spec.reward_threshold / spec.max_episode_steps. The
dynamics are the classic cart-pole equations (Barto, Sutton and Anderson,
1983) integrated with Euler steps of 0.02 s; an episode ends when the pole
leans past 12 degrees or the cart leaves +-2.4, and is truncated at 500 steps.
"""
import math
import types

import numpy as np

__all__ = ["make"]


class _CartPole:
    gravity = 9.8
    cart_mass = 1.0
    pole_mass = 0.1
    half_length = 0.5
    force = 10.0
    dt = 0.02
    angle_limit = 12 * 2 * math.pi / 360
    x_limit = 2.4

    def __init__(self, max_episode_steps=500, reward_threshold=475.0):
        self.spec = types.SimpleNamespace(id="CartPole-v1", max_episode_steps=max_episode_steps,
                                          reward_threshold=reward_threshold)
        self._rng = np.random.default_rng()
        self._state = None
        self._steps = 0

    def reset(self, seed=None, options=None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self._state = self._rng.uniform(-0.05, 0.05, size=4)
        self._steps = 0
        return np.array(self._state, dtype=np.float32), {}

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        x, x_dot, theta, theta_dot = self._state
        force = self.force if int(action) == 1 else -self.force
        total_mass = self.cart_mass + self.pole_mass
        pole_moment = self.pole_mass * self.half_length
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + pole_moment * theta_dot ** 2 * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos ** 2 / total_mass))
        x_acc = temp - pole_moment * theta_acc * cos / total_mass
        x += self.dt * x_dot
        x_dot += self.dt * x_acc
        theta += self.dt * theta_dot
        theta_dot += self.dt * theta_acc
        self._state = np.array([x, x_dot, theta, theta_dot])
        self._steps += 1
        terminated = bool(abs(x) > self.x_limit or abs(theta) > self.angle_limit)
        truncated = self._steps >= self.spec.max_episode_steps
        return np.array(self._state, dtype=np.float32), 1.0, terminated, truncated, {}

    def close(self):
        pass


def make(env_id, **kwargs):
    if env_id != "CartPole-v1":
        raise ValueError(f"this gymnasium stand-in has only CartPole-v1, not {env_id}")
    return _CartPole(**kwargs)
