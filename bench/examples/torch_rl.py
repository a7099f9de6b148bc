#!/usr/bin/python3
"""PyTorch's counterpart of examples/rl, for bench/examples/run.py: PyTorch's agent-observer
REINFORCE on CartPole (pytorch/examples distributed/rpc/rl) with the weft app's policy, sizes and
call pattern. Rank 0 "agent" holds the policy (Linear 4->128, Dropout 0.6, ReLU, Linear 128->2,
softmax), Adam (lr 0.01) and an RRef to itself; it builds one Observer per other rank with
rpc.remote. Each episode the agent calls every observer's run_episode with rpc_async and waits for
all of them; an observer asks the agent for each action (rpc_sync of select_action: policy
forward, a Categorical sample, its log-probability kept), steps its CartPole and reports the
reward (rpc_sync of report_reward). The agent then computes each observer's discounted returns
(gamma 0.99), normalises them together and takes one Adam step on sum(-log_prob * G).

    /usr/bin/python3 bench/examples/torch_rl.py --episodes 150 --metrics rl.csv [--observers 1]

CartPole-v1 is implemented here with the weft app's (and Gym's) physics, so that nothing needs
Gym. Writes episode,reward,steps,seconds,ms_per_step per episode (seconds: from the calls to the
observers to the end of the update, as the weft app measures) to --metrics.
"""

import argparse
import math
import os
import random
import sys
import threading
import time

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributions import Categorical

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_common import init_rpc, launch, remote_method, remote_method_async, write_csv  # noqa: E402

GAMMA = 0.99
MAX_STEPS = 500
EPS = float(torch.finfo(torch.float32).eps)


class CartPole:
    """Gym's CartPole-v1: explicit Euler, tau 0.02, failure beyond +-12 degrees or +-2.4."""

    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.state = None
        self.steps = 0

    def reset(self):
        self.state = [self.rng.uniform(-0.05, 0.05) for _ in range(4)]
        self.steps = 0
        return self.state

    def step(self, action):
        x, x_dot, theta, theta_dot = self.state
        force = 10.0 if action == 1 else -10.0
        costheta, sintheta = math.cos(theta), math.sin(theta)
        total_mass, polemass_length, length = 1.1, 0.05, 0.5
        temp = (force + polemass_length * theta_dot * theta_dot * sintheta) / total_mass
        thetaacc = (9.8 * sintheta - costheta * temp) / (length * (4.0 / 3.0 - 0.1 * costheta * costheta / total_mass))
        xacc = temp - polemass_length * thetaacc * costheta / total_mass
        x, x_dot = x + 0.02 * x_dot, x_dot + 0.02 * xacc
        theta, theta_dot = theta + 0.02 * theta_dot, theta_dot + 0.02 * thetaacc
        self.state = [x, x_dot, theta, theta_dot]
        self.steps += 1
        done = x < -2.4 or x > 2.4 or theta < -12 * 2 * math.pi / 360 or theta > 12 * 2 * math.pi / 360
        return self.state, 1.0, done


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=1)


class Observer:
    def __init__(self, seed):
        self.id = rpc.get_worker_info().id
        self.env = CartPole(seed + self.id)

    def run_episode(self, agent_rref, n_steps):
        state = self.env.reset()
        for _ in range(n_steps):
            action = remote_method(Agent.select_action, agent_rref, self.id, state)
            state, reward, done = self.env.step(action)
            remote_method(Agent.report_reward, agent_rref, self.id, reward)
            if done:
                break
        return self.env.steps


class Agent:
    def __init__(self, world, seed):
        torch.manual_seed(seed)
        self.ob_rrefs = []
        self.agent_rref = rpc.RRef(self)
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.lock = threading.Lock()
        self.rewards, self.saved_log_probs = {}, {}
        for r in range(1, world):
            info = rpc.get_worker_info(f"observer{r}")
            self.ob_rrefs.append(rpc.remote(info, Observer, args=(seed,)))
            self.rewards[info.id] = []
            self.saved_log_probs[info.id] = []

    def select_action(self, ob_id, state):
        state = torch.tensor(state, dtype=torch.float32).unsqueeze(0)
        with self.lock:
            probs = self.policy(state)
            m = Categorical(probs)
            action = m.sample()
            self.saved_log_probs[ob_id].append(m.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        with self.lock:
            self.rewards[ob_id].append(reward)

    def run_episode(self, n_steps):
        futs = [remote_method_async(Observer.run_episode, ob, self.agent_rref, n_steps) for ob in self.ob_rrefs]
        return sum(f.wait() for f in futs)

    def finish_episode(self):
        returns, log_probs, lowest = [], [], None
        for ob_id in self.rewards:
            rewards = self.rewards[ob_id]
            lowest = sum(rewards) if lowest is None else min(lowest, sum(rewards))
            g, rs = 0.0, []
            for r in reversed(rewards):
                g = r + GAMMA * g
                rs.insert(0, g)
            returns.extend(rs)
            log_probs.extend(self.saved_log_probs[ob_id])
            self.rewards[ob_id], self.saved_log_probs[ob_id] = [], []
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + EPS)
        loss = torch.cat([-lp * g for lp, g in zip(log_probs, returns)]).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return lowest


def worker(rank, world, a, port):
    init_rpc("agent" if rank == 0 else f"observer{rank}", rank, world, port)
    if rank == 0:
        agent = Agent(world, a.seed)
        rows, running = [], 0.0
        for ep in range(1, a.episodes + 1):
            t0 = time.perf_counter()
            steps = agent.run_episode(MAX_STEPS)
            reward = agent.finish_episode()
            seconds = time.perf_counter() - t0
            running = 0.05 * reward + 0.95 * running
            rows.append((ep, reward, running, steps, seconds, 1e3 * seconds / steps))
        write_csv(a.metrics, ("episode", "reward", "running_reward", "steps", "seconds", "ms_per_step"), rows)
    rpc.shutdown()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--episodes", type=int, default=150)
    p.add_argument("--observers", type=int, default=1)
    p.add_argument("--seed", type=int, default=543)
    p.add_argument("--metrics", default="torch_rl_metrics.csv")
    a = p.parse_args()
    launch(worker, a.observers + 1, a)


if __name__ == "__main__":
    main()
