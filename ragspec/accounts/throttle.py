"""Slowing down password guessing: a few failed sign-ins per name, then a pause.

Contract: `SignInThrottle.wait(name)` is 0 while `name` has had fewer than `attempts` failed
sign-ins in the last `window` seconds, else the seconds until the oldest of them leaves the
window; during that time the caller refuses without checking the password. `failed(name)`
counts a failure; `succeeded(name)` clears the count. Per server process, in memory: a
restart forgets, which costs a guesser a restart of someone else's server. Names are counted
as typed, so guessing many names is bounded by argon2's cost per attempt instead.
"""

from __future__ import annotations

import threading
import time
from collections import deque


class SignInThrottle:
    def __init__(self, attempts: int = 5, window: float = 300.0, clock=time.monotonic) -> None:
        if attempts < 1 or window <= 0:
            raise ValueError("attempts must be >= 1 and window > 0 seconds")
        self.attempts, self.window, self.clock = attempts, window, clock
        self._failures: dict[str, deque] = {}
        self._lock = threading.Lock()

    def _recent(self, name: str) -> deque:
        times = self._failures.setdefault(name, deque())
        while times and times[0] <= self.clock() - self.window:
            times.popleft()
        return times

    def wait(self, name: str) -> float:
        with self._lock:
            times = self._recent(name)
            if len(times) < self.attempts:
                return 0.0
            return max(0.0, times[0] + self.window - self.clock())

    def failed(self, name: str) -> None:
        with self._lock:
            self._recent(name).append(self.clock())

    def succeeded(self, name: str) -> None:
        with self._lock:
            self._failures.pop(name, None)


THROTTLE = SignInThrottle()
