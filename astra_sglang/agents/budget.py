"""Budgets (rounds, wall time, tokens, cost) and the usage meter every model call goes through."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import AstraError

# USD per 1M tokens (input, output): OpenAI list prices when this was written; pass --price to
# override or to price another model. Cost budgets need a price.
PRICES: Dict[str, Tuple[float, float]] = {
    "o4-mini": (1.10, 4.40),
    "o3": (2.00, 8.00),
    "o3-mini": (1.10, 4.40),
    "gpt-4.1": (2.00, 8.00),
    "gpt-4.1-mini": (0.40, 1.60),
    "gpt-4o": (2.50, 10.00),
    "gpt-4o-mini": (0.15, 0.60),
    "gpt-5": (1.25, 10.00),
    "gpt-5-mini": (0.25, 2.00),
}


def price_for(model: str, override: Optional[Tuple[float, float]] = None) -> Optional[Tuple[float, float]]:
    if override:
        return override
    if model in PRICES:
        return PRICES[model]
    base = model.split("/")[-1]
    for name in sorted(PRICES, key=len, reverse=True):  # dated snapshots: o4-mini-2025-04-16
        if base.startswith(name + "-") and base[len(name) + 1:][:1].isdigit():
            return PRICES[name]
    return None


@dataclass
class Usage:
    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: Optional[float] = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def add(self, other: "Usage") -> None:
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        if other.cost_usd is not None:
            self.cost_usd = (self.cost_usd or 0.0) + other.cost_usd

    def to_json(self) -> Dict[str, Any]:
        d = asdict(self)
        d["total_tokens"] = self.total_tokens
        if d["cost_usd"] is not None:
            d["cost_usd"] = round(d["cost_usd"], 6)
        return d

    @classmethod
    def from_json(cls, d: Optional[Dict[str, Any]]) -> "Usage":
        d = d or {}
        return cls(int(d.get("requests", 0)), int(d.get("input_tokens", 0)), int(d.get("output_tokens", 0)),
                   d.get("cost_usd"))


class BudgetExhausted(AstraError):
    exit_code = 3

    def __init__(self, what: str, used: str, limit: str) -> None:
        super().__init__(f"budget exhausted: {what} {used} of {limit}")
        self.what = what


@dataclass
class Budget:
    rounds: int
    max_wall_s: Optional[float] = None
    max_tokens: Optional[int] = None
    max_cost_usd: Optional[float] = None

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Meter:
    """Totals across the run (restored from the log on resume) and the usage of the agent run in
    progress. `check()` is called before every model request and between steps."""

    budget: Budget
    price: Optional[Tuple[float, float]]
    elapsed: Callable[[], float]
    total: Usage = field(default_factory=Usage)
    current: Usage = field(default_factory=Usage)

    def record(self, input_tokens: int, output_tokens: int, requests: int = 1) -> None:
        u = Usage(requests, int(input_tokens or 0), int(output_tokens or 0))
        if self.price:
            u.cost_usd = (u.input_tokens * self.price[0] + u.output_tokens * self.price[1]) / 1e6
        self.total.add(u)
        self.current.add(u)

    def take_current(self) -> Usage:
        u, self.current = self.current, Usage()
        return u

    def check(self) -> None:
        b = self.budget
        if b.max_wall_s is not None and self.elapsed() >= b.max_wall_s:
            raise BudgetExhausted("wall time", f"{self.elapsed() / 60:.1f} min", f"{b.max_wall_s / 60:.1f} min")
        if b.max_tokens is not None and self.total.total_tokens >= b.max_tokens:
            raise BudgetExhausted("tokens", str(self.total.total_tokens), str(b.max_tokens))
        if b.max_cost_usd is not None and (self.total.cost_usd or 0.0) >= b.max_cost_usd:
            raise BudgetExhausted("cost", f"${self.total.cost_usd or 0.0:.4f}", f"${b.max_cost_usd:.4f}")
