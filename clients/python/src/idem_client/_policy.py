"""The retry policy: attempts, exponential backoff with full jitter, Retry-After, deadline.

Mirrors ``idem_client::RetryPolicy`` (Rust): the wait before retry ``n`` (from zero) is drawn
uniformly between zero and ``min(max_backoff, initial_backoff * 2**n)``, raised to a server's
``Retry-After`` (capped at ``max_retry_after``); no wait is started that would pass the
overall deadline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class RetryPolicy:
    """How one operation is retried. Durations are seconds (floats)."""

    #: Most requests sent for one operation (status queries do not count); at least 1.
    max_attempts: int = 5
    #: The cap of the first wait; it doubles with every retry.
    initial_backoff: float = 0.1
    #: The largest cap a wait is drawn under.
    max_backoff: float = 5.0
    #: The longest ``Retry-After`` honoured.
    max_retry_after: float = 30.0
    #: The longest one attempt (or one status query) may take.
    attempt_timeout: float = 10.0
    #: The whole operation: every attempt, wait and status query.
    deadline: float = 30.0
    #: ``True``: full jitter (uniform in [0, cap]); ``False``: exactly the cap (for tests).
    jitter: bool = True
    _rng: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            object.__setattr__(self, "max_attempts", 1)
        for name in ("initial_backoff", "max_backoff", "max_retry_after",
                     "attempt_timeout", "deadline"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetryPolicy.{name} must not be negative")

    def backoff_cap(self, n: int) -> float:
        """The cap the wait before retry ``n`` (from zero) is drawn under."""
        return float(min(self.max_backoff, self.initial_backoff * (2.0 ** min(n, 62))))

    def wait(self, n: int, retry_after: Optional[float] = None) -> float:
        """The wait before retry ``n``, raised to ``retry_after`` (capped) when given."""
        cap = self.backoff_cap(n)
        drawn = self._rng.uniform(0.0, cap) if self.jitter else cap
        if retry_after is not None:
            drawn = max(drawn, min(retry_after, self.max_retry_after))
        return drawn
