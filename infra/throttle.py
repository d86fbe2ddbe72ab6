"""Failed-credential throttling: at most ``limit`` failures per client address in a sliding window.

Used by every check of a secret a client can guess: the admin bearer token (:func:`infra.http.require_admin_token`
with a throttle) and the web view's sign-in form. Past the limit a client is answered 429 with
``Retry-After`` until its oldest failure leaves the window, so guessing a token costs ``window_s`` per
``limit`` tries. At most ``max_clients`` addresses are remembered (the least recently failed forgotten
first) and at most ``limit`` failure times per address, so the throttle holds a bounded amount of memory
whatever a client sends.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque


class FailureThrottle:
    def __init__(self, limit: int = 10, window_s: float = 60.0, max_clients: int = 10_000) -> None:
        self.limit = limit
        self.window_s = window_s
        self.max_clients = max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def retry_after(self, client: str, now: float | None = None) -> float | None:
        """Seconds until ``client`` may try again, or None when it may now."""
        now = time.monotonic() if now is None else now
        failures = self._failures.get(client)
        while failures and now - failures[0] > self.window_s:
            failures.popleft()
        if failures is None or len(failures) < self.limit:
            return None
        return self.window_s - (now - failures[0])

    def failed(self, client: str, now: float | None = None) -> None:
        """Count one failure of ``client``."""
        failures = self._failures.setdefault(client, deque(maxlen=self.limit))
        failures.append(time.monotonic() if now is None else now)
        self._failures.move_to_end(client)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
